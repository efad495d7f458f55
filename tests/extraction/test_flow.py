"""The whole flow as one workflow: import -> parse and extract -> a person reviews -> export.

A run imports a folder, extracts its documents as one batch task, waits (holding
no process) for the reviewer's "done reviewing", then writes the export. The
review has a timeout (on a FakeClock here: no test sleeps), and a worker that
stops while the run waits is followed by another that redoes nothing.
"""

from __future__ import annotations

import asyncio
import csv
import shutil
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from shoal import Conflict, FakeClock, Item, RunStatus, Shoal
from shoal.workflow import RunView, StepKind, StepStatus
from shoal_extract.kinds import FLOW, KIND, RUN_PARAM, review_key
from shoal_extract.serve import build_api, serving
from shoal_extract.workbench import Workbench
from shoal_extract.worker import ExtractionApp, WorkerSettings
from tests.conftest import wait_for
from tests.test_dashboard import browser  # noqa: F401 - the fixture, shared

from .conftest import FAST

FILES = ("paper-01.pdf", "paper-06.txt", "broken-truncated.pdf")
TOKEN = "flow-token"
UI_TIMEOUT_MS = 20_000


@pytest.fixture
def folder(corpus_dir: Path, tmp_path: Path) -> Path:
    """Three of the generated corpus's documents: two papers and a broken PDF."""
    papers = tmp_path / "papers"
    papers.mkdir()
    for name in FILES:
        shutil.copy(corpus_dir / name, papers / name)
    return papers


@pytest.fixture
def settings(tmp_path: Path) -> WorkerSettings:
    return replace(FAST, export_dir=tmp_path / "exports")


def csv_rows(path: str) -> dict[str, dict[str, str]]:
    """An export's CSV rows by file name."""
    with Path(path).open(encoding="utf-8", newline="") as text:
        return {row["file"]: row for row in csv.DictReader(text)}


class CountingApp(ExtractionApp):
    """The extraction app, counting the documents its worker extracts."""

    extracted = 0

    async def extract_item(self, item: Item) -> dict[str, Any]:
        type(self).extracted += 1
        return await super().extract_item(item)


@pytest.fixture(autouse=True)
def no_counts() -> Iterator[None]:
    CountingApp.extracted = 0
    yield


async def opened(boss: Shoal, settings: WorkerSettings, **kwargs: Any) -> ExtractionApp:
    extraction = CountingApp(settings, **kwargs)
    await extraction.attach(boss)
    return extraction


def bench_of(extraction: ExtractionApp) -> Workbench:
    assert extraction.workbench is not None
    return extraction.workbench


@asynccontextmanager
async def worker(extraction: ExtractionApp, boss: Shoal) -> AsyncIterator[None]:
    """A worker of the app in this process (items, aggregator, the flow's runs) in the block."""
    stop = asyncio.Event()
    runner = asyncio.create_task(
        extraction.app.run(boss, stop=stop, grace=timedelta(seconds=5)), name="flow-worker"
    )
    try:
        yield
    finally:
        stop.set()
        await runner


async def run_reaches(bench: Workbench, run_id: str, *statuses: RunStatus) -> RunView:
    async def there() -> bool:
        return (await bench.run(run_id)).status in statuses

    await wait_for(there, timeout_s=60)
    return await bench.run(run_id)


async def waiting_for_review(bench: Workbench, run_id: str) -> str:
    """The task id, once the run has extracted it and waits for its review."""

    async def reviewing() -> bool:
        view = await bench.run(run_id)
        return view.run.wait_key is not None and view.run.wait_key.startswith("extraction.review:")

    await wait_for(reviewing, timeout_s=60)
    view = await bench.run(run_id)
    assert view.status is RunStatus.WAITING
    task = next(s for s in view.steps if s.kind is StepKind.BATCH)
    return str(task.result["task_id"])


async def test_a_run_imports_extracts_waits_for_the_reviewer_and_exports(
    boss: Shoal, folder: Path, settings: WorkerSettings, key: dict[str, Any]
) -> None:
    extraction = await opened(boss, settings)
    bench = bench_of(extraction)
    api = build_api(boss, bench.batches, bench, token=TOKEN, token_name="alice")
    transport = httpx.ASGITransport(app=api)
    async with (
        httpx.AsyncClient(
            transport=transport,
            base_url="http://127.0.0.1",
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as client,
        worker(extraction, boss),
    ):
        started = await bench.start_folder_run(folder, "clinical_trial", run_id="flow-1")
        task_id = await waiting_for_review(bench, started.id)

        # Extracted as one batch task of the workbench's kind, which names the run.
        task = await bench.batches.get(task_id)
        assert task.kind == KIND and task.params[RUN_PARAM] == "flow-1"
        assert task.progress.completed == 2 and task.progress.error == 1
        assert CountingApp.extracted >= 3

        # The run holds no job while the reviewer works (once the job that set the
        # wait has recorded its own end).
        async def no_job_held() -> bool:
            return await boss.jobs(f"workflow.{FLOW}", state="active") == []

        await wait_for(no_job_held)
        assert (await bench.run(started.id)).status is RunStatus.WAITING

        results = (await client.get(f"/v1/extraction/tasks/{task_id}/results")).json()
        paper = next(r for r in results["results"] if r["file"] == "paper-01.pdf")
        corrected = await client.post(
            f"/v1/extraction/tasks/{task_id}/reviews",
            json={"item_id": paper["item_id"], "field": "title", "action": "correct", "value": "T"},
        )
        assert corrected.status_code == 201, corrected.text
        done = await client.post(f"/v1/extraction/tasks/{task_id}/review-done")
        assert done.status_code == 202, done.text
        assert done.json() == {"task_id": task_id, "run_id": "flow-1", "reviewer": "alice"}

        view = await run_reaches(bench, started.id, RunStatus.COMPLETED, RunStatus.FAILED)
        assert view.status is RunStatus.COMPLETED, view.error
        shown = (await client.get("/v1/extraction/runs/flow-1")).json()
        assert shown["status"] == "completed" and shown["task_id"] == task_id
        assert [s["name"] for s in shown["steps"]] == [
            "extraction.import",
            "extraction.plan",
            KIND,
            review_key(task_id),
            "extraction.export",
        ]
        # Once done, the review cannot be finished again: nothing waits for it.
        again = await client.post(f"/v1/extraction/tasks/{task_id}/review-done")
        assert again.status_code == 409 and again.json()["field"] == "task_id"

    result = view.result
    assert result["outcome"] == "completed_with_errors"
    assert result["review"] == {"status": "done", "reviewer": "alice"}
    exports = result["exports"]
    assert exports["documents"] == 3 and exports["corrected_values"] == 1
    assert exports["csv"] == str(settings.export_dir / f"extraction-{task_id}.csv")
    rows = csv_rows(exports["csv"])
    assert rows["paper-01.pdf"]["title"] == "T"
    assert rows["paper-01.pdf"]["title.reviewer"] == "alice"
    truth = {d["file"]: d["fields"] for d in key["documents"]}
    assert rows["paper-06.txt"]["title"] == truth["paper-06.txt"]["title"]
    assert rows["broken-truncated.pdf"]["status"] == "error"
    assert len(Path(exports["jsonl"]).read_bytes().splitlines()) == 3  # noqa: ASYNC240 - a test's small file
    await extraction.close()


async def test_runs_over_http_start_once_and_refuse_bad_input_naming_the_field(
    boss: Shoal, folder: Path, settings: WorkerSettings
) -> None:
    extraction = await opened(boss, settings)
    bench = bench_of(extraction)
    docs = await bench.import_folder(folder)
    ids = [d.id for d in docs.documents]
    api = build_api(boss, bench.batches, bench, token=None)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api), base_url="http://127.0.0.1"
    ) as client:
        body: dict[str, Any] = {
            "document_ids": ids,
            "template": "clinical_trial",
            "review_timeout_s": 86400,
        }
        started = await client.post("/v1/extraction/runs", json=body | {"run_id": "r-1"})
        assert started.status_code == 202, started.text
        assert started.json() == {"run_id": "r-1", "created": True}
        again = await client.post("/v1/extraction/runs", json=body | {"run_id": "r-1"})
        assert again.status_code == 200 and again.json()["created"] is False
        shown = (await client.get("/v1/extraction/runs/r-1")).json()
        assert shown["status"] == "pending" and shown["task_id"] is None  # no worker here
        assert shown["input"]["review_timeout_s"] == 86400
        cases: list[tuple[dict[str, Any], str]] = [
            ({"template": "nope"}, "template"),
            ({"document_ids": [*ids, 999999]}, f"document_ids[{len(ids)}]"),
            ({"review_timeout_s": 0}, "review_timeout_s"),
        ]
        for bad, field in cases:
            refused = await client.post("/v1/extraction/runs", json=body | bad)
            assert refused.status_code == 422, refused.text
            assert refused.json()["field"] == field
        assert (await client.get("/v1/extraction/runs/nope")).status_code == 404
        # A task started on its own has no run to tell.
        plain = await bench.start(ids, "clinical_trial")
        done = await client.post(
            f"/v1/extraction/tasks/{plain.task_id}/review-done", headers={"X-Shoal-Request": "1"}
        )
        assert done.status_code == 422 and done.json()["field"] == "task_id"
        assert "started on its own" in done.json()["message"]
    assert [r.id for r in await bench.workflows.list(name=FLOW)] == ["r-1"]  # type: ignore[union-attr]
    await extraction.close()


async def test_a_review_that_times_out_exports_what_was_reviewed_and_says_so(
    fake_boss: Shoal, clock: FakeClock, folder: Path, settings: WorkerSettings
) -> None:
    extraction = await opened(fake_boss, settings, clock=clock)
    bench = bench_of(extraction)
    workflows = bench.workflows
    assert workflows is not None
    batches = bench.batches
    await batches.store_kinds()
    items = batches.work(KIND, poll_interval=timedelta(milliseconds=50))
    workflows.work(FLOW)
    try:
        started = await bench.start_folder_run(
            folder, "clinical_trial", review_timeout=timedelta(days=2)
        )

        async def reviewing() -> bool:
            await batches.aggregator.run_once()  # a worker process's duty, driven here
            wait = (await bench.run(started.id)).run.wait_key
            return wait is not None and wait.startswith("extraction.review:")

        await wait_for(reviewing, timeout_s=60)
        task_id = await waiting_for_review(bench, started.id)
        page = await bench.results(task_id, status="completed")
        line = next(x for x in page.lines if x.file == "paper-06.txt")
        await bench.review(task_id, line.item_id, "year", "accept", reviewer="bob")

        # Its one job left is the one that ends the wait, due when the timeout passes.
        (wake,) = await fake_boss.jobs(f"workflow.{FLOW}", state="created")
        assert wake.start_after == clock.now() + timedelta(days=2)
        clock.advance(timedelta(days=2) - timedelta(minutes=1))
        assert (await bench.run(started.id)).status is RunStatus.WAITING
        clock.advance(timedelta(minutes=1))
        view = await run_reaches(bench, started.id, RunStatus.COMPLETED, RunStatus.FAILED)
    finally:
        await items.stop(grace=timedelta(seconds=5))
        await fake_boss.stop_workers(timedelta(seconds=5))
    assert view.status is RunStatus.COMPLETED, view.error
    assert view.result["review"] == {"status": "timed_out", "after_s": 2 * 86400}
    exports = view.result["exports"]
    assert exports["reviewed_values"] == 1 and exports["corrected_values"] == 0
    rows = csv_rows(exports["csv"])
    assert rows["paper-06.txt"]["year.review"] == "accepted"
    assert rows["paper-06.txt"]["year.reviewer"] == "bob"
    # A "done" after the timeout finds no run waiting.
    with pytest.raises(Conflict, match="completed and does not wait"):
        await bench.finish_review(task_id, reviewer="bob")
    await extraction.close()


async def test_a_worker_stopped_while_the_run_waits_is_followed_without_redoing_steps(
    boss: Shoal, folder: Path, settings: WorkerSettings
) -> None:
    first = await opened(boss, settings)
    async with worker(first, boss):
        started = await bench_of(first).start_folder_run(folder, "clinical_trial")
        task_id = await waiting_for_review(bench_of(first), started.id)
    await first.close()
    before = await bench_of(first).run(started.id)
    extracted = CountingApp.extracted
    assert extracted >= 3

    # Another worker (a new app on the same database) takes over; the reviewer is done.
    second = await opened(boss, settings)
    bench = bench_of(second)
    async with worker(second, boss):
        assert await bench.finish_review(task_id, reviewer="carol") == started.id
        view = await run_reaches(bench, started.id, RunStatus.COMPLETED, RunStatus.FAILED)
    await second.close()

    assert view.status is RunStatus.COMPLETED, view.error
    assert CountingApp.extracted == extracted  # no document parsed or extracted again
    done = [(s.seq, s.name, s.attempts, s.finished_at) for s in before.steps[:3]]
    assert [(s.seq, s.name, s.attempts, s.finished_at) for s in view.steps[:3]] == done
    assert all(s.status is StepStatus.COMPLETED for s in view.steps)
    assert [t.task_id for t in await bench.tasks()] == [task_id]  # one task, created once
    rows = await bench.batches.export_rows(task_id)
    assert sorted(r.status.value for r in rows) == ["completed", "completed", "error"]
    assert view.result["review"] == {"status": "done", "reviewer": "carol"}
    assert len(csv_rows(view.result["exports"]["csv"])) == 3


async def test_the_workbench_page_sends_done_reviewing_and_the_run_exports(
    browser: Any,  # noqa: F811 - the fixture imported above
    boss: Shoal,
    folder: Path,
    settings: WorkerSettings,
) -> None:
    from playwright.async_api import expect

    extraction = await opened(boss, settings)
    bench = bench_of(extraction)
    api = build_api(boss, bench.batches, bench, token=TOKEN, token_name="dana")
    context = await browser.new_context()
    page = await context.new_page()
    try:
        async with worker(extraction, boss), serving(api, port=0) as base:
            started = await bench.start_folder_run(folder, "clinical_trial")
            await waiting_for_review(bench, started.id)
            await page.goto(base + "/extraction")
            await page.fill("#token", TOKEN)
            await page.click("#auth button[type=submit]")
            await page.locator("section.task").first.locator("button.results").click()
            done = page.locator("#results button.review-done")
            await expect(done).to_be_visible(timeout=UI_TIMEOUT_MS)
            await done.click()
            exporting = f"run {started.id}: exporting"
            await expect(page.locator("#results")).to_contain_text(exporting, timeout=UI_TIMEOUT_MS)
            # The table drawn anew (a poll, or Results pressed again) still says so.
            await page.evaluate("document.querySelector('#results table').dataset.old = '1'")
            await page.locator("section.task").first.locator("button.results").click()
            await expect(page.locator("#results table:not([data-old])")).to_have_count(
                1, timeout=UI_TIMEOUT_MS
            )
            await expect(page.locator("#results")).to_contain_text(exporting)
            await expect(done).to_be_disabled()
            view = await run_reaches(bench, started.id, RunStatus.COMPLETED, RunStatus.FAILED)
    finally:
        await context.close()
        await extraction.close()
    assert view.status is RunStatus.COMPLETED, view.error
    assert view.result["review"] == {"status": "done", "reviewer": "dana"}
