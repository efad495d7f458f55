"""Cron schedules with a seconds field, driven by a fake clock."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from shoal import FakeClock, JobState, Shoal
from shoal.queue.cron import latest_tick, next_tick


def test_six_field_expressions_tick_on_seconds() -> None:
    from zoneinfo import ZoneInfo

    utc = ZoneInfo("UTC")
    now = datetime(2026, 1, 1, 12, 0, 25, tzinfo=UTC)
    assert latest_tick("*/10 * * * * *", utc, now) == datetime(2026, 1, 1, 12, 0, 20, tzinfo=UTC)
    assert next_tick("*/10 * * * * *", utc, now) == datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)
    exact = datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)
    assert latest_tick("*/10 * * * * *", utc, exact) == exact


async def test_each_tick_is_enqueued_once_by_racing_schedulers(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    clock.advance(timedelta(seconds=0.5))
    await fake_boss.schedule("every_10s", "*/10 * * * * *", {"report": True}, queue="reports")
    schedulers = [fake_boss.scheduler() for _ in range(3)]
    for _ in range(6):
        clock.advance(timedelta(seconds=10))
        results = await asyncio.gather(*(s.run_once() for s in schedulers))
        assert sum(len(ticks) for ticks, _ in results) == 1
    jobs = await fake_boss.jobs("reports")
    assert len(jobs) == 6 and all(j.data == {"report": True} for j in jobs)


async def test_missed_ticks_are_enqueued_once_not_replayed(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    await fake_boss.schedule("minutely", "0 * * * * *", queue="reports")
    clock.advance(timedelta(hours=2))  # nothing ran for two hours
    ticks, sleep_s = await fake_boss.scheduler().run_once()
    assert len(ticks) == 1
    assert 0 < sleep_s <= 1.0
    assert len(await fake_boss.jobs("reports")) == 1


async def test_schedule_options_apply_to_each_tick_job(fake_boss: Shoal, clock: FakeClock) -> None:
    await fake_boss.schedule(
        "cleanup", "* * * * *", queue="maint", retry_limit=7, priority=5, tz="Europe/Paris"
    )
    clock.advance(timedelta(minutes=1))
    await fake_boss.scheduler().run_once()
    (job,) = await fake_boss.jobs("maint")
    assert (job.policy.retry_limit, job.priority, job.state) == (7, 5, JobState.CREATED)


async def test_unschedule_stops_ticks(fake_boss: Shoal, clock: FakeClock) -> None:
    await fake_boss.schedule("s", "* * * * * *", queue="q")
    assert await fake_boss.unschedule("s")
    clock.advance(timedelta(seconds=5))
    ticks, _ = await fake_boss.scheduler().run_once()
    assert ticks == []
    assert not await fake_boss.unschedule("s")
