"""Shared set-up for batch tests: a kind, its Batches, and a worker running it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from shoal import Shoal
from shoal.batch.item import Item
from shoal.batch.kinds import BatchKind
from shoal.batch.service import Batches
from shoal.queue.worker import Worker

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


async def settle(batches: Batches, task_id: str, timeout_s: float = 20.0) -> None:
    """Run aggregator passes until the task is closed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while (await batches.get(task_id)).status == "processing":
        if loop.time() > deadline:
            view = await batches.get(task_id)
            raise AssertionError(f"task did not close: {view.progress}")
        await batches.aggregator.run_once()
        await asyncio.sleep(0.05)
