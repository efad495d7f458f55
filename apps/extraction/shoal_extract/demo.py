"""The main job (``shoal-extract demo``, ``make demo``): the sample corpus, extracted end to end.

In one process, on the embedded PostgreSQL unless ``DATABASE_URL`` is set:

1. write the sample corpus (seeded: the same files on every machine) and its key;
2. run shoal's workers and aggregator, and serve the API with the dashboard
   and the workbench;
3. start one run of the workflow ``extraction`` over the corpus folder
   (:mod:`shoal_extract.flow`): it imports the files (content-hashed: a second
   run stores nothing new) and extracts every document as one task (``rules``
   by default), shown with live progress bars;
4. print the summary: items completed and in error (with the parser's
   messages), per-field accuracy against the key, the time taken;
5. say the review is done (the demo is its own reviewer; with ``--stay`` a
   person reviews in the workbench and clicks "Done reviewing"), so the run
   writes the CSV and JSON Lines exports, and print where, with the
   dashboard and workbench URLs.
"""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from rich.console import Console

from shoal import RunStatus, Shoal, SystemClock, watch_task
from shoal.workflow import RunView, StepKind
from shoal_extract.console import accuracy_table, errors_table, task_table
from shoal_extract.corpus import KEY_FILE, write_corpus
from shoal_extract.evaluate import ResultRow as ScoredRow
from shoal_extract.evaluate import load_key, score, split_key
from shoal_extract.extractors.fill import NAME as RULES_LLM
from shoal_extract.extractors.fill import NOT_CONFIGURED
from shoal_extract.hard_corpus import write_hard_corpus
from shoal_extract.kinds import FLOW, review_key
from shoal_extract.serve import build_api, serving
from shoal_extract.templates import DEFAULT_TEMPLATE
from shoal_extract.workbench import Workbench
from shoal_extract.worker import ExtractionApp, WorkerSettings

DEMO_PORT = 8000
SHUTDOWN_GRACE = timedelta(seconds=10)
RUN_POLL_S = 0.1
EXPORT_TIMEOUT = timedelta(minutes=5)
REVIEW_WAIT = timedelta(days=365)  # until the reviewer is done or Ctrl-C


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


async def _extracting(bench: Workbench, run_id: str) -> tuple[dict[str, Any], str]:
    """What the run imported and its task's id, once its documents are being extracted."""
    while True:
        view = await bench.run(run_id)
        if view.status in (RunStatus.FAILED, RunStatus.CANCELLED):
            raise RuntimeError(f"run {run_id} {view.status.value}: {view.error}")
        task = next((s.result for s in view.steps if s.kind is StepKind.BATCH), None)
        if task is not None:
            return view.steps[0].result, str(task["task_id"])
        await asyncio.sleep(RUN_POLL_S)


async def _reviewed(
    bench: Workbench, run_id: str, task_id: str, base: str, *, stay: bool, console: Console
) -> RunView | None:
    """The run once its review is done and its export written; None if interrupted first.

    The demo is its own reviewer; with ``stay`` a person reviews in the workbench.
    """
    workflows = bench.workflows
    assert workflows is not None
    while True:
        view = await bench.run(run_id)
        if view.run.finished_at is not None:
            return view  # its task was cancelled: nothing to review
        if view.run.wait_key == review_key(task_id):
            break
        await asyncio.sleep(RUN_POLL_S)
    if not stay:
        await bench.finish_review(task_id, reviewer="demo")
        return await workflows.wait(run_id, timeout=EXPORT_TIMEOUT)
    console.print(
        f'review the values at {base}/extraction, then click "Done reviewing": the run '
        "writes the exports then (Ctrl-C to stop)"
    )
    done = asyncio.create_task(workflows.wait(run_id, timeout=REVIEW_WAIT))
    interrupted = asyncio.create_task(_until_interrupted())
    await asyncio.wait((done, interrupted), return_when=asyncio.FIRST_COMPLETED)
    for pending in (done, interrupted):
        pending.cancel()
    return done.result() if done.done() and not done.cancelled() else None


async def run_demo(
    url: str,
    *,
    schema: str,
    settings: WorkerSettings,
    options: DemoOptions,
    console: Console,
) -> int:
    clock = SystemClock()
    started_at = clock.monotonic()
    if options.hard:
        corpus = options.data_dir / "corpus-hard"
        files = await asyncio.to_thread(write_hard_corpus, corpus)
        console.print(f"hard corpus: {len(files)} files and their key in {corpus}")
    else:
        corpus = options.data_dir / "corpus"
        files = await asyncio.to_thread(write_corpus, corpus)
        console.print(f"sample corpus: {len(files)} files and their key in {corpus}")
    boss = await Shoal.connect(url, schema=schema, max_size=20)
    extraction = ExtractionApp(replace(settings, export_dir=options.data_dir / "exports"))
    stop = asyncio.Event()
    runner: asyncio.Task[object] | None = None
    try:
        await extraction.attach(boss)
        bench = extraction.workbench
        assert bench is not None  # attach() opens it
        batches = bench.batches
        runner = asyncio.create_task(
            extraction.app.run(boss, stop=stop, grace=SHUTDOWN_GRACE), name="shoal-extract-run"
        )
        api = build_api(boss, batches, bench, token=None)
        async with serving(api, port=options.port) as base:
            started = await bench.start_folder_run(
                corpus, options.template, extractor=options.extractor
            )
            imported, task_id = await _extracting(bench, started.id)
            console.print(
                f"run [bold]{started.id}[/bold] (workflow {FLOW}) imported "
                f"{len(imported['documents'])} documents ({imported['new']} new, "
                f"{len(imported['documents']) - imported['new']} already stored)"
            )
            console.print(
                f"task [bold]{task_id}[/bold]: {len(imported['documents'])} documents, "
                f"template {options.template}, extractor {options.extractor}"
            )
            if options.extractor == RULES_LLM and settings.llm is None:
                console.print(f"[yellow]{RULES_LLM}: {NOT_CONFIGURED}[/yellow]")
            console.print(
                f"workbench: {base}/extraction   tasks: {base}/tasks   console: {base}/ "
                "(live while this runs)"
            )
            view = await watch_task(batches, task_id, console)
            page = await bench.all_results(task_id)
            usage = await bench.usage(task_id)
            elapsed = clock.monotonic() - started_at
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
            run = await _reviewed(
                bench, started.id, task_id, base, stay=options.stay, console=console
            )
            exports = None if run is None else run.result.get("exports")
            if run is None:
                console.print(
                    f"run {started.id} still waits for the review of task {task_id}: "
                    "with a worker up (shoal-extract worker), Done reviewing lets it export"
                )
            if run is not None:
                review = run.result.get("review") or {}
                console.print(
                    f"run {run.id}: {run.status.value}, review {review.get('status')}"
                    + (f" by {review['reviewer']}" if review.get("reviewer") else "")
                )
            if exports is not None:
                console.print(f"exported CSV:        {exports['csv']}")
                console.print(f"exported JSON Lines: {exports['jsonl']}")
            console.print(f"workbench: {base}/extraction")
            console.print(f"tasks: {base}/tasks   console: {base}/")
            console.print(f"done in {clock.monotonic() - started_at:.1f} s")
            if options.stay and run is not None:  # None: Ctrl-C came during the review
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
