"""Parse and extract N text-layer PDFs with the rules extractor, on worker processes.

    .venv/bin/python -m bench.extraction_bench                      # 1,000 PDFs, 2 workers
    .venv/bin/python -m bench.extraction_bench --documents 200 --workers 1 --ocr-pages 4

The corpus generator's papers, every one rendered as a text-layer PDF (a
different seed from the sample corpus, so none is already stored), are
imported into a fresh database, then one extraction task (``rules``) runs
over all of them on ``--workers`` processes of ``shoal-extract worker``,
started and connected before the clock starts. The clock runs from creating
the task to the task closing: parsing (pdfplumber's layout-aware path),
extraction, evidence checks and shoal's bookkeeping, all of it.

It runs on a throwaway PostgreSQL cluster of its own (``--server url`` for
DATABASE_URL's), so that its WAL and server CPU are the bench's alone. Beside
the rate it prints the machine (cores, load average, the server's commit
rate: bench/machine.py), and per document: the workers' CPU, the database
server's CPU, WAL bytes and statements. OCR is measured apart: ``--ocr-pages`` pages
of scanned papers (no text layer) parsed in this process, pages per second.

Asserts nothing: docs/benchmarks.md gives the target (20 documents a second
with 2 workers on a 2-core machine) and the runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg import sql

from bench.machine import OwnServer, ServerMeter, describe
from shoal import Shoal
from shoal_extract.corpus import blocks, make_papers, render_pdf
from shoal_extract.hard_corpus import make_hard_papers, render_scan
from shoal_extract.parsing import DocumentFormat, ParseLimits, parse_document
from shoal_extract.templates import DEFAULT_TEMPLATE
from shoal_extract.workbench import Workbench
from shoal_extract.worker import ExtractionApp, WorkerSettings

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DATABASE = "shoal_bench_extraction"
SEED = 20261202
PAPERS_PER_SEED = 200
OWN_SERVER_SETTINGS = {
    "shared_preload_libraries": "pg_stat_statements"
}  # not the sample corpus's: its documents are new to the database


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fresh_database(server_url: str) -> str:
    """A new empty database; pg_stat_statements in it when the server loads the library."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        name = sql.Identifier(DATABASE)
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(name))
        row = conn.execute("SHOW shared_preload_libraries").fetchone()
    url = psycopg.conninfo.make_conninfo(server_url, dbname=DATABASE)
    if row is not None and "pg_stat_statements" in str(row[0]):
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return url


def write_pdfs(folder: Path, count: int) -> None:
    """``count`` text-layer PDFs, in runs of 200 papers per seed.

    The generator keeps titles unique within one call, and its title space
    runs out somewhere past a few hundred papers; papers of different runs
    differ in their other fields, so each file is a new document.
    """
    rng = random.Random(SEED + 1)
    for run, start in enumerate(range(0, count, PAPERS_PER_SEED)):
        for paper in make_papers(min(PAPERS_PER_SEED, count - start), SEED + run):
            name = f"run{run:03d}-{Path(paper.file).stem}.pdf"
            (folder / name).write_bytes(render_pdf(paper, blocks(paper, rng)))


def start_workers(url: str, count: int, concurrency: int) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "shoal_extract.cli",
                "--database-url",
                url,
                "worker",
                "--concurrency",
                str(concurrency),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(count)
    ]


def peak_rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def ocr_rate(pages: int) -> tuple[int, float]:
    """Pages of scanned papers OCRed per second in this process (Tesseract)."""
    done, spent = 0, 0.0
    for hard in make_hard_papers(per_layout=max(1, pages)):
        if hard.layout != "scan":
            continue
        content = render_scan(hard.parts)
        started = time.monotonic()
        parsed = parse_document(content, DocumentFormat.PDF, ParseLimits())
        spent += time.monotonic() - started
        done += len(parsed.page_starts) or 1
        if done >= pages:
            break
    return done, done / spent if spent else 0.0


async def run(args: argparse.Namespace) -> None:
    own = None if args.server == "url" else OwnServer(OWN_SERVER_SETTINGS, prefix="shoal-extract-")
    if own is not None:
        own.start()
    try:
        await measure(args, own.url if own is not None else args.database_url)
    finally:
        if own is not None:
            own.stop()
    if args.ocr_pages:
        pages, rate = await asyncio.to_thread(ocr_rate, args.ocr_pages)
        print(f"OCR: {pages} scanned pages at {rate:.2f} pages/s (one process, Tesseract)")


async def measure(args: argparse.Namespace, server_url: str) -> None:
    url = fresh_database(server_url)
    print(describe(url))
    print(
        f"{args.documents} text-layer PDFs, {args.workers} worker processes x concurrency "
        f"{args.concurrency}, server: {'own cluster' if args.server == 'own' else server_url}"
    )
    boss = await Shoal.connect(url, max_size=10)
    extraction = ExtractionApp(WorkerSettings())
    workers: list[subprocess.Popen[bytes]] = []
    try:
        store = await extraction.attach(boss)
        bench = Workbench(extraction.app.batches(boss), store)
        with tempfile.TemporaryDirectory() as tmp:
            started = time.monotonic()
            await asyncio.to_thread(write_pdfs, Path(tmp), args.documents)
            generated = time.monotonic() - started
            started = time.monotonic()
            imported = await bench.import_folder(Path(tmp))
            import_s = time.monotonic() - started
        print(f"generated in {generated:.1f} s, imported in {import_s:.1f} s")
        workers = start_workers(url, args.workers, args.concurrency)
        await asyncio.sleep(args.warmup)  # the workers import and connect before the clock
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            meter = ServerMeter(conn, DATABASE)
            await meter.open()
            before = await meter.sample()
            worker_cpu = sum(cpu_seconds(w.pid) for w in workers)
            started = time.monotonic()
            created = await bench.start([d.id for d in imported.documents], DEFAULT_TEMPLATE)
            # The task closes in the worker processes: polled, as a user's script would.
            while (view := await bench.task(created.task_id)).completed_at is None:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
            elapsed = time.monotonic() - started
            worker_cpu = sum(cpu_seconds(w.pid) for w in workers) - worker_cpu
            rss = [peak_rss_mib(w.pid) for w in workers]
            usage = await meter.since(before)
        n = args.documents
        print(
            f"task {created.task_id}: {view.status.value}, {view.progress.as_dict()}\n"
            f"{n} documents in {elapsed:.2f} s: {n / elapsed:.1f} documents/s "
            f"({n / elapsed / args.workers:.1f} per worker process)"
        )
        server_cpu = "n/a" if usage.cpu_s is None else f"{usage.cpu_s / n * 1000:.1f} ms"
        print(
            f"per document: worker CPU {worker_cpu / n * 1000:.1f} ms, database server CPU "
            f"{server_cpu}, {usage.wal_bytes / n:,.0f} WAL bytes, "
            f"{usage.statements / n:.1f} statements ({usage.statements_source})"
        )
        print("worker peak RSS MiB: " + ", ".join("n/a" if r is None else f"{r:.0f}" for r in rss))
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(timeout=30)
        await extraction.close()
        await boss.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_URL))
    parser.add_argument(
        "--server",
        choices=("own", "url"),
        default="own",
        help="own: a throwaway cluster (default); url: the server of --database-url",
    )
    parser.add_argument("--documents", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8, help="per worker process")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds for workers to start")
    parser.add_argument("--ocr-pages", type=int, default=10)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
