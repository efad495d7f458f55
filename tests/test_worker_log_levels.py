"""A worker's routine ticks log at DEBUG; INFO is kept for what an operator wants to see.

One worker's log was 275 lines of "schedule shoal.batch.aggregate: enqueued
tick" out of 278: the batch aggregator's schedule ticked every second and each
tick was an INFO line. Ticks, maintenance and aggregator passes with nothing to
report now log nothing at INFO; creating a schedule (once per start) does.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from shoal import App, FakeClock, Shoal
from shoal.batch.item import Item
from shoal.db.pool import AsyncConn
from shoal.ingest.guard import newer_than_applied
from tests.ingest_helpers import create_schema

TICKS = 5
# An every-second schedule, as the batch aggregator's was.
SCHEDULE, CRON, QUEUE = "logs.every_second", "* * * * * *", "logs.tick"


def info_records(caplog: pytest.LogCaptureFixture, *, not_run: tuple[str, ...]) -> list[str]:
    """shoal's records at INFO and above, but those of the loggers ``not_run``.

    Every test shares the session's event loop (pyproject.toml), so a NATS
    connection or a consumer that another test left running logs into this
    test's capture. ``not_run`` names the loggers of code the test does not
    run: their records are not the test's.
    """
    return [
        f"{r.name}: {r.getMessage()}"
        for r in caplog.records
        if r.levelno >= logging.INFO
        and (r.name == "shoal" or r.name.startswith("shoal."))
        and not any(r.name == name or r.name.startswith(name + ".") for name in not_run)
    ]


async def test_ticks_of_a_every_second_schedule_log_nothing_at_info(
    fake_boss: Shoal, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    app = App()

    @app.batch("logs.kind")
    async def handle(item: Item) -> None:
        pass

    caplog.set_level(logging.DEBUG, logger="shoal")
    await fake_boss.schedule(SCHEDULE, CRON, queue=QUEUE)
    assert info_records(caplog, not_run=("shoal.ingest",)) == [
        f"shoal.cron: schedule {SCHEDULE}: {CRON!r} (UTC) sends to {QUEUE}"
    ]
    caplog.clear()

    scheduler = fake_boss.scheduler()
    maintenance = fake_boss.maintenance()
    aggregator = app.batches(fake_boss).aggregator
    enqueued = 0
    for _ in range(TICKS):
        clock.advance(timedelta(seconds=1))
        ticks, _ = await scheduler.run_once()
        enqueued += len(ticks)
        await maintenance.run_once()
        await aggregator.run_once()

    assert enqueued == TICKS
    assert info_records(caplog, not_run=("shoal.ingest",)) == []
    tick_lines = [r for r in caplog.records if "enqueued tick" in r.getMessage()]
    assert len(tick_lines) == TICKS
    assert {r.levelno for r in tick_lines} == {logging.DEBUG}


async def test_an_older_observation_is_ignored_without_an_info_line(
    boss: Shoal, caplog: pytest.LogCaptureFixture
) -> None:
    await create_schema(boss.db)
    observed = datetime(2026, 1, 1, tzinfo=UTC)

    async def guard(conn: AsyncConn, at: datetime) -> bool:
        return await newer_than_applied(
            conn,
            table="card",
            key_column="id",
            key=1,
            applied_column="status_observed_at",
            observed_at=at,
        )

    async def apply(conn: AsyncConn) -> None:
        await conn.execute("UPDATE card SET status_observed_at = %s WHERE id = 1", (observed,))

    await boss.db.run(apply)
    caplog.set_level(logging.DEBUG, logger="shoal")
    for _ in range(3):
        assert await boss.db.run(lambda conn: guard(conn, observed - timedelta(seconds=1))) is False
    assert info_records(caplog, not_run=("shoal.ingest.nats",)) == []
    assert len([r for r in caplog.records if "not newer" in r.getMessage()]) == 3
