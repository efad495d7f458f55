"""What progress shows as running is what handlers run, bounded by the kind's concurrency."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from shoal import FakeClock, Shoal
from shoal.batch.item import Item
from shoal.batch.item_runner import MARK_AFTER
from shoal.batch.states import ItemStatus

from .batch_helpers import make_batches, running, settle
from .conftest import wait_for


async def count_running_rows(db_url: str) -> int:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT count(*) FROM shoal.item WHERE status = 'running'")
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


async def test_running_never_exceeds_concurrency_while_the_worker_buffers_claimed_items(
    boss: Shoal, observer: Shoal, db_url: str
) -> None:
    release = asyncio.Event()
    blocked: list[str] = []

    async def handler(item: Item) -> Any:
        if isinstance(item.data, dict) and item.data.get("block"):
            blocked.append(item.ref)
            await release.wait()
        return None

    batches = make_batches(boss, handler, concurrency=2)
    watcher = make_batches(observer)  # reads progress from a connection of its own
    # Quick items first: the worker learns their rate, and then claims ahead
    # of its free runners (its prefetch), as in a busy task.
    refs: list[Any] = [f"quick-{i}" for i in range(10)]
    refs += [{"ref": f"slow-{i}", "data": {"block": True}} for i in range(10)]
    created = await batches.create("test.kind", refs)
    async with running(batches) as worker:
        await wait_for(lambda: len(blocked) == 2)
        # Both handlers are shown as running once they have run for MARK_AFTER.
        await wait_for(lambda: _running_at_least(watcher, created.task_id, 2))
        # The worker holds more items than run: claimed, guarded, in its buffer.
        assert worker.in_flight > 2
        assert await count_running_rows(db_url) > 2
        for _ in range(50):  # observed from another connection while handlers block
            progress = (await watcher.get(created.task_id)).progress
            assert progress.running <= 2, progress
            assert progress.running + progress.pending + progress.completed == 20
        release.set()
        await settle(batches, created.task_id)
    view = await watcher.get(created.task_id)
    assert (view.progress.completed, view.progress.running) == (20, 0)


async def _running_at_least(watcher: Any, task_id: str, n: int) -> bool:
    return bool((await watcher.get(task_id)).progress.running >= n)


async def test_a_claimed_item_counts_as_pending_until_its_handler_has_run_a_moment(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    async def handler(item: Item) -> Any:
        started.set()
        await release.wait()

    batches = make_batches(fake_boss, handler)
    created = await batches.create("test.kind", ["a", "b"])
    runner = batches.runners["test.kind"]
    jobs = await runner.claim("batch.test.kind", 10, now=clock.now())
    assert len(jobs) == 2
    progress = (await batches.get(created.task_id)).progress
    assert (progress.pending, progress.running) == (2, 0)  # claimed, no handler yet

    from shoal.queue.job import Job

    run = asyncio.ensure_future(runner(Job(jobs[0], lambda job: _held())))
    await asyncio.wait_for(started.wait(), 5)
    assert await runner.mark_handlers() == 0  # not yet MARK_AFTER
    clock.advance(MARK_AFTER)
    assert await runner.mark_handlers() == 1
    progress = (await batches.get(created.task_id)).progress
    assert (progress.pending, progress.running) == (1, 1)
    release.set()
    await run
    # Ended, its result not yet recorded: unmarked, shown as pending again.
    assert await runner.mark_handlers() == 1
    progress = (await batches.get(created.task_id)).progress
    assert (progress.pending, progress.running) == (2, 0)
    items = (await batches.items(created.task_id, status=ItemStatus.RUNNING)).items
    assert len(items) == 2  # both still held by the worker (fenced, heartbeated)


async def _held() -> bool:
    return True
