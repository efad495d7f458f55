"""Makes e3c978a.sql: a database of the last released schema with work in flight.

Run with the shoal of commit e3c978a (0001-0003 applied), never with this
checkout's: README.md beside this file says how. The work it leaves is what a
rolling upgrade meets: the workers that held it are gone (this script exits
without finishing anything), so the jobs, items and messages they held must
be recovered by today's workers after ``migrate``.
"""
# mypy: ignore-errors
# (It is type-checked by nothing: it imports e3c978a's shoal, not this one.)

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime, timedelta

from shoal import FakeClock, Shoal
from shoal.batch.kinds import BatchKind
from shoal.batch.service import Batches
from shoal.db import Database, migrate
from shoal.ingest.message import new_envelope
from shoal.ingest.postgres import PostgresTransport

# Every timestamp in the dump is counted from here; the upgrade test's clock
# starts at the same instant.
START = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
JOBS = "upgrade.jobs"
KIND = "upgrade.items"
TOPIC = "upgrade.readings"


async def nothing(item: object) -> None:  # never called: no worker runs here
    raise AssertionError("no item runs while the fixture is made")


async def main(url: str) -> None:
    clock = FakeClock(START)
    async with Database(url) as db:
        assert await migrate(db) == [1, 2, 3]
        boss = Shoal(db, clock=clock, listen=False)
        # Queue: 10 jobs n=0..9. 0-2 stay waiting (created), 3-5 are claimed
        # by a worker that never finishes them (active), 6-7 fail once and
        # wait to be retried in a minute (retry).
        for n in range(10):
            await boss.send(JOBS, {"n": n}, retry_delay=60, expire_in=30)
        active = await boss.fetch(JOBS, 3)
        assert len(active) == 3
        failing = await boss.fetch(JOBS, 2)
        for job in failing:
            await boss.fail(job, "the worker of the previous release failed it")

        # Batch: one task of 8 items; a worker claims 3 (running, their
        # one-shot jobs taken) and dies; 5 stay pending with waiting jobs.
        kind = BatchKind(name=KIND, handler=nothing, zombie_timeout=timedelta(seconds=60))
        batches = Batches(boss, {KIND: kind})
        created = await batches.create(KIND, [f"item-{n}" for n in range(8)])
        assert created.created
        claimed = await batches.runners[KIND].claim(kind.queue, 3, now=clock.sql_now())
        assert len(claimed) == 3

        # Ingest (postgres transport): 6 messages; a consumer fetches 2 and
        # dies before acknowledging them (in flight), 4 wait.
        transport = PostgresTransport(boss)
        envelopes = [
            new_envelope({"reading": n}, published_at=clock.now(), id=f"m-{n}") for n in range(6)
        ]
        await transport.publish(TOPIC, envelopes)
        sub = await transport.subscribe(TOPIC, "upgrade", max_in_flight=10)
        assert len(await sub.fetch(2, wait=timedelta(0))) == 2
        await transport.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
