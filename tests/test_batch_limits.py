"""Limits on batch kinds: global concurrency and rates across processes, inside the claim.

A kind's limits are its item queue's (``batch.<kind>``), declared by its
workers and enforced by the queue's limited claim, which keeps the item jobs
leased (a slot is an active job) until the item's run ends. Bad limits are
refused where they are declared. Two real worker processes hold
``global_concurrency`` together at the end. Partitioned kinds:
tests/test_batch_partitions.py.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from shoal import App, FakeClock, InvalidInput, PermanentError, Rate, Shoal
from shoal.batch.item import Item
from shoal.batch.kinds import BatchKind
from shoal.batch.states import ItemStatus, TaskStatus
from shoal.testing import Probe
from tests.test_processes import WorkerProcesses, rows, value, wait_started

from .batch_helpers import make_batches, noop, running, settle, sql
from .conftest import wait_for

QUEUE = "batch.test.kind"


async def item_job_states(db_url: str) -> dict[str, int]:
    found = await sql(
        db_url, "SELECT state::text, count(*) FROM shoal.job WHERE queue = %s GROUP BY 1", QUEUE
    )
    return {str(state): int(str(n)) for state, n in found}


async def test_a_kinds_global_concurrency_holds_its_running_items(
    boss: Shoal, observer: Shoal, db_url: str
) -> None:
    now_running = peak = 0
    release = asyncio.Event()

    async def handler(item: Item) -> None:
        nonlocal now_running, peak
        now_running += 1
        peak = max(peak, now_running)
        await release.wait()
        now_running -= 1

    batches = make_batches(boss, handler, concurrency=10, global_concurrency=2)
    async with running(batches) as worker:
        created = await batches.create("test.kind", [str(i) for i in range(8)])
        await wait_for(lambda: now_running == 2)
        # Both slots are held: nobody else may start an item job either.
        assert await observer.fetch(QUEUE, 10) == []
        assert (await item_job_states(db_url)).get("active") == 2
        # Items created under the limits carry their partition key.
        assert await sql(
            db_url, "SELECT count(*) FROM shoal.job WHERE queue = %s AND partition_key = ''", QUEUE
        ) == [(8,)]
        release.set()
        await settle(batches, created.task_id)
        assert worker.stats.completed == 8
    assert peak == 2
    view = await batches.get(created.task_id)
    assert (view.status, view.progress.completed) == (TaskStatus.COMPLETED, 8)


async def test_a_kinds_rate_limit_holds_item_starts_until_its_bucket_refills(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    started: list[str] = []

    async def handler(item: Item) -> None:
        started.append(item.ref)

    batches = make_batches(
        fake_boss, handler, rate_limit=Rate(3, per=timedelta(minutes=1)), concurrency=10
    )
    probe = Probe(fake_boss)
    async with running(batches):
        await batches.create("test.kind", [str(i) for i in range(8)])
        # The full bucket starts 3; the next claim finds no token and the worker idles.
        await probe.job_finished(QUEUE, count=3)
        await probe.idle(QUEUE)
        assert len(started) == 3
        probe.discard()
        clock.advance(timedelta(seconds=20))  # one token: 3 a minute
        await probe.job_finished(QUEUE)
        await probe.idle(QUEUE)
        assert len(started) == 4
        probe.discard()
        clock.advance(timedelta(minutes=5))  # a full bucket, never more
        await probe.job_finished(QUEUE, count=3)
        await probe.idle(QUEUE)
        assert len(started) == 7
    (state,) = await fake_boss.limits(QUEUE)
    assert state.rate == Rate(3, per=timedelta(minutes=1)) and state.waiting == 1


async def test_an_items_reported_cost_is_charged_to_its_kinds_rate(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    async def handler(item: Item) -> None:
        item.report_cost(30)

    batches = make_batches(fake_boss, handler, rate_limit=Rate(100, per=timedelta(minutes=1)))
    probe = Probe(fake_boss)
    async with running(batches):
        await batches.create("test.kind", ["a", "b"])
        await probe.job_finished(QUEUE, count=2)
        await probe.idle(QUEUE)
    (state,) = await fake_boss.limits(QUEUE)
    # 1 token per start, then the difference from 30 each, on a clock that did not move.
    assert state.tokens == pytest.approx(100 - 2 * 30)


async def test_every_end_of_an_items_run_gives_its_slot_back(boss: Shoal, db_url: str) -> None:
    """With one slot, the task can only finish if each ending frees it."""
    calls: dict[str, int] = {}

    async def handler(item: Item) -> dict[str, Any]:
        calls[item.ref] = calls.get(item.ref, 0) + 1
        if item.ref == "permanent":
            raise PermanentError("bad document")
        if item.ref == "flaky" and calls[item.ref] == 1:
            raise ConnectionError("model endpoint reset")
        if item.ref == "unstorable":
            return {"value": object()}
        return {"ok": item.ref}

    batches = make_batches(boss, handler, global_concurrency=1)
    refs = ["a", "permanent", "flaky", "unstorable", "b", "c"]
    async with running(batches):
        created = await batches.create("test.kind", refs)
        await settle(batches, created.task_id)
    rows_ = (await batches.items(created.task_id)).items
    status = {r.ref: r.status for r in rows_}
    assert status["permanent"] is ItemStatus.ERROR
    assert status["flaky"] is ItemStatus.COMPLETED and calls["flaky"] == 2
    assert status["unstorable"] is ItemStatus.ERROR
    assert all(status[r] is ItemStatus.COMPLETED for r in ("a", "b", "c"))
    assert "active" not in await item_job_states(db_url)


async def test_a_run_handed_back_at_shutdown_gives_its_slot_back(boss: Shoal) -> None:
    entered = asyncio.Event()
    hold = True

    async def handler(item: Item) -> None:
        entered.set()
        if hold:
            await asyncio.Event().wait()

    batches = make_batches(boss, handler, global_concurrency=1)
    created = await batches.create("test.kind", ["a", "b"])
    first = batches.work("test.kind", poll_interval=timedelta(milliseconds=50))
    await entered.wait()
    await first.stop(grace=timedelta(0))
    hold = False
    async with running(batches):
        await settle(batches, created.task_id)
    view = await batches.get(created.task_id)
    assert view.progress.completed == 2


async def test_a_dead_workers_slot_comes_back_and_its_item_runs_once(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    runs: list[str] = []

    async def handler(item: Item) -> None:
        runs.append(item.ref)

    batches = make_batches(
        fake_boss,
        handler,
        global_concurrency=1,
        expire_in=timedelta(minutes=1),
        zombie_timeout=timedelta(seconds=30),
    )
    await fake_boss.declare_limits(QUEUE, global_concurrency=1)  # as its workers do
    created = await batches.create("test.kind", ["a", "b"])
    # A worker claims item a's job, starts its run (the guard), and dies.
    (dead,) = await fake_boss.fetch(QUEUE, 10)
    assert set(await batches.store.guard_items([dead.data["item"]], now=clock.sql_now()))
    assert await fake_boss.fetch(QUEUE, 10) == []  # its slot is held
    clock.advance(timedelta(minutes=2))
    # The aggregator reaps the item (a new job, waiting for a slot); the
    # dead job's lease expires, which gives the slot back.
    assert (await batches.aggregator.run_once()).reaped_to_pending == 1
    assert (await fake_boss.maintain()).retried == 1
    clock.advance(timedelta(seconds=10))  # past the dead job's retry backoff
    probe = Probe(fake_boss)
    async with running(batches):
        await probe.job_finished(QUEUE, count=3)  # a, b, and a's dead job: a phantom
        await probe.idle(QUEUE)
    await settle(batches, created.task_id)
    assert sorted(runs) == ["a", "b"]
    assert (await batches.get(created.task_id)).progress.completed == 2
    assert await batches.phantom_skips() == 1


async def test_a_kind_without_limits_claims_under_limits_declared_for_its_queue(
    boss: Shoal, observer: Shoal
) -> None:
    now_running = peak = 0
    release = asyncio.Event()

    async def handler(item: Item) -> None:
        nonlocal now_running, peak
        now_running += 1
        peak = max(peak, now_running)
        await release.wait()
        now_running -= 1

    await observer.declare_limits(QUEUE, global_concurrency=1)
    batches = make_batches(boss, handler, concurrency=10)
    created = await batches.create("test.kind", [str(i) for i in range(4)])
    async with running(batches):
        await wait_for(lambda: now_running == 1)
        assert await observer.fetch(QUEUE, 10) == []
        release.set()
        await settle(batches, created.task_id)
    assert peak == 1
    assert (await batches.get(created.task_id)).progress.completed == 4


def test_bad_limits_of_a_kind_are_refused_when_declared() -> None:
    with pytest.raises(InvalidInput) as refused:
        BatchKind("extract", noop, global_concurrency=True)
    assert refused.value.field == "global_concurrency"
    app = App()
    with pytest.raises(InvalidInput) as refused:
        app.batch("extract", global_concurrency=0)
    assert refused.value.field == "global_concurrency"
    with pytest.raises(InvalidInput) as refused:
        app.batch("extract", rate_limit=10)  # type: ignore[arg-type]
    assert refused.value.field == "rate_limit"
    assert app.kinds == {}
    app.batch("extract", global_concurrency=2, rate_limit=Rate(5))(noop)
    kind = app.kinds["extract"]
    assert (kind.limits.global_concurrency, kind.limits.rate) == (2, Rate(5))


@pytest.fixture
def workers(db_url: str, tmp_path: Path) -> Any:
    procs = WorkerProcesses(db_url, tmp_path, app="tests.batchlimitsapp:app")
    try:
        yield procs
    finally:
        procs.cleanup()


@pytest.mark.slow
async def test_a_kinds_global_concurrency_holds_across_two_worker_processes(
    observer: Shoal, workers: WorkerProcesses
) -> None:
    from tests.batchlimitsapp import app

    for _ in range(2):
        workers.start()
    await wait_started(observer, 2)
    batches = app.batches(observer)
    tasks = {
        kind: await batches.create(
            kind, [{"ref": f"doc-{i}", "data": {"sleep_ms": 150}} for i in range(16)]
        )
        for kind in ("lim.items", "lim.shared")
    }

    async def closed() -> bool:
        views = [await batches.get(t.task_id) for t in tasks.values()]
        return all(v.status is TaskStatus.COMPLETED for v in views)

    await wait_for(closed, timeout_s=90, interval_s=0.2)
    found = await rows(observer, "SELECT kind, peak, runs FROM public.batch_lim_running")
    counted = {str(kind): (peak, runs) for kind, peak, runs in found}
    # Never more than the limit at once, and the limit was reached (so this
    # could fail); lim.shared's 3 needs both processes' runs at once.
    assert counted == {"lim.items": (2, 16), "lim.shared": (3, 16)}
    pids = await value(
        observer,
        "SELECT count(DISTINCT i.result->>'pid') FROM shoal.item i JOIN shoal.task t"
        " ON t.id = i.task_id WHERE t.kind = 'lim.shared'",
    )
    assert pids == 2


async def test_a_task_created_from_sql_is_held_by_its_kinds_limits_from_the_start(
    boss: Shoal, db_url: str
) -> None:
    now_running = peak = 0
    release = asyncio.Event()

    async def handler(item: Item) -> None:
        nonlocal now_running, peak
        now_running += 1
        peak = max(peak, now_running)
        await release.wait()
        now_running -= 1

    batches = make_batches(boss, handler, concurrency=10, global_concurrency=2)
    async with running(batches):
        await batches.store_kinds()
        # Once the worker has declared the limits (before its first claim,
        # in its own task: without this wait, the create could come first).
        await wait_for(lambda: boss.limits(QUEUE))
        # shoal.create_task() in SQL, as a trigger or psql would call it.
        ((task_id,),) = await sql(
            db_url, "SELECT shoal.create_task('test.kind', %s::jsonb)", '["a", "b", "c", "d"]'
        )
        # Its item jobs carry their key at once: the limited claim counts them.
        assert await sql(
            db_url, "SELECT count(*) FROM shoal.job WHERE queue = %s AND partition_key = ''", QUEUE
        ) == [(4,)]
        await wait_for(lambda: now_running == 2)
        assert (await item_job_states(db_url)).get("active") == 2
        release.set()
        await settle(batches, str(task_id))
    assert peak == 2
