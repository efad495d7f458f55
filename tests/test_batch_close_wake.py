"""The close follows a task's last item by a wake-up, never by waiting for a tick.

The fake clock never moves unless a test says so: the aggregator's tick never
comes, so a task that closes was closed by the wake-up its last result write
sent. A wake-up runs the close alone; deadlines, zombies and orphans, and any
close a lost wake-up left, wait for the tick.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta

import psycopg

from shoal import FakeClock, Shoal
from shoal.batch.aggregator import AGGREGATOR_INTERVAL, SWEEP_INTERVAL
from shoal.batch.recorder import ItemDone, ItemRecorder
from shoal.batch.rows import GuardedItem
from shoal.batch.service import Batches
from shoal.batch.states import ItemId, TaskStatus
from shoal.queue.job import Completed
from shoal.queue.retry import RetryPolicy
from shoal.queue.rows import ClaimedJob
from shoal.queue.states import JobId
from shoal.testing import Probe

from .batch_helpers import make_batches, sql
from .conftest import wait_for


@asynccontextmanager
async def aggregating(batches: Batches) -> AsyncIterator[None]:
    """The aggregator's loop, as the leader of its duty runs it."""
    loop = asyncio.create_task(batches.aggregator.run())
    try:
        yield
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


def recorder(batches: Batches, clock: FakeClock) -> ItemRecorder:
    """The recorder a kind's item runner builds, waking the aggregator."""

    async def send(*_: object) -> int:
        raise AssertionError("nothing is re-sent here")

    kind = batches.kind("test.kind")
    return ItemRecorder(
        batches.store,
        kind,
        clock=clock,
        send=send,
        forget=lambda _: None,
        wake=batches.aggregator.wake,
    )


def finished(clock: FakeClock, items: Sequence[GuardedItem]) -> list[tuple[ClaimedJob, Completed]]:
    """The completer's batch for these runs: each ended with no result."""
    now = clock.now()
    policy = RetryPolicy(0, timedelta(0), False, timedelta(0))
    return [
        (
            ClaimedJob(JobId(0), "test.kind", "{}", 0, 1, policy, 60.0, None, None, now, now, None),
            Completed(ItemDone(item.id, item.fence, item.task_id, None)),
        )
        for item in items
    ]


async def running_items(batches: Batches, db_url: str, n: int) -> tuple[str, list[GuardedItem]]:
    """A task of ``n`` items, all guarded (running), in id order."""
    created = await batches.create("test.kind", [str(i) for i in range(n)])
    rows = await sql(
        db_url, "SELECT id FROM shoal.item WHERE task_id = %s ORDER BY id", created.task_id
    )
    ids = [ItemId(int(str(r[0]))) for r in rows]
    guarded = await batches.store.guard_items(ids, now=batches.boss.clock.sql_now())
    return created.task_id, [guarded[i] for i in ids]


async def status(batches: Batches, task_id: str) -> TaskStatus:
    return (await batches.get(task_id)).status


async def waiting_for_a_lock(db_url: str, words: str) -> None:
    """Return once a statement containing ``words`` waits for a lock."""

    async def waits() -> bool:
        rows = await sql(
            db_url,
            "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND strpos(query, %s) > 0",
            words,
        )
        return bool(rows)

    await wait_for(waits)


async def test_two_writes_ending_a_task_together_still_wake_its_close(
    fake_boss: Shoal, clock: FakeClock, db_url: str
) -> None:
    # Each write's statement sees the other's item still running: the one
    # that commits last asks again after its commit, and wakes the close.
    batches = make_batches(fake_boss)
    record = recorder(batches, clock)
    task_id, (first, second) = await running_items(batches, db_url, 2)
    async with (
        aggregating(batches),
        await psycopg.AsyncConnection.connect(db_url, autocommit=True) as held,
        await psycopg.AsyncConnection.connect(db_url, autocommit=True) as one,
        await psycopg.AsyncConnection.connect(db_url, autocommit=True) as other,
    ):
        async with held.transaction():
            # The second item's row lock holds its write mid-statement, its
            # snapshot taken before the first item's write commits.
            await held.execute("SELECT 1 FROM shoal.item WHERE id = %s FOR UPDATE", (second.id,))
            late = asyncio.create_task(record.finalize(other, finished(clock, [second])))

            await waiting_for_a_lock(db_url, "complete_items")
            await record.finalize(one, finished(clock, [first]))
            assert await status(batches, task_id) == TaskStatus.PROCESSING
        await late

        async def closed() -> bool:
            return await status(batches, task_id) == TaskStatus.COMPLETED

        await wait_for(closed, timeout_s=10)
        assert clock.monotonic() == 0


async def test_a_wake_up_runs_the_close_alone_and_the_tick_the_rest(
    fake_boss: Shoal, clock: FakeClock, db_url: str
) -> None:
    batches = make_batches(fake_boss)
    record = recorder(batches, clock)
    probe = Probe(fake_boss)
    async with (
        aggregating(batches),
        await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn,
    ):
        await probe.aggregator_pass()  # the loop's first pass, a whole one
        # A zombie: its item's last sign of life, and its task, a day old.
        zombie_task, (zombie,) = await running_items(batches, db_url, 1)
        await sql(
            db_url,
            "UPDATE shoal.item SET updated_at = updated_at - interval '1 day' WHERE id = %s",
            zombie.id,
        )
        await sql(
            db_url,
            "UPDATE shoal.task SET created_at = created_at - interval '1 day' WHERE id = %s",
            zombie_task,
        )
        task_id, items = await running_items(batches, db_url, 3)
        await record.finalize(conn, finished(clock, items))
        (woken,) = await probe.aggregator_pass(
            lambda e: [t.id for t in e["report"].closed] == [task_id]
        )
        assert woken["report"].reaped_to_pending == 0
        rows = await sql(db_url, "SELECT status::text FROM shoal.item WHERE id = %s", zombie.id)
        assert rows == [("running",)]
        # A last item recorded with no wake-up (as if it were lost): the
        # next second's tick closes its task; the zombie waits for the
        # whole pass, which reaps it.
        silent_task, silent = await running_items(batches, db_url, 1)
        assert await batches.store.complete_items([(silent[0].id, silent[0].fence, None)], now=None)
        probe.discard("aggregator_pass")
        clock.advance(AGGREGATOR_INTERVAL)
        (tick,) = await probe.aggregator_pass(
            lambda e: [t.id for t in e["report"].closed] == [silent_task]
        )
        assert tick["report"].reaped_to_pending == 0
        probe.discard("aggregator_pass")
        clock.advance(SWEEP_INTERVAL - AGGREGATOR_INTERVAL)
        await probe.aggregator_pass(lambda e: e["report"].reaped_to_pending == 1)


async def test_a_wake_up_closes_its_task_while_a_whole_pass_is_held_up(
    fake_boss: Shoal, clock: FakeClock, db_url: str
) -> None:
    # A whole pass reads the items (zombies, orphans): at 1,000,000 items it
    # takes about 0.12 s, and a lock can hold it for as long as the lock
    # lasts. The close a wake-up asks for does not wait for it.
    batches = make_batches(fake_boss)
    probe = Probe(fake_boss)
    async with (
        aggregating(batches),
        await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn,
        await psycopg.AsyncConnection.connect(db_url, autocommit=True) as held,
    ):
        await probe.aggregator_pass()  # the loop's first pass, a whole one
        task_id, items = await running_items(batches, db_url, 1)
        # Its last item done with no wake-up yet: the task waits for a close.
        assert await batches.store.complete_items([(items[0].id, items[0].fence, None)], now=None)
        async with held.transaction():
            await held.execute("LOCK TABLE shoal.item IN EXCLUSIVE MODE")
            clock.advance(SWEEP_INTERVAL)  # the next whole pass starts, and waits for the lock

            await waiting_for_a_lock(db_url, "zombie_timeout")  # the zombies' statement
            probe.discard("aggregator_pass")
            await batches.aggregator.wake(conn)
            (woken,) = await probe.aggregator_pass(
                lambda e: [t.id for t in e["report"].closed] == [task_id]
            )
            assert await status(batches, task_id) == TaskStatus.COMPLETED
            # What the pass found waits for it: nothing reaped by the wake-up.
            assert woken["report"].reaped_to_pending == 0
        (whole,) = await probe.aggregator_pass()
        assert whole["report"].closed == ()
