"""The console's tasks routes over a real database: elapsed time and the estimate
of time left, "paused" for a task whose queue is paused, filters by kind and
status, item search by ref, and each failed item's history numbering every run
(across retry-failed) with its start and end."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest

from shoal import FakeClock, PermanentError, Shoal
from shoal.api import create_api
from shoal.batch.item import Item
from shoal.batch.kinds import BatchKind
from shoal.batch.service import Batches
from shoal.batch.views import Progress, estimate
from shoal.queue.worker import Worker

from .test_console_api import assert_error, client_for

FLAKY = "console.flaky"
QUIET = "console.quiet"  # no worker runs it


@pytest.fixture
async def tasks(
    fake_boss: Shoal, clock: FakeClock
) -> AsyncIterator[tuple[Batches, httpx.AsyncClient]]:
    async def flaky(item: Item) -> dict[str, Any]:
        data = item.data if isinstance(item.data, dict) else {}
        clock.advance(timedelta(seconds=data.get("takes_s", 0)))
        if data.get("broken"):
            raise PermanentError(f"{item.ref}: unreadable scan")
        if data.get("later"):
            raise RuntimeError(f"{item.ref}: gateway busy")
        return {"ref": item.ref}

    async def never(item: Item) -> None:  # pragma: no cover - no worker runs it
        raise AssertionError("no worker runs the quiet kind")

    kinds = {
        FLAKY: BatchKind(name=FLAKY, handler=flaky, retry_limit=2, retry_delay=timedelta(hours=1)),
        QUIET: BatchKind(name=QUIET, handler=never),
    }
    batches = Batches(fake_boss, kinds)
    async with client_for(create_api(fake_boss, batches, token=None)) as client:
        yield batches, client


async def run_items(boss: Shoal, batches: Batches) -> None:
    """Run every due item of the flaky kind in this task, as its worker would (claim,
    guard, run, record), then let the aggregator close what it can."""
    runner = batches.runners[FLAKY]
    worker = Worker(
        boss.store,
        batches.kinds[FLAKY].queue,
        runner,
        concurrency=1,
        batch_size=None,
        poll_interval=timedelta(seconds=1),
        clock=boss.clock,
        jitter=boss.jitter,
        notifier=None,
        claim=runner.claim,
        finalize=runner.recorder.finalize,
        store_output=False,
    )
    while await worker.run_inline():
        pass
    await batches.aggregator.run_once()


async def test_each_failed_run_is_numbered_across_retry_failed_with_its_start_and_end(
    fake_boss: Shoal, clock: FakeClock, tasks: tuple[Batches, httpx.AsyncClient]
) -> None:
    batches, client = tasks
    items = [{"ref": "scan-1", "data": {"broken": True, "takes_s": 3}}, "ok-1"]
    task_id = (await client.post("/v1/tasks", json={"kind": FLAKY, "items": items})).json()[
        "task_id"
    ]
    first_start = clock.now()
    await run_items(fake_boss, batches)
    clock.advance(timedelta(minutes=5))
    retried = (await client.post(f"/v1/tasks/{task_id}/retry-failed")).json()
    assert retried["retried"] == 1
    second_start = clock.now()
    await run_items(fake_boss, batches)

    page = (await client.get(f"/v1/tasks/{task_id}/items?status=error")).json()
    (item,) = page["items"]
    assert item["ref"] == "scan-1" and item["attempts"] == 1  # runs since retry-failed
    history = item["errors"]
    assert [(e["attempt"], e["run"], e["type"]) for e in history] == [
        (1, 1, "PermanentError"),
        (2, 1, "PermanentError"),
    ]
    for entry, start in zip(history, (first_start, second_start), strict=True):
        assert datetime.fromisoformat(entry["started_at"]) == start
        assert datetime.fromisoformat(entry["at"]) == start + timedelta(seconds=3)
        assert "unreadable scan" in entry["message"]


async def test_tasks_show_elapsed_and_time_left_and_none_when_unknown_or_paused(
    fake_boss: Shoal, clock: FakeClock, tasks: tuple[Batches, httpx.AsyncClient]
) -> None:
    batches, client = tasks
    items = ["a", "b", {"ref": "c", "data": {"later": True}}, {"ref": "d", "data": {"later": True}}]
    busy = (await client.post("/v1/tasks", json={"kind": FLAKY, "items": items})).json()
    quiet = (await client.post("/v1/tasks", json={"kind": QUIET, "items": ["q"]})).json()
    clock.advance(timedelta(seconds=20))
    await run_items(fake_boss, batches)  # a and b complete; c and d retry in an hour

    view = (await client.get(f"/v1/tasks/{busy['task_id']}")).json()
    assert (view["progress"]["completed"], view["progress"]["pending"]) == (2, 2)
    assert view["queue"] == batches.kinds[FLAKY].queue and view["paused"] is False
    assert view["elapsed_s"] == 20.0
    assert view["rate_per_s"] == 0.1  # 2 items in 20 s
    assert view["eta_s"] == 20.0  # 2 left at that rate
    nothing_done = (await client.get(f"/v1/tasks/{quiet['task_id']}")).json()
    assert nothing_done["elapsed_s"] == 20.0 and nothing_done["eta_s"] is None

    # Paused: the task says so, and no estimate (nothing starts until resumed).
    queue = batches.kinds[FLAKY].queue
    assert (await client.post(f"/v1/queues/{queue}/pause")).status_code == 200
    (listed,) = (await client.get(f"/v1/tasks?kind={FLAKY}")).json()["tasks"]
    assert listed["task_id"] == busy["task_id"]
    assert listed["paused"] is True and listed["eta_s"] is None and listed["rate_per_s"] is None
    await client.post(f"/v1/queues/{queue}/resume")
    assert (await client.get(f"/v1/tasks/{busy['task_id']}")).json()["eta_s"] == 20.0

    # Closed: elapsed stops at completion, nothing left to estimate.
    clock.advance(timedelta(hours=1))
    await run_items(fake_boss, batches)  # c and d fail once more, then run again an hour on
    clock.advance(timedelta(hours=2))
    await run_items(fake_boss, batches)
    closed = (await client.get(f"/v1/tasks/{busy['task_id']}")).json()
    assert closed["status"] == "completed" and closed["outcome"] == "completed_with_errors"
    assert closed["eta_s"] is None
    assert (
        closed["elapsed_s"]
        == (
            datetime.fromisoformat(closed["completed_at"])
            - datetime.fromisoformat(closed["created_at"])
        ).total_seconds()
    )


async def test_tasks_filter_by_kind_and_status_and_items_by_ref(
    fake_boss: Shoal, clock: FakeClock, tasks: tuple[Batches, httpx.AsyncClient]
) -> None:
    batches, client = tasks
    done = (await client.post("/v1/tasks", json={"kind": FLAKY, "items": ["x-1"]})).json()
    await run_items(fake_boss, batches)
    clock.advance(timedelta(seconds=1))  # newest first: one created after the other
    refs = ["invoice-17", "invoice-170", "receipt-17", "invoice-2"]
    open_ = (await client.post("/v1/tasks", json={"kind": QUIET, "items": refs})).json()

    def ids(response: httpx.Response) -> list[str]:
        assert response.status_code == 200, response.text
        return [t["task_id"] for t in response.json()["tasks"]]

    assert ids(await client.get("/v1/tasks")) == [open_["task_id"], done["task_id"]]
    assert ids(await client.get(f"/v1/tasks?kind={FLAKY}")) == [done["task_id"]]
    assert ids(await client.get(f"/v1/tasks?kind={QUIET}&status=processing")) == [open_["task_id"]]
    assert ids(await client.get(f"/v1/tasks?kind={QUIET}&status=completed")) == []
    assert ids(await client.get("/v1/tasks?kind=no.such.kind")) == []
    assert_error(await client.get("/v1/tasks?kind="), 422, "kind")

    items = f"/v1/tasks/{open_['task_id']}/items"
    found = (await client.get(items, params={"ref": "invoice-17"})).json()
    assert [i["ref"] for i in found["items"]] == ["invoice-17", "invoice-170"]
    found = (await client.get(items, params={"ref": "-17", "limit": 1})).json()
    assert [i["ref"] for i in found["items"]] == ["invoice-17"] and found["next_cursor"]
    more = await client.get(items, params={"ref": "-17", "cursor": found["next_cursor"]})
    assert [i["ref"] for i in more.json()["items"]] == ["invoice-170", "receipt-17"]
    assert (await client.get(items, params={"ref": "INVOICE"})).json()["items"] == []
    assert_error(await client.get(items, params={"ref": ""}), 422, "ref")


def test_the_estimate_is_the_average_rate_since_created() -> None:
    start = datetime.fromisoformat("2026-01-01T12:00:00+00:00")
    half = Progress(total=10, pending=4, running=1, completed=4, error=1, cancelled=0)
    est = estimate(
        half,
        created_at=start,
        completed_at=None,
        now=start + timedelta(seconds=50),
        running=True,
        paused=False,
    )
    assert (est.elapsed_s, est.rate_per_s, est.eta_s) == (50.0, 0.1, 50.0)
    for stopped in ({"running": False, "paused": False}, {"running": True, "paused": True}):
        est = estimate(
            half, created_at=start, completed_at=None, now=start + timedelta(seconds=50), **stopped
        )
        assert (est.rate_per_s, est.eta_s) == (None, None)
    fresh = Progress(total=10, pending=10, running=0, completed=0, error=0, cancelled=0)
    est = estimate(
        fresh, created_at=start, completed_at=None, now=start, running=True, paused=False
    )
    assert (est.elapsed_s, est.eta_s) == (0.0, None)
