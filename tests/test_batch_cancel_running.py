"""Cancelling a batch task stops the handlers of its running items.

The cancel moves the task's running items to ``cancelled`` and NOTIFYs the
processes running them (item id and fence); the item runner cancels the
handler's task and flags the item. An item heartbeat is the backstop for a
notification that never came.
"""

from __future__ import annotations

import asyncio

from shoal import Shoal
from shoal.batch.item import Item
from shoal.batch.states import ItemStatus, TaskOutcome, TaskStatus
from shoal.db import Database

from .batch_helpers import make_batches, running, settle, sql
from .conftest import wait_for

# A bound on failure, never a speed check.
STOP_TIMEOUT_S = 30


async def test_cancelling_a_task_stops_its_running_items(boss: Shoal, db_url: str) -> None:
    started = asyncio.Event()
    stopped: list[tuple[str, bool]] = []
    side_effects: list[str] = []

    async def handler(item: Item) -> None:
        started.set()
        try:
            await asyncio.Event().wait()  # a handler that would run for ever
        except asyncio.CancelledError:
            stopped.append((item.ref, item.cancelled))
            raise
        side_effects.append(item.ref)

    batches = make_batches(boss, handler, concurrency=1)
    assert boss.notifier is not None
    created = await batches.create("test.kind", ["a"])
    async with running(batches):
        await asyncio.wait_for(started.wait(), STOP_TIMEOUT_S)
        await batches.cancel(created.task_id)
        await wait_for(lambda: stopped, timeout_s=STOP_TIMEOUT_S)
        await settle(batches, created.task_id)
    assert stopped == [("a", True)] and side_effects == []
    view = await batches.get(created.task_id)
    assert (view.status, view.outcome) == (TaskStatus.CANCELLED, TaskOutcome.CANCELLED)
    ((status, errors),) = await sql(
        db_url, "SELECT status::text, errors FROM shoal.item WHERE task_id = %s", created.task_id
    )
    assert status == ItemStatus.CANCELLED.value
    assert isinstance(errors, list) and errors[-1]["type"] == "Cancelled"


async def test_an_item_heartbeat_stops_a_handler_whose_cancel_notification_was_lost(
    db_url: str, boss: Shoal
) -> None:
    # The worker's client does not LISTEN: the cancel notification is lost on it.
    db = await Database(db_url, max_size=10).open()
    deaf = Shoal(db, listen=False)
    started, go = asyncio.Event(), asyncio.Event()
    stopped: list[bool] = []
    side_effects: list[str] = []

    async def handler(item: Item) -> None:
        started.set()
        await go.wait()
        try:
            await item.heartbeat()
        except asyncio.CancelledError:
            stopped.append(item.cancelled)
            raise
        side_effects.append(item.ref)

    try:
        batches = make_batches(deaf, handler, concurrency=1)
        created = await batches.create("test.kind", ["a"])
        async with running(batches):
            await asyncio.wait_for(started.wait(), STOP_TIMEOUT_S)
            await make_batches(boss).cancel(created.task_id)
            go.set()
            await wait_for(lambda: stopped, timeout_s=STOP_TIMEOUT_S)
            await settle(batches, created.task_id)
        assert stopped == [True] and side_effects == []
        assert (await batches.get(created.task_id)).outcome is TaskOutcome.CANCELLED
    finally:
        await deaf.close()
