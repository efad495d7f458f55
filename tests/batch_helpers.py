"""Shared set-up for batch tests: a kind, its Batches, and a worker running it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import psycopg

from shoal import Shoal
from shoal.batch.item import Item
from shoal.batch.kinds import BatchKind
from shoal.batch.service import Batches
from shoal.queue.worker import Worker

from .conftest import wait_for

Handler = Callable[[Item], Awaitable[Any]]


async def noop(item: Item) -> dict[str, str]:
    return {"ref": item.ref}


def make_batches(boss: Shoal, handler: Handler = noop, **options: Any) -> Batches:
    options.setdefault("retry_delay", timedelta(milliseconds=10))
    kind = BatchKind(name="test.kind", handler=handler, **options)
    return Batches(boss, {kind.name: kind})


@asynccontextmanager
async def running(batches: Batches, kind: str = "test.kind") -> AsyncIterator[Worker]:
    """A worker for ``kind``'s items (as ``App.run`` starts it), stopped on exit."""
    started = batches.work(kind, poll_interval=timedelta(milliseconds=50))
    try:
        yield started.worker
    finally:
        await started.stop(grace=timedelta(seconds=5))


async def settle(batches: Batches, task_id: str, timeout_s: float = 30.0) -> None:
    """Run aggregator passes until the task is closed (a bound on failure, not a speed check)."""

    async def closed_after_a_pass() -> bool:
        await batches.aggregator.run_once()
        return (await batches.get(task_id)).status != "processing"

    try:
        await wait_for(closed_after_a_pass, timeout_s=timeout_s)
    except AssertionError:
        view = await batches.get(task_id)
        raise AssertionError(f"task did not close: {view.progress}") from None


async def sql(db_url: str, query: str, *args: object) -> list[tuple[object, ...]]:
    """Run one statement on a connection of its own (autocommit); its rows, if any."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        cur = await conn.execute(query, args or None)
        return await cur.fetchall() if cur.description else []


# Each task's counts as its item_tally rows sum them (the total as pending plus
# what was moved) beside the counts of its items, where the two differ.
TALLY_MISMATCHES = """
WITH tallied AS (
    SELECT t.id, t.total + coalesce(sum(x.pending), 0) AS pending,
           coalesce(sum(x.waiting), 0) AS waiting, coalesce(sum(x.running), 0) AS running,
           coalesce(sum(x.completed), 0) AS completed,
           coalesce(sum(x.error), 0) AS error, coalesce(sum(x.cancelled), 0) AS cancelled,
           max(x.last_finished_at) AS last_finished_at
    FROM shoal.task t LEFT JOIN shoal.item_tally x ON x.task_id = t.id
    GROUP BY t.id, t.total
), counted AS (
    SELECT task_id AS id, count(*) FILTER (WHERE status = 'pending') AS pending,
           count(*) FILTER (WHERE status = 'running' AND NOT in_handler) AS waiting,
           count(*) FILTER (WHERE status = 'running' AND in_handler) AS running,
           count(*) FILTER (WHERE status = 'completed') AS completed,
           count(*) FILTER (WHERE status = 'error') AS error,
           count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
           max(finished_at) AS last_finished_at
    FROM shoal.item GROUP BY task_id
)
SELECT t.id::text, t.pending, t.waiting, t.running, t.completed, t.error, t.cancelled,
       c.pending, c.waiting, c.running, c.completed, c.error, c.cancelled
FROM tallied t JOIN counted c ON c.id = t.id
WHERE (t.pending, t.waiting, t.running, t.completed, t.error, t.cancelled)
      <> (c.pending, c.waiting, c.running, c.completed, c.error, c.cancelled)
   -- Once every item has finished, the latest finish is the last item's.
   OR (c.pending + c.waiting + c.running = 0
       AND t.last_finished_at IS DISTINCT FROM c.last_finished_at)
"""


async def tally_mismatches(db_url: str) -> list[tuple[object, ...]]:
    """Tasks whose item_tally sums differ from their items' counts (none, when all is well)."""
    return await sql(db_url, TALLY_MISMATCHES)
