"""A task's items counted as they change (item_tally): progress and close cost alike at any size.

Every statement that changes items' statuses adds to its session's row of
item_tally, by a trigger on the item table; progress, the close and /metrics
sum a task's rows instead of counting its items. These tests hold the sums
to the items' own counts through every way an item changes (run, failed for
good, retried, cancelled, a write rolled back, two sessions at once), and
show that progress and the close read as much of a 20,000-item task as of a
10-item one.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import psycopg
from psycopg import sql as pgsql

from shoal import PermanentError, Shoal
from shoal.batch.item import Item
from shoal.batch.states import TaskOutcome

from .batch_helpers import make_batches, running, settle, sql, tally_mismatches
from .conftest import wait_for


async def test_the_counts_follow_items_run_failed_retried_and_cancelled(
    boss: Shoal, db_url: str
) -> None:
    failing = {"f1", "f2", "f3"}
    release = asyncio.Event()

    async def handler(item: Item) -> None:
        if item.ref == "slow":
            await release.wait()
        if item.ref in failing:
            raise PermanentError(f"{item.ref} is broken")

    batches = make_batches(boss, handler)
    refs = [f"ok{i}" for i in range(19)] + ["slow"] + sorted(failing)
    created = await batches.create("test.kind", refs)
    stopped = await batches.create("test.kind", [f"c{i}" for i in range(7)])
    assert await tally_mismatches(db_url) == []
    view = await batches.cancel(stopped.task_id)
    assert view.progress.cancelled == 7
    async with running(batches):
        # One item held in its handler: counted running once the worker marks
        # it (the others waiting in the buffer count as pending).
        async def slow_one_runs() -> bool:
            return (await batches.get(created.task_id)).progress.running == 1

        await wait_for(slow_one_runs)
        assert await tally_mismatches(db_url) == []
        release.set()
        await settle(batches, created.task_id)
        await settle(batches, stopped.task_id)
        assert await tally_mismatches(db_url) == []
        view = await batches.get(created.task_id)
        assert (view.outcome, view.progress.error, view.progress.completed) == (
            TaskOutcome.COMPLETED_WITH_ERRORS,
            3,
            20,
        )
        # The close's last finish is its last item's.
        assert await sql(
            db_url,
            "SELECT t.last_item_at = (SELECT max(finished_at) FROM shoal.item WHERE task_id = t.id)"
            " FROM shoal.task t WHERE t.id = %s",
            created.task_id,
        ) == [(True,)]

    failing.clear()
    assert await batches.retry_failed(created.task_id) == 3
    assert (await batches.get(created.task_id)).progress.pending == 3
    assert await tally_mismatches(db_url) == []
    async with running(batches):
        await settle(batches, created.task_id)
    assert await tally_mismatches(db_url) == []
    view = await batches.get(created.task_id)
    assert (view.outcome, view.progress.completed, view.progress.error) == (
        TaskOutcome.COMPLETED,
        23,
        0,
    )
    assert (await batches.get(stopped.task_id)).outcome is TaskOutcome.CANCELLED


async def test_two_sessions_count_apart_and_a_rolled_back_change_counts_nothing(
    boss: Shoal, db_url: str
) -> None:
    batches = make_batches(boss)
    created = await batches.create("test.kind", [str(i) for i in range(10)])
    finish = (
        "UPDATE shoal.item SET status = 'completed', finished_at = now(), updated_at = now()"
        " WHERE task_id = %s AND ref = ANY(%s)"
    )
    async with (
        await psycopg.AsyncConnection.connect(db_url) as first,
        await psycopg.AsyncConnection.connect(db_url) as second,
    ):
        # Both in flight at once: neither waits for the other's row.
        await first.execute(finish, (created.task_id, ["0", "1", "2"]))
        await second.execute(finish, (created.task_id, ["3", "4"]))
        await first.commit()
        await second.rollback()
    assert await tally_mismatches(db_url) == []
    progress = (await batches.get(created.task_id)).progress
    assert (progress.completed, progress.pending) == (3, 7)
    rows = await sql(
        db_url, "SELECT count(*) FROM shoal.item_tally WHERE task_id = %s", created.task_id
    )
    assert rows == [(1,)]


async def buffers(conn: psycopg.AsyncConnection[Any], query: pgsql.Composed, **params: Any) -> int:
    """Shared buffers the statement touched (hit or read), by EXPLAIN ANALYZE."""
    explain = pgsql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + query
    cur = await conn.execute(explain, params)
    row = await cur.fetchone()
    assert row is not None
    doc = row[0] if isinstance(row[0], list) else json.loads(row[0])
    plan = doc[0]["Plan"]
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


async def test_progress_and_the_close_read_as_much_of_a_big_task_as_of_a_small_one(
    boss: Shoal, db_url: str
) -> None:
    batches = make_batches(boss)
    small = await batches.create("test.kind", [str(i) for i in range(10)])
    big = await batches.create("test.kind", [str(i) for i in range(20_000)])
    # Every item finished, one in a hundred for good with an error.
    await sql(
        db_url,
        "UPDATE shoal.item SET status = CASE WHEN id % 100 = 0 THEN 'error' ELSE 'completed'"
        " END::shoal.item_status, finished_at = now(), updated_at = now()",
    )
    store = batches.store
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        small_poll = await buffers(conn, store.sql["progress"], task_id=small.task_id)
        big_poll = await buffers(conn, store.sql["progress"], task_id=big.task_id)
        # Counting the big task's items read its whole index range: hundreds of pages.
        assert big_poll <= small_poll + 4, (small_poll, big_poll)

        # The close of both, rolled back: the same pages as closing the small one alone.
        close = store.sql["close_tasks"]
        await conn.execute(
            "UPDATE shoal.task SET status = 'completed', outcome = 'completed',"
            " completed_at = now() WHERE id = %s",
            (big.task_id,),
        )
        small_close = await buffers(conn, close, limit=100, now=None)
        await conn.rollback()
        both_close = await buffers(conn, close, limit=100, now=None)
        assert both_close <= 2 * small_close + 4, (small_close, both_close)
        await conn.rollback()
    await settle(batches, big.task_id)
    view = await batches.get(big.task_id)
    assert (view.outcome, view.progress.error, view.progress.completed) == (
        TaskOutcome.COMPLETED_WITH_ERRORS,
        200,
        19_800,
    )
    assert await tally_mismatches(db_url) == []
