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
