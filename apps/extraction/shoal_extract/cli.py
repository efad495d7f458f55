"""``shoal-extract``: the workbench's command line. The environment is read here only.

    shoal-extract demo                          the main job: corpus, import, extract, summary
    shoal-extract corpus [--out DIR] [--hard]   write the sample (or hard) corpus and its key
    shoal-extract import PATH...                store PDF, text and Markdown files (folders too)
    shoal-extract templates [--add FILE.json]   list templates, or store one
    shoal-extract run --template T --extractor rules|llm|rules+llm [--documents all|1,2,3]
    shoal-extract evaluate [--task ID] [--key key.json]
    shoal-extract export --task ID --format csv|jsonl [--out PATH]
    shoal-extract worker                        run extraction workers (any number of them)
    shoal-extract api [--port 8000]             shoal's API and dashboard, with the workbench

The database is ``--database-url``, else ``DATABASE_URL``, else shoal's
embedded PostgreSQL (shoal's own CLI helper decides). The ``llm`` extractor
(and ``rules+llm``, which asks the model only for the fields the rules leave
empty, and runs as ``rules`` where no endpoint is configured) reads
``SHOAL_LLM_BASE_URL``, ``SHOAL_LLM_MODEL``, ``SHOAL_LLM_API_KEY``,
``SHOAL_LLM_TIMEOUT_S``, ``SHOAL_LLM_PRICE_IN`` and ``SHOAL_LLM_PRICE_OUT``
(USD per million tokens), ``SHOAL_LLM_MAX_PROMPT_TOKENS`` (per call) and
``SHOAL_LLM_MAX_CALLS`` (per document). Workers refuse documents over
``SHOAL_EXTRACT_MAX_PAGES`` pages or with more than
``SHOAL_EXTRACT_MAX_OCR_PAGES`` pages to OCR (``--max-pages``, ``--max-ocr-pages``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path

from rich.console import Console
from rich.table import Table

from shoal import Created, InvalidInput, Shoal, ShoalError, SystemClock, watch_task
from shoal.cli import api_token, database_url
from shoal.db import default_data_dir
from shoal_extract.console import accuracy_table, errors_table, task_table
from shoal_extract.corpus import DEFAULT_PAPERS, DEFAULT_SEED, KEY_FILE, write_corpus
from shoal_extract.demo import DEMO_PORT, DemoOptions, run_demo
from shoal_extract.evaluate import load_key, split_key
from shoal_extract.export import FORMATS, ExportFormat, write_export
from shoal_extract.extractors.fill import NAME as RULES_LLM
from shoal_extract.extractors.fill import NOT_CONFIGURED
from shoal_extract.extractors.llm import (
    DEFAULT_MAX_CALLS,
    DEFAULT_MAX_PAUSE_S,
    DEFAULT_MAX_PROMPT_TOKENS,
    DEFAULT_TIMEOUT_S,
    LlmSettings,
)
from shoal_extract.hard_corpus import DEFAULT_PER_LAYOUT, write_hard_corpus
from shoal_extract.parsing import DEFAULT_MAX_OCR_PAGES, DEFAULT_MAX_PAGES, ParseLimits
from shoal_extract.schema import DEFAULT_SCHEMA
from shoal_extract.serve import build_api, serving
from shoal_extract.templates import DEFAULT_TEMPLATE, parse_template
from shoal_extract.workbench import Upload, Workbench
from shoal_extract.worker import (
    DEFAULT_CONCURRENCY,
    DEFAULT_RETRY_DELAY,
    DEFAULT_RETRY_LIMIT,
    DEFAULT_ZOMBIE_TIMEOUT,
    EXTRACTORS,
    KIND,
    ExtractionApp,
    WorkerSettings,
)

console = Console()
err = Console(stderr=True)


def data_dir(environ: Mapping[str, str]) -> Path:
    """Where the corpus and exports go: ``SHOAL_EXTRACT_DIR``, else beside shoal's data."""
    explicit = environ.get("SHOAL_EXTRACT_DIR")
    return Path(explicit) if explicit else default_data_dir().parent / "extraction"


def llm_settings(args: argparse.Namespace, environ: Mapping[str, str]) -> LlmSettings | None:
    """The llm extractor's settings from flags, else the environment; None when unset."""
    base_url = args.llm_base_url or environ.get("SHOAL_LLM_BASE_URL")
    model = args.llm_model or environ.get("SHOAL_LLM_MODEL")
    if not base_url or not model:
        return None

    def number(name: str, default: float) -> float:
        raw = environ.get(name)
        try:
            return float(raw) if raw else default
        except ValueError:
            raise SystemExit(f"{name} must be a number, got {raw!r}") from None

    return LlmSettings(
        base_url=base_url,
        model=model,
        api_key=environ.get("SHOAL_LLM_API_KEY") or None,
        timeout_s=args.llm_timeout or number("SHOAL_LLM_TIMEOUT_S", DEFAULT_TIMEOUT_S),
        price_in_per_mtok=number("SHOAL_LLM_PRICE_IN", 0.0),
        price_out_per_mtok=number("SHOAL_LLM_PRICE_OUT", 0.0),
        max_prompt_tokens=int(number("SHOAL_LLM_MAX_PROMPT_TOKENS", DEFAULT_MAX_PROMPT_TOKENS)),
        max_calls=int(number("SHOAL_LLM_MAX_CALLS", DEFAULT_MAX_CALLS)),
        max_pause_s=number("SHOAL_LLM_MAX_PAUSE_S", DEFAULT_MAX_PAUSE_S),
        requests_per_minute=per_minute("SHOAL_LLM_RPM", environ),
        tokens_per_minute=per_minute("SHOAL_LLM_TPM", environ),
    )


TOKEN_NAME_ENV = "SHOAL_API_TOKEN_NAME"


def per_minute(name: str, environ: Mapping[str, str]) -> int | None:
    """A rate from the environment: a whole number of at least 1, or unset (no limit)."""
    raw = environ.get(name)
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise SystemExit(f"{name} must be a whole number per minute, got {raw!r}") from None
    if value < 1:
        raise SystemExit(f"{name} must be at least 1 per minute (unset it for no limit)")
    return value


def parse_limits(args: argparse.Namespace, environ: Mapping[str, str]) -> ParseLimits:
    """The operator's limits on one document: flags, else the environment, else defaults."""

    def count(flag: int | None, name: str, default: int) -> int:
        raw = environ.get(name)
        try:
            value = flag if flag is not None else (int(raw) if raw else default)
        except ValueError:
            raise SystemExit(f"{name} must be a whole number, got {raw!r}") from None
        if value < 1:
            raise SystemExit(f"{name} must be at least 1, got {value}")
        return value

    return ParseLimits(
        max_pages=count(args.max_pages, "SHOAL_EXTRACT_MAX_PAGES", DEFAULT_MAX_PAGES),
        max_ocr_pages=count(
            args.max_ocr_pages, "SHOAL_EXTRACT_MAX_OCR_PAGES", DEFAULT_MAX_OCR_PAGES
        ),
    )


def worker_settings(args: argparse.Namespace) -> WorkerSettings:
    return WorkerSettings(
        limits=parse_limits(args, os.environ),
        concurrency=args.concurrency,
        retry_limit=args.retry_limit,
        retry_delay=timedelta(seconds=args.retry_delay),
        zombie_timeout=timedelta(seconds=args.zombie_timeout),
        llm=llm_settings(args, os.environ),
        schema=args.extract_schema,
        export_dir=data_dir(os.environ) / "exports",
    )


class Session:
    """A connection, the extraction app and the workbench, for one command."""

    def __init__(self, boss: Shoal, extraction: ExtractionApp, bench: Workbench) -> None:
        self.boss = boss
        self.extraction = extraction
        self.bench = bench

    @classmethod
    async def open(cls, args: argparse.Namespace, url: str, *, max_size: int = 10) -> Session:
        boss = await Shoal.connect(url, schema=args.schema, max_size=max_size)
        extraction = ExtractionApp(worker_settings(args))
        try:
            await extraction.attach(boss)
        except BaseException:
            await boss.close()
            raise
        assert extraction.workbench is not None  # attach() opens it, with the flow's runs
        return cls(boss, extraction, extraction.workbench)

    async def close(self) -> None:
        await self.extraction.close()
        await self.boss.close()


async def cmd_import(args: argparse.Namespace, url: str) -> int:
    session = await Session.open(args, url)
    try:
        table = Table(title="imported")
        for column in ("id", "file", "format", "size", "new"):
            table.add_column(column)
        total = new = 0
        for raw in args.paths:
            path = Path(raw)
            if await asyncio.to_thread(path.is_dir):
                report = await session.bench.import_folder(path)
                rows = list(report.documents)
                for name in report.skipped:
                    err.print(f"[dim]skipped {path / name}: not PDF, text or Markdown[/dim]")
            else:
                try:
                    content = await asyncio.to_thread(path.read_bytes)
                except OSError as exc:
                    raise InvalidInput("path", f"cannot read {raw!r}: {exc}") from None
                rows = await session.bench.upload([Upload(path.name, content)])
            for row in rows:
                total += 1
                new += row.created
                table.add_row(
                    str(row.id),
                    row.filename,
                    row.format.value,
                    f"{row.size_bytes:,}",
                    "yes" if row.created else "no (same bytes stored before)",
                )
        console.print(table)
        console.print(f"{total} documents, {new} new")
    finally:
        await session.close()
    return 0


async def cmd_templates(args: argparse.Namespace, url: str) -> int:
    session = await Session.open(args, url, max_size=2)
    try:
        if args.add:
            try:
                text = await asyncio.to_thread(Path(args.add).read_text, encoding="utf-8")
                raw = json.loads(text)
            except (OSError, ValueError) as exc:
                raise InvalidInput("--add", f"cannot read {args.add!r}: {exc}") from None
            stored, created = await session.bench.store.save_template(parse_template(raw))
            verb = "stored as" if created else "unchanged:"
            console.print(f"template {stored.template.name} {verb} version {stored.version}")
            return 0
        templates = await session.bench.store.latest_templates()
        if args.json:
            print(json.dumps([t.as_dict() for t in templates], indent=1))
            return 0
        for stored in templates:
            table = Table(
                title=f"{stored.template.name} v{stored.version}: {stored.template.description}"
            )
            for column in ("field", "type", "required", "description"):
                table.add_column(column)
            for f in stored.template.fields:
                table.add_row(f.name, f.type.value, "yes" if f.required else "", f.description)
            console.print(table)
    finally:
        await session.close()
    return 0


def _ids(text: str, *, allowed: str) -> list[int]:
    """``--documents`` as ids (``1,2,3``); ``allowed`` names what else the flag takes."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InvalidInput("--documents", f"must be {allowed}, got {text!r}") from None


async def _work_and_report(
    session: Session, created: Created, started: float, clock: SystemClock
) -> None:
    """Run this process's workers until ``created`` closes, with progress bars; print its summary.

    The workers stop when this returns or raises.
    """
    stop = asyncio.Event()
    runner = asyncio.create_task(session.extraction.app.run(session.boss, stop=stop))
    try:
        bench = session.bench
        view = await watch_task(bench.batches, created.task_id, console)
        page = await bench.all_results(created.task_id)
        usage = await bench.usage(created.task_id)
        skips = await bench.batches.phantom_skips()
        console.print(task_table(view, usage, skips, clock.monotonic() - started))
        failed = errors_table(page)
        if failed is not None:
            console.print(failed)
    finally:
        stop.set()
        await runner


async def cmd_run(args: argparse.Namespace, url: str) -> int:
    session = await Session.open(args, url, max_size=20)
    clock = SystemClock()
    started = clock.monotonic()
    try:
        bench = session.bench
        if args.documents == "all":
            ids = [d.id for d in await bench.all_documents()]
            if not ids:
                raise InvalidInput("--documents", "no documents stored: run `shoal-extract import`")
        else:
            ids = _ids(args.documents, allowed="'all' or ids like 1,2,3")
        created = await bench.start(ids, args.template, extractor=args.extractor)
        console.print(f"task {created.task_id}: {len(ids)} documents")
        if args.no_work:
            console.print("queued: `shoal-extract worker` processes will run it")
            return 0
        if args.extractor == RULES_LLM and session.extraction.settings.llm is None:
            console.print(f"[yellow]{RULES_LLM}: {NOT_CONFIGURED}[/yellow]")
        await _work_and_report(session, created, started, clock)
        key_path = Path(args.key) if args.key else data_dir(os.environ) / "corpus" / KEY_FILE
        if key_path.exists():
            report = await bench.evaluate(created.task_id, load_key(key_path))
            if report.documents:
                console.print(accuracy_table(report))
        return 0
    finally:
        await session.close()


async def cmd_rerun(args: argparse.Namespace, url: str) -> int:
    session = await Session.open(args, url, max_size=20)
    clock = SystemClock()
    started = clock.monotonic()
    try:
        bench = session.bench
        documents: list[int] | str = (
            "failed" if args.failed else _ids(args.documents, allowed="ids like 1,2,3")
        )
        created, ids = await bench.rerun(
            args.task,
            documents,
            template=args.template,
            template_version=args.template_version,
            extractor=args.extractor,
        )
        console.print(f"task {created.task_id}: {len(ids)} documents of task {args.task} again")
        if args.no_work:
            console.print("queued: `shoal-extract worker` processes will run it")
            return 0
        await _work_and_report(session, created, started, clock)
        return 0
    finally:
        await session.close()


async def _latest_closed_task(bench: Workbench) -> str:
    for view in await bench.tasks(limit=50):
        if view.status != "processing":
            return view.task_id
    raise InvalidInput("--task", "no finished extraction task: run `shoal-extract run` first")


async def cmd_evaluate(args: argparse.Namespace, url: str) -> int:
    session = await Session.open(args, url, max_size=2)
    try:
        task_id = args.task or await _latest_closed_task(session.bench)
        if args.against == "reviews":
            if args.key:
                raise InvalidInput("--key", "not with --against reviews: the reviews are the key")
            key = await session.bench.reviewed_key(task_id)
            key_path = Path("reviews")
            if not key:
                raise InvalidInput(
                    "--against", "no reviewed values for this task's template: review some first"
                )
        else:
            key_path = Path(args.key) if args.key else data_dir(os.environ) / "corpus" / KEY_FILE
            key = load_key(key_path)
        report = await session.bench.evaluate(task_id, key)
        parts = split_key(key)
        reports = {
            part: await session.bench.evaluate(task_id, entries) for part, entries in parts.items()
        }
        if args.json:
            out = {"task_id": task_id, "key": str(key_path), **report.as_dict()}
            if len(parts) > 1:
                out["parts"] = {part: r.as_dict() for part, r in reports.items()}
            print(json.dumps(out))
            return 0
        console.print(f"task {task_id} against {key_path}")
        if not report.documents:
            console.print("[yellow]none of the task's documents is in the key[/yellow]")
            return 1
        for part, part_report in reports.items():
            if part_report.documents:
                if part:
                    console.print(f"[bold]{part}[/bold]")
                console.print(accuracy_table(part_report))
        console.print(
            f"documents ending as the key expects: {report.status_right}/{report.documents}"
            + (f"; {report.unmatched} not in the key" if report.unmatched else "")
        )
        if args.misses and report.misses:
            table = Table(title="misses")
            for column in ("file", "field", "expected", "got"):
                table.add_column(column, overflow="fold")
            for miss in report.misses:
                table.add_row(miss.file, miss.field, repr(miss.expected), repr(miss.got))
            console.print(table)
    finally:
        await session.close()
    return 0


async def cmd_export(args: argparse.Namespace, url: str) -> int:
    session = await Session.open(args, url, max_size=2)
    try:
        fmt: ExportFormat = args.format
        page = await session.bench.all_results(args.task)
        out = Path(args.out) if args.out else Path(f"extraction-{args.task}.{fmt}")
        write_export(page, fmt, out)
        console.print(f"{len(page.lines)} documents written to {out}")
    finally:
        await session.close()
    return 0


def _stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


async def cmd_worker(args: argparse.Namespace, url: str) -> int:
    session = await Session.open(args, url, max_size=args.concurrency + 6)
    stop = asyncio.Event()
    _stop_on_signals(stop)
    try:
        err.print(f"extraction worker: kind {KIND}, concurrency {args.concurrency}")
        await session.extraction.app.run(
            session.boss, stop=stop, grace=timedelta(seconds=args.grace)
        )
    finally:
        await session.close()
    return 0


async def cmd_api(args: argparse.Namespace, url: str) -> int:
    token = api_token(args)
    session = await Session.open(args, url, max_size=10)
    stop = asyncio.Event()
    _stop_on_signals(stop)
    try:
        bench = session.bench
        api = build_api(
            session.boss,
            bench.batches,
            bench,
            token=token,
            token_name=args.token_name or os.environ.get(TOKEN_NAME_ENV) or None,
            read_only=args.read_only,
            allowed_hosts=args.allowed_hosts,
        )
        async with serving(api, host=args.host, port=args.port) as base:
            err.print(
                f"workbench: {base}/extraction   tasks: {base}/tasks   console: {base}/"
                + (" (bearer token required)" if token else "")
                + (" read-only" if args.read_only else "")
            )
            await stop.wait()
    finally:
        await session.close()
    return 0


async def cmd_demo(args: argparse.Namespace, url: str) -> int:
    options = DemoOptions(
        data_dir=Path(args.data_dir) if args.data_dir else data_dir(os.environ),
        port=args.port,
        extractor=args.extractor,
        template=args.template,
        stay=args.stay,
        hard=args.hard,
    )
    return await run_demo(
        url, schema=args.schema, settings=worker_settings(args), options=options, console=console
    )


def cmd_corpus(args: argparse.Namespace) -> int:
    if args.hard:
        out = Path(args.out) if args.out else data_dir(os.environ) / "corpus-hard"
        files = write_hard_corpus(out, per_layout=args.per_layout, seed=args.seed)
        console.print(f"{len(files)} files and {KEY_FILE} written to {out}")
        return 0
    out = Path(args.out) if args.out else data_dir(os.environ) / "corpus"
    files = write_corpus(out, count=args.count, seed=args.seed)
    console.print(f"{len(files)} files and {KEY_FILE} written to {out}")
    return 0


COMMANDS = {
    "import": cmd_import,
    "templates": cmd_templates,
    "run": cmd_run,
    "evaluate": cmd_evaluate,
    "rerun": cmd_rerun,
    "export": cmd_export,
    "worker": cmd_worker,
    "api": cmd_api,
    "demo": cmd_demo,
}


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="shoal-extract", description="The literature extraction workbench, on shoal."
    )
    root.add_argument("--database-url", help="default: $DATABASE_URL, else embedded PostgreSQL")
    root.add_argument("--schema", default=os.environ.get("SHOAL_SCHEMA", "shoal"))
    root.add_argument("--extract-schema", default=DEFAULT_SCHEMA, help="the workbench's tables")
    root.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    worker_opts = argparse.ArgumentParser(add_help=False)
    worker_opts.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY)
    worker_opts.add_argument("--retry-limit", type=int, default=DEFAULT_RETRY_LIMIT)
    worker_opts.add_argument(
        "--retry-delay", type=float, default=DEFAULT_RETRY_DELAY.total_seconds(), help="seconds"
    )
    worker_opts.add_argument(
        "--zombie-timeout",
        type=float,
        default=DEFAULT_ZOMBIE_TIMEOUT.total_seconds(),
        help="seconds without a sign of life before a running item is reaped",
    )
    worker_opts.add_argument(
        "--max-pages", type=int, help=f"refuse longer documents; default {DEFAULT_MAX_PAGES}"
    )
    worker_opts.add_argument(
        "--max-ocr-pages", type=int, help=f"pages OCRed per document; {DEFAULT_MAX_OCR_PAGES}"
    )
    worker_opts.add_argument("--llm-base-url", help="default: $SHOAL_LLM_BASE_URL")
    worker_opts.add_argument("--llm-model", help="default: $SHOAL_LLM_MODEL")
    worker_opts.add_argument("--llm-timeout", type=float, help="seconds; $SHOAL_LLM_TIMEOUT_S")
    sub = root.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", parents=[worker_opts], help="the main job, end to end")
    demo.add_argument("--port", type=int, default=DEMO_PORT)
    demo.add_argument("--extractor", choices=EXTRACTORS, default="rules")
    demo.add_argument("--template", default=DEFAULT_TEMPLATE)
    demo.add_argument("--data-dir", help="corpus and exports (default: $SHOAL_EXTRACT_DIR)")
    demo.add_argument("--stay", action="store_true", help="keep serving after the summary")
    demo.add_argument(
        "--hard", action="store_true", help="the hard corpus (OCR, long papers; slower)"
    )

    corpus = sub.add_parser("corpus", help="write the sample corpus and its key")
    corpus.add_argument("--out", help="default: <data dir>/corpus")
    corpus.add_argument("--count", type=int, default=DEFAULT_PAPERS)
    corpus.add_argument("--seed", type=int, default=DEFAULT_SEED)
    corpus.add_argument(
        "--hard",
        action="store_true",
        help="the hard corpus instead: scans, two columns, tables, long papers, held-out layouts "
        "(default out: <data dir>/corpus-hard)",
    )
    corpus.add_argument("--per-layout", type=int, default=DEFAULT_PER_LAYOUT, help="with --hard")

    imp = sub.add_parser("import", parents=[worker_opts], help="store documents")
    imp.add_argument("paths", nargs="+", help="files or folders")

    templates = sub.add_parser("templates", parents=[worker_opts], help="list or add templates")
    templates.add_argument("--add", metavar="FILE.json", help="store a template from JSON")
    templates.add_argument("--json", action="store_true", help="print JSON")

    run = sub.add_parser("run", parents=[worker_opts], help="start an extraction task")
    run.add_argument("--template", default=DEFAULT_TEMPLATE)
    run.add_argument("--extractor", choices=EXTRACTORS, default="rules")
    run.add_argument("--documents", default="all", help="'all' or ids: 1,2,3")
    run.add_argument("--no-work", action="store_true", help="only queue it for workers")
    run.add_argument("--key", help="a key file to score against (default: the corpus's)")

    evaluate = sub.add_parser("evaluate", parents=[worker_opts], help="accuracy against a key")
    evaluate.add_argument("--task", help="default: the newest finished extraction task")
    evaluate.add_argument("--key", help="default: <data dir>/corpus/key.json")
    evaluate.add_argument("--json", action="store_true", help="print JSON")
    evaluate.add_argument("--misses", action="store_true", help="list every wrong field")
    evaluate.add_argument(
        "--against",
        choices=("key", "reviews"),
        default="key",
        help="the truth: a key file (default), or the values people accepted or corrected",
    )

    rerun = sub.add_parser(
        "rerun", parents=[worker_opts], help="documents of a task again, as a new task"
    )
    rerun.add_argument("--task", required=True)
    which = rerun.add_mutually_exclusive_group(required=True)
    which.add_argument("--failed", action="store_true", help="the task's documents in error")
    which.add_argument("--documents", help="ids of documents in the task: 1,2,3")
    rerun.add_argument("--template", help="default: the task's")
    rerun.add_argument("--template-version", type=int, help="default: the newest (or the task's)")
    rerun.add_argument("--extractor", choices=EXTRACTORS, help="default: the task's")
    rerun.add_argument("--no-work", action="store_true", help="only queue it for workers")

    export = sub.add_parser("export", parents=[worker_opts], help="write a task's results")
    export.add_argument("--task", required=True)
    export.add_argument("--format", choices=FORMATS, default="csv")
    export.add_argument("--out", help="default: extraction-<task>.<format>")

    worker = sub.add_parser("worker", parents=[worker_opts], help="run extraction workers")
    worker.add_argument("--grace", type=float, default=30.0, help="seconds to finish items")

    api = sub.add_parser("api", parents=[worker_opts], help="serve the API and the workbench")
    api.add_argument("--host", default="127.0.0.1")
    api.add_argument("--port", type=int, default=8000)
    api.add_argument("--token", help="bearer token (prefer $SHOAL_API_TOKEN)")
    api.add_argument(
        "--token-name", help=f"who holds the token, in the reviews it stores (${TOKEN_NAME_ENV})"
    )
    api.add_argument("--read-only", action="store_true", help="refuse every write")
    api.add_argument(
        "--allowed-host",
        dest="allowed_hosts",
        action="append",
        default=[],
        metavar="NAME",
        help="a further name the API answers to (repeat for more); any other Host is refused",
    )
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s",
    )
    logging.getLogger("psycopg.pool").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.command in ("demo", "run") and not args.verbose:
        # The progress bars and tables tell the story; expected failures need not shout.
        logging.getLogger("shoal").setLevel(logging.ERROR)
    if args.command == "corpus":
        return cmd_corpus(args)
    if args.command == "api":
        api_token(args)  # refuse an open non-loopback bind before starting anything
    try:
        with database_url(args) as url:
            return asyncio.run(COMMANDS[args.command](args, url))
    except ShoalError as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
