"""Cron schedules, with an optional seconds field, each tick enqueued exactly once.

A schedule row holds ``last_tick``. Each pass reads the database clock, finds
the latest tick of each schedule at or before it, and moves ``last_tick`` to
that tick with a conditional update; only the process whose update wins
inserts the tick's job, in the same transaction. Ticks missed while nothing
ran are not replayed one by one: the latest missed tick is enqueued, once.

``shoal worker`` runs the scheduler in one process of the cluster, the leader
of :data:`CRON_DUTY` (shoal.db.leadership). The conditional update stays the
guarantee: however many schedulers run (a deposed leader that has not yet
noticed, ``Shoal.scheduler()`` called by hand), each tick is enqueued once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from shoal.clock import Clock
from shoal.db.pool import AsyncConn
from shoal.errors import InvalidInput, TransientError
from shoal.queue.rows import NewJob, ScheduleRow
from shoal.queue.schedule_store import ScheduleStore
from shoal.queue.store import JobStore

log = logging.getLogger("shoal.cron")

# The duty a worker process leads to run the scheduler (shoal.db.leadership).
CRON_DUTY = "queue.cron"

# The scheduler looks at least this often, so new schedules start promptly.
MAX_SLEEP_S = 1.0
# A tick is enqueued this long after its second begins: the processes' sleeps
# need not be exact.
TICK_SLACK_S = 0.005


def check_cron(expression: object, field: str = "cron") -> str:
    """A 5-field or 6-field (seconds first) cron expression, or InvalidInput."""
    if not isinstance(expression, str) or len(expression.split()) not in (5, 6):
        raise InvalidInput(field, f"{expression!r} is not a 5- or 6-field cron expression")
    if not croniter.is_valid(expression, second_at_beginning=True):
        raise InvalidInput(field, f"{expression!r} is not a valid cron expression")
    return expression


def check_timezone(name: object, field: str = "tz") -> ZoneInfo:
    try:
        return ZoneInfo(str(name))
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput(field, f"{name!r} is not a known time zone") from None


def latest_tick(expression: str, tz: ZoneInfo, now: datetime) -> datetime:
    """The latest tick of ``expression`` at or before ``now``."""
    # get_prev is strictly before its start; a microsecond past now makes a
    # tick that falls exactly on now count.
    it = croniter(
        expression, (now + timedelta(microseconds=1)).astimezone(tz), second_at_beginning=True
    )
    tick: datetime = it.get_prev(datetime)
    return tick


def next_tick(expression: str, tz: ZoneInfo, after: datetime) -> datetime:
    it = croniter(expression, after.astimezone(tz), second_at_beginning=True)
    tick: datetime = it.get_next(datetime)
    return tick


@dataclass(frozen=True, slots=True)
class Tick:
    schedule: str
    at: datetime


class Scheduler:
    def __init__(
        self,
        store: JobStore,
        schedules: ScheduleStore,
        *,
        clock: Clock,
        build_job: Callable[[ScheduleRow], NewJob],
    ) -> None:
        self.store = store
        self.schedules = schedules
        self.clock = clock
        self._build_job = build_job

    async def run_once(self) -> tuple[list[Tick], float]:
        """Enqueue every due tick; return them and the seconds until the next one."""
        schedules = await self.schedules.list_schedules(now=self.clock.sql_now())
        enqueued: list[Tick] = []
        sleep_s = MAX_SLEEP_S
        for row in schedules:
            if not row.ticks:
                continue
            tz = ZoneInfo(row.timezone)
            tick = latest_tick(row.cron, tz, row.db_now)
            if tick > row.last_tick and await self._enqueue(row, tick):
                enqueued.append(Tick(row.name, tick))
            upcoming = next_tick(row.cron, tz, row.db_now)
            sleep_s = min(sleep_s, (upcoming - row.db_now).total_seconds() + TICK_SLACK_S)
        return enqueued, max(sleep_s, 0.0)

    async def _enqueue(self, row: ScheduleRow, tick: datetime) -> bool:
        job = self._build_job(row)

        async def claim_tick(conn: AsyncConn) -> bool:
            if not await self.schedules.advance_schedule(conn, row.name, tick):
                return False
            ids = await self.store.insert([job], now=self.clock.sql_now(), conn=conn)
            # The console shows each schedule's latest job: the tick records it.
            await self.schedules.record_tick_job(conn, row.name, ids[0])
            return True

        won = await self.store.db.run(claim_tick)
        if won:
            # DEBUG: routine, and a schedule ticking every second would fill the log.
            log.debug("schedule %s: enqueued tick %s on %s", row.name, tick.isoformat(), row.queue)
        return won

    async def run(self) -> None:
        while True:
            try:
                _, sleep_s = await self.run_once()
            except TransientError as exc:
                log.warning("scheduler pass failed: %s", exc)
                sleep_s = MAX_SLEEP_S
            except Exception:  # loop boundary: the scheduler must keep running
                log.exception("scheduler pass failed")
                sleep_s = MAX_SLEEP_S
            await self.clock.sleep(sleep_s)
