"""The main job (``shoal-extract demo``, ``make demo``): the sample corpus, extracted end to end.

In one process, on the embedded PostgreSQL unless ``DATABASE_URL`` is set:

1. write the sample corpus (seeded: the same files on every machine) and its key;
2. import it (content-hashed: a second run stores nothing new);
3. run shoal's workers and aggregator, and serve the API with the dashboard
   and the workbench;
4. start one extraction task over every document (``rules`` by default) and
   show live progress bars;
5. print the summary: items completed and in error (with the parser's
   messages), per-field accuracy against the key, the time taken, the
   exported CSV and JSON Lines files, and the dashboard and workbench URLs.
"""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from rich.console import Console

from shoal import Shoal, SystemClock, watch_task
from shoal_extract.console import accuracy_table, errors_table, task_table
from shoal_extract.corpus import KEY_FILE, write_corpus
from shoal_extract.evaluate import ResultRow as ScoredRow
from shoal_extract.evaluate import load_key, score, split_key
from shoal_extract.export import write_export
from shoal_extract.extractors.fill import NAME as RULES_LLM
from shoal_extract.extractors.fill import NOT_CONFIGURED
from shoal_extract.hard_corpus import write_hard_corpus
from shoal_extract.serve import build_api, serving
from shoal_extract.templates import DEFAULT_TEMPLATE
from shoal_extract.workbench import Workbench
from shoal_extract.worker import ExtractionApp, WorkerSettings

DEMO_PORT = 8000
SHUTDOWN_GRACE = timedelta(seconds=10)


@dataclass(frozen=True, slots=True)
class DemoOptions:
    data_dir: Path
    port: int = DEMO_PORT
    extractor: str = "rules"
    template: str = DEFAULT_TEMPLATE
    stay: bool = False
    hard: bool = False  # the hard corpus (scans to OCR, long papers): slower


async def _until_interrupted() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def run_demo(
    url: str,
    *,
    schema: str,
    settings: WorkerSettings,
    options: DemoOptions,
    console: Console,
) -> int:
    clock = SystemClock()
    started = clock.monotonic()
    if options.hard:
        corpus = options.data_dir / "corpus-hard"
        files = await asyncio.to_thread(write_hard_corpus, corpus)
        console.print(f"hard corpus: {len(files)} files and their key in {corpus}")
    else:
        corpus = options.data_dir / "corpus"
        files = await asyncio.to_thread(write_corpus, corpus)
        console.print(f"sample corpus: {len(files)} files and their key in {corpus}")
    boss = await Shoal.connect(url, schema=schema, max_size=20)
    extraction = ExtractionApp(settings)
    stop = asyncio.Event()
    runner: asyncio.Task[object] | None = None
    try:
        store = await extraction.attach(boss)
        batches = extraction.app.batches(boss)
        bench = Workbench(batches, store)
        imported = await bench.import_folder(corpus)
        console.print(
            f"imported {len(imported.documents)} documents "
            f"({imported.new} new, {len(imported.documents) - imported.new} already stored)"
        )
        runner = asyncio.create_task(
            extraction.app.run(boss, stop=stop, grace=SHUTDOWN_GRACE), name="shoal-extract-run"
        )
        api = build_api(boss, batches, bench, token=None)
        async with serving(api, port=options.port) as base:
            created = await bench.start(
                [d.id for d in imported.documents], options.template, extractor=options.extractor
            )
            console.print(
                f"task [bold]{created.task_id}[/bold]: {len(imported.documents)} documents, "
                f"template {options.template}, extractor {options.extractor}"
            )
            if options.extractor == RULES_LLM and settings.llm is None:
                console.print(f"[yellow]{RULES_LLM}: {NOT_CONFIGURED}[/yellow]")
            console.print(
                f"workbench: {base}/extraction   tasks: {base}/tasks   console: {base}/ "
                "(live while this runs)"
            )
            view = await watch_task(batches, created.task_id, console)
            page = await bench.all_results(created.task_id)
            usage = await bench.usage(created.task_id)
            elapsed = clock.monotonic() - started
            console.print(task_table(view, usage, await batches.phantom_skips(), elapsed))
            failed = errors_table(page)
            if failed is not None:
                console.print(failed)
            key = load_key(corpus / KEY_FILE)
            rows = [ScoredRow(r.sha256, r.file, r.status, r.fields) for r in page.lines]
            report = score(rows, key, page.fields)
            for part, entries in split_key(key).items():
                if part:
                    console.print(f"[bold]{part}[/bold]")
                console.print(accuracy_table(score(rows, entries, page.fields)))
            console.print(
                f"documents ending as the key expects (completed, or error for a broken file): "
                f"{report.status_right}/{report.documents}"
            )
            exports = options.data_dir / "exports"
            csv_path = write_export(page, "csv", exports / f"extraction-{created.task_id}.csv")
            jsonl_path = write_export(
                page, "jsonl", exports / f"extraction-{created.task_id}.jsonl"
            )
            console.print(f"exported CSV:        {csv_path}")
            console.print(f"exported JSON Lines: {jsonl_path}")
            console.print(f"workbench: {base}/extraction")
            console.print(f"tasks: {base}/tasks   console: {base}/")
            console.print(f"done in {clock.monotonic() - started:.1f} s")
            if options.stay:
                console.print("serving the workbench and dashboard until Ctrl-C")
                await _until_interrupted()
        return 0 if view.status == "completed" else 1
    finally:
        stop.set()
        if runner is not None:
            await runner
        await extraction.close()
        await boss.close()


__all__ = ["DemoOptions", "run_demo"]
