"""The cluster's duties as ``shoal worker`` runs them: each in the process that leads it.

On a FakeClock that never moves, a duty runs only what its leader does at
once or on a wake-up; whatever needs its interval to pass does not happen.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest

from shoal import App, FakeClock, Shoal
from shoal.batch.aggregator import AGGREGATOR_DUTY, AGGREGATOR_QUEUE, AGGREGATOR_SCHEDULE
from shoal.batch.item import Item
from shoal.batch.states import TaskStatus
from shoal.db.leadership import leaders
from shoal.testing import Probe
from tests.conftest import wait_for


@pytest.fixture
def app() -> App:
    app = App()

    @app.batch("duties.items")
    async def handle(item: Item) -> None:
        return None

    return app


@pytest.fixture
async def running(app: App, fake_boss: Shoal) -> AsyncIterator[Probe]:
    """``app`` running on ``fake_boss`` (the only process, so it leads every duty)."""
    probe = Probe(fake_boss)
    stop = asyncio.Event()
    runner = asyncio.create_task(app.run(fake_boss, stop=stop))
    try:
        await wait_for(lambda: _leads(fake_boss, AGGREGATOR_DUTY))
        yield probe
    finally:
        stop.set()
        await runner


def _leads(boss: Shoal, duty: str) -> bool:
    leadership = boss.elector().leadership(duty)
    return leadership is not None and leadership.is_leader


async def test_a_task_closes_when_its_last_item_finishes_without_waiting_for_the_interval(
    app: App, fake_boss: Shoal, clock: FakeClock, running: Probe
) -> None:
    created = await app.batches(fake_boss).create("duties.items", ["a", "b", "c"])

    def closes_it(event: Any) -> bool:
        return any(t.id == created.task_id for t in event["report"].closed)

    # The clock never moves: only the wake-up of the worker that finished the
    # last item can start the pass that closes the task.
    await running.aggregator_pass(closes_it)
    view = await app.batches(fake_boss).get(created.task_id)
    assert view.status is TaskStatus.COMPLETED
    (holder,) = await leaders(fake_boss.db, [AGGREGATOR_DUTY])
    assert holder.process is not None
    assert holder.process.endswith(f":{os.getpid()}")


async def test_the_aggregator_schedule_of_an_earlier_release_is_removed_at_start(
    app: App, fake_boss: Shoal
) -> None:
    # What an earlier release left: the schedule and the pass it enqueued.
    await fake_boss.schedule(
        AGGREGATOR_SCHEDULE, "* * * * * *", queue=AGGREGATOR_QUEUE, singleton_key="aggregate"
    )
    job_id = await fake_boss.send(AGGREGATOR_QUEUE, None, singleton_key="aggregate")
    assert job_id is not None
    stop = asyncio.Event()
    runner = asyncio.create_task(app.run(fake_boss, stop=stop))
    try:
        await wait_for(lambda: _leads(fake_boss, AGGREGATOR_DUTY))
        assert AGGREGATOR_SCHEDULE not in [s.name for s in await fake_boss.schedules()]
        assert (await fake_boss.get_job(job_id)).state == "cancelled"
    finally:
        stop.set()
        await runner
