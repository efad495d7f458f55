"""Monitor leadership: of two backlog monitors on one database, only the leader samples
and alerts; when the leader goes, the other takes over.

Leadership is a session advisory lock on the connection of each monitor's own
elector (shoal.db.leadership), so it is per connection, not per process: two
monitors with separate pools in one process contend exactly as two processes
do (and this keeps the test fast).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from shoal import Database, Shoal
from shoal.ingest.monitor import BacklogMonitor, Reading
from shoal.ingest.postgres import PostgresTransport
from shoal.ingest.store import IngestStore
from tests.conftest import wait_for
from tests.ingest_helpers import READINGS

# The monitor's own loop waits this long between rounds and between tries to lead
# (an asyncio timer; the test awaits conditions, it never sleeps).
INTERVAL = timedelta(milliseconds=50)


class CountingMonitor(BacklogMonitor):
    checks = 0

    async def check(self) -> list[Reading]:
        self.checks += 1
        return await super().check()


class Side:
    """One "process": its own pool, transport and monitor."""

    def __init__(self, boss: Shoal) -> None:
        self.boss = boss
        self.monitor = CountingMonitor(
            PostgresTransport(boss),
            IngestStore(boss.db),
            [(READINGS.name, "shoal")],
            interval=INTERVAL,
        )
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] = asyncio.create_task(self.monitor.run(self.stop))

    async def die(self) -> None:
        """As a killed process: the loop ends mid-round, its connections close."""
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await self.boss.close()


@pytest.fixture
async def sides(db_url: str) -> AsyncIterator[list[Side]]:
    made: list[Side] = []
    for _ in range(2):
        db = await Database(db_url, max_size=3).open()
        made.append(Side(Shoal(db, listen=False)))
    try:
        yield made
    finally:
        for side in made:
            side.stop.set()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await side.task
            with contextlib.suppress(Exception):
                await side.boss.close()


def _leader(sides: list[Side]) -> Any:
    leaders = [s for s in sides if s.monitor.is_leader]
    return leaders[0] if len(leaders) == 1 else None


async def test_only_the_leader_samples_and_another_takes_over_when_it_goes(
    sides: list[Side],
) -> None:
    await wait_for(lambda: _leader(sides) is not None)
    leader = _leader(sides)
    follower = sides[1] if leader is sides[0] else sides[0]
    # Many rounds of the leader, each with its chance for the follower to try.
    await wait_for(lambda: leader.monitor.checks >= 5)
    assert not follower.monitor.is_leader
    assert follower.monitor.checks == 0

    await leader.die()
    await wait_for(lambda: follower.monitor.is_leader and follower.monitor.checks >= 2)
