"""The console's queues, jobs and schedules: list and control them.

What ``shoal api``'s console routes and the ``shoal jobs``/``job``/``schedule``
commands call. Every name given is checked first: an unknown queue, job or
schedule is :class:`~shoal.errors.NotFound` naming the field (and, for a
name, listing the known ones), and nothing is written.

The lists leave out shoal's own queues and schedules (names starting with
``shoal.``, :func:`~shoal.internal.is_internal`) unless called with
``internal=True``; a job asked for by id, a search, and a queue named
explicitly show them still.

>>> inspector = QueueInspector(boss)                       # doctest: +SKIP
>>> page = await inspector.jobs(queue="email", state="failed", limit=50)  # doctest: +SKIP
>>> await inspector.retry_job(page.jobs[0].id)             # doctest: +SKIP
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from shoal.console.store import ConsoleStore
from shoal.db.pool import AsyncConn
from shoal.errors import Conflict, InvalidInput, NotFound
from shoal.internal import INTERNAL_PREFIX, is_internal
from shoal.queue.client import Shoal
from shoal.queue.cron import next_tick
from shoal.queue.options import check_queue_name
from shoal.queue.rows import JobRecord
from shoal.queue.states import JobId, JobState

# The jobs list shows failed jobs first: they are what an operator looks for.
FAILED_FIRST = (JobState.FAILED,)
OTHER_STATES = tuple(s for s in JobState if s is not JobState.FAILED)
MAX_PAGE = 500
DEFAULT_PAGE = 50
# "Throughput" of a queue: jobs finished over this many recent seconds.
THROUGHPUT_WINDOW_S = 300
# A cursor: the part of the list (0 failed, 1 the rest) and the last id shown.
_CURSOR = re.compile(r"([01])\.([1-9][0-9]{0,18})")
# Most known names an error lists.
SHOWN_NAMES = 30
# Up to this many jobs in the table (the planner's count), the queues list
# counts every state exactly: a full read of the table, about 250 ms at
# 1,000,000 jobs on the 2-core bench machine and 25 ms at 100,000.
EXACT_COUNT_LIMIT = 200_000
ESTIMATED_STATES = ("completed", "cancelled")


@dataclass(frozen=True, slots=True)
class QueueSummary:
    queue: str
    counts: dict[str, int]
    oldest_waiting_s: float | None
    paused: bool
    paused_at: datetime | None
    completed_5m: int
    failed_5m: int
    # States whose counts are the planner's estimates, not counts (a big table).
    estimated: tuple[str, ...] = ()

    @property
    def throughput_per_min(self) -> float:
        """Jobs completed per minute over the last five minutes."""
        return self.completed_5m * 60 / THROUGHPUT_WINDOW_S


@dataclass(frozen=True, slots=True)
class JobPage:
    jobs: list[JobRecord]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    name: str
    queue: str
    cron: str
    timezone: str
    data: Any
    last_tick: datetime
    next_tick: datetime | None  # None while paused
    created_at: datetime
    updated_at: datetime
    paused_at: datetime | None
    owner: str | None
    last_job_id: JobId | None
    last_job_state: JobState | None


def known_list(kind: str, names: Sequence[str]) -> str:
    """``known queues: a, b`` (or ``there are no queues``), for an error message."""
    if not names:
        return f"there are no {kind}s"
    shown = ", ".join(names[:SHOWN_NAMES])
    more = f" and {len(names) - SHOWN_NAMES} more" if len(names) > SHOWN_NAMES else ""
    return f"known {kind}s: {shown}{more}"


def parse_cursor(cursor: str) -> tuple[int, JobId]:
    """A cursor of :meth:`QueueInspector.jobs`, or InvalidInput naming ``cursor``."""
    match = _CURSOR.fullmatch(cursor)
    if match is None:
        raise InvalidInput("cursor", f"{cursor!r:.80} is not a cursor this list returned")
    return int(match[1]), JobId(int(match[2]))


def parse_state(state: str | JobState | None) -> JobState | None:
    if state is None or isinstance(state, JobState):
        return state
    try:
        return JobState(state)
    except ValueError:
        known = ", ".join(s.value for s in JobState)
        raise InvalidInput("state", f"{state!r:.80} is not a job state ({known})") from None


class QueueInspector:
    """Console reads and controls over one client's database."""

    def __init__(self, boss: Shoal) -> None:
        self.boss = boss
        self.store = boss.store
        self.clock = boss.clock
        self.console = ConsoleStore(boss.db)
        # Past this many jobs in the table, the queues list estimates its
        # completed and cancelled counts (see queues()). Set by tests.
        self.exact_count_limit = EXACT_COUNT_LIMIT

    # -- queues ------------------------------------------------------------

    async def queue_names(self) -> list[str]:
        return await self.console.queue_names(now=self.clock.sql_now())

    async def require_queue(self, queue: str, field: str = "queue") -> str:
        """``queue`` if there is any trace of it (jobs, a pause, a schedule, a worker).

        A name that no queue could have (a NUL byte, a space) is refused by its
        syntax first, with InvalidInput naming ``field``: it never reaches SQL.
        """
        check_queue_name(queue, field=field)
        if not await self.console.queue_known(queue):
            known = known_list("queue", await self.queue_names())
            raise NotFound(f"no queue {queue!r:.130}; {known}", field=field)
        return queue

    async def queues(self, *, internal: bool = False) -> list[QueueSummary]:
        """Every queue (shoal's own too when ``internal``): jobs per state, oldest
        wait, pause, recent throughput.

        Up to ``exact_count_limit`` jobs in the table (by the planner's
        count), every state is counted exactly. Past it, the unfinished and
        failed states still are, each from an index of its own, but completed
        and cancelled jobs (most of a big table, and with no index by queue)
        are the planner's estimates, named in ``QueueSummary.estimated``, and
        the oldest wait is that of the queue's next job in claim order.
        """
        now = self.clock.sql_now()
        if await self.console.job_rows_estimate() > self.exact_count_limit:
            found = await self._estimated_queues(now)
        else:
            found = await self._counted_queues(now)
        return [q for q in found if internal or not is_internal(q.queue)]

    async def _counted_queues(self, now: datetime | None) -> list[QueueSummary]:
        stats = await self.store.queue_stats(now=now)
        paused = await self.console.queue_paused_at()
        recent = await self.console.queue_finished_since(since_s=THROUGHPUT_WINDOW_S, now=now)
        # Queues with no jobs yet still show: scheduled into, served by a worker.
        known = await self.queue_names()
        names = sorted({row.queue for row in stats} | paused.keys() | recent.keys() | set(known))
        counts: dict[str, dict[str, int]] = {n: {s.value: 0 for s in JobState} for n in names}
        oldest: dict[str, float] = {}
        for row in stats:
            counts[row.queue][row.state.value] += row.count
            if row.oldest_waiting is not None:
                age = row.oldest_waiting.total_seconds()
                oldest[row.queue] = max(oldest.get(row.queue, 0.0), age)
        return [
            QueueSummary(
                queue=name,
                counts=counts[name],
                oldest_waiting_s=oldest.get(name),
                paused=name in paused,
                paused_at=paused.get(name),
                completed_5m=recent.get(name, (0, 0))[0],
                failed_5m=recent.get(name, (0, 0))[1],
            )
            for name in names
        ]

    async def failed_total(self, *, internal: bool = False) -> int:
        """Failed jobs of every queue (what :meth:`queues` sums, for a fraction of its work)."""
        return await self.console.failed_total(hide_prefix=None if internal else INTERNAL_PREFIX)

    async def paused_queues(self, *, internal: bool = False) -> list[str]:
        """The paused queues (shoal's own too when ``internal``)."""
        paused = await self.boss.paused_queues()
        return [q for q in paused if internal or not is_internal(q)]

    async def _estimated_queues(self, now: datetime | None) -> list[QueueSummary]:
        counts: dict[str, dict[str, int]] = {}
        oldest: dict[str, float] = {}

        def of(queue: str) -> dict[str, int]:
            return counts.setdefault(queue, {s.value: 0 for s in JobState})

        indexed = await self.console.queue_counts_indexed(now=now)
        for queue, created, retry, active, failed, wait in indexed:
            of(queue).update(created=created, retry=retry, active=active, failed=failed)
            if wait is not None:
                oldest[queue] = wait.total_seconds()
        finished = await self.console.finished_estimates()
        for queue, state, n in finished:
            of(queue)[state] = n
        paused = await self.console.queue_paused_at()
        recent = await self.console.queue_finished_since(since_s=THROUGHPUT_WINDOW_S, now=now)
        names = sorted(
            counts.keys() | paused.keys() | recent.keys() | set(await self.queue_names())
        )
        return [
            QueueSummary(
                queue=name,
                counts=of(name),
                oldest_waiting_s=oldest.get(name),
                paused=name in paused,
                paused_at=paused.get(name),
                completed_5m=recent.get(name, (0, 0))[0],
                failed_5m=recent.get(name, (0, 0))[1],
                estimated=ESTIMATED_STATES,
            )
            for name in names
        ]

    async def pause_queue(self, queue: str) -> None:
        await self.boss.pause_queue(await self.require_queue(queue, "name"))

    async def resume_queue(self, queue: str) -> None:
        await self.boss.resume_queue(await self.require_queue(queue, "name"))

    async def retry_failed(self, queue: str) -> int:
        """Every failed job of ``queue`` to run again now; how many."""
        await self.require_queue(queue, "name")
        now = self.clock.sql_now()

        async def run(c: AsyncConn) -> int:
            count = await self.console.retry_failed(c, queue, now=now)
            if count:
                await self.store.notify(c, [queue])
            return count

        return await self.boss.db.run(run)

    async def delete_failed(self, queue: str) -> int:
        """Delete every failed job of ``queue``; how many."""
        await self.require_queue(queue, "name")
        return await self.console.delete_failed(queue)

    # -- jobs ----------------------------------------------------------------

    async def jobs(
        self,
        *,
        queue: str | None = None,
        state: str | JobState | None = None,
        limit: int = DEFAULT_PAGE,
        cursor: str | None = None,
        q: str | None = None,
        internal: bool = False,
    ) -> JobPage:
        """A page of jobs: failed first, then the rest, newest first within each.

        ``q`` finds a job by id or by singleton key. ``next_cursor`` continues
        the list (None at its end). Jobs of shoal's own queues are left out
        unless ``internal``, ``queue`` names one, or ``q`` searches.
        """
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidInput("limit", f"must be 1 to {MAX_PAGE}, got {limit}")
        wanted = parse_state(state)
        part, before = (0, None) if cursor is None else parse_cursor(cursor)
        if queue is not None:
            await self.require_queue(queue)
        search = None if q is None or not q.strip() else q.strip()
        # isdigit alone also accepts '²' and other digits int() refuses.
        is_id = search is not None and search.isascii() and search.isdigit()
        search_id = int(search) if is_id and search is not None else None
        if search_id is not None and search_id >= 2**63:
            search_id = None
        hide = None if internal or queue is not None else INTERNAL_PREFIX
        parts = [FAILED_FIRST, OTHER_STATES] if wanted is None else [(wanted,)]
        if part >= len(parts):
            raise InvalidInput("cursor", f"{cursor!r:.80} is not a cursor this list returned")
        found: list[tuple[int, JobRecord]] = []
        for index in range(part, len(parts)):
            below = before if index == part else None
            wanted_rows = limit + 1 - len(found)
            if search is not None:
                records = await self.console.search_jobs(
                    search=search,
                    search_id=search_id,
                    states=parts[index],
                    queue=queue,
                    before_id=below,
                    limit=wanted_rows,
                )
            elif parts[index] == FAILED_FIRST:
                records = await self.console.list_failed_jobs(
                    queue=queue, before_id=below, limit=wanted_rows, hide_prefix=hide
                )
            else:
                records = await self.store.list_jobs(
                    queue,
                    states=parts[index],
                    before_id=below,
                    limit=wanted_rows,
                    hide_prefix=hide,
                )
            found.extend((index, record) for record in records)
            if len(found) > limit:
                break
        if len(found) <= limit:
            return JobPage([record for _, record in found], None)
        last_part, last = found[limit - 1]
        return JobPage([record for _, record in found[:limit]], f"{last_part}.{last.id}")

    async def job(self, job_id: int) -> JobRecord:
        record = await self.store.get_job(JobId(job_id))
        if record is None:
            raise NotFound(f"job {job_id} does not exist", field="job_id")
        return record

    async def queue_paused_at(self, queue: str) -> datetime | None:
        """When ``queue`` was paused; None while it is not."""
        return (await self.console.queue_paused_at()).get(queue)

    async def retry_job(self, job_id: int) -> JobRecord:
        """A failed or cancelled job to run again now."""
        record = await self.job(job_id)
        now = self.clock.sql_now()

        async def run(c: AsyncConn) -> bool:
            retried = await self.console.retry_job(c, job_id, now=now)
            if retried:
                await self.store.notify(c, [record.queue])
            return retried

        if not await self.boss.db.run(run):
            current = await self.job(job_id)
            if current.state in (JobState.FAILED, JobState.CANCELLED):
                raise Conflict(
                    f"job {job_id}: another unfinished job of queue {current.queue!r} holds "
                    f"its singleton key {current.singleton_key!r}",
                    field="job_id",
                )
            raise Conflict(
                f"job {job_id} is {current.state.value}; only failed or cancelled jobs can be "
                "retried",
                field="job_id",
            )
        return await self.job(job_id)

    async def cancel_job(self, job_id: int, *, by: str) -> JobRecord:
        """A waiting or running job cancelled, noting ``by``; a running one's handler is stopped."""
        await self.job(job_id)
        if not await self.boss.cancel(JobId(job_id), by=by):
            current = await self.job(job_id)
            raise Conflict(
                f"job {job_id} is {current.state.value}; only waiting or active jobs can be "
                "cancelled",
                field="job_id",
            )
        return await self.job(job_id)

    async def delete_job(self, job_id: int) -> None:
        """Delete a job that is not running (live or archived)."""
        record = await self.job(job_id)
        if record.state is JobState.ACTIVE:
            raise Conflict(f"job {job_id} is active; cancel it before deleting it", field="job_id")
        if not await self.console.delete_job(job_id):
            current = await self.job(job_id)
            raise Conflict(f"job {job_id} is {current.state.value}; not deleted", field="job_id")

    # -- schedules -------------------------------------------------------------

    async def schedules(self, *, internal: bool = False) -> list[ScheduleInfo]:
        """Every schedule but shoal's own (by its name or its queue's), unless ``internal``."""
        rows = [
            r
            for r in await self.boss.schedule_store.list_schedules(now=self.clock.sql_now())
            if internal or not (is_internal(r.name) or is_internal(r.queue))
        ]
        return [
            ScheduleInfo(
                name=r.name,
                queue=r.queue,
                cron=r.cron,
                timezone=r.timezone,
                data=r.data,
                last_tick=r.last_tick,
                next_tick=next_tick(r.cron, ZoneInfo(r.timezone), r.db_now) if r.ticks else None,
                created_at=r.created_at,
                updated_at=r.updated_at,
                paused_at=r.paused_at,
                owner=r.owner,
                last_job_id=r.last_job_id,
                last_job_state=r.last_job_state,
            )
            for r in rows
        ]

    async def _require_schedule(self, name: str, found: bool) -> None:
        if not found:
            names = await self.console.schedule_names()
            raise NotFound(
                f"no schedule {name!r:.130}; {known_list('schedule', names)}", field="name"
            )

    async def pause_schedule(self, name: str) -> None:
        """Stop ``name`` ticking in every process (it stays paused across restarts)."""
        found = await self.console.pause_schedule(name, now=self.clock.sql_now())
        await self._require_schedule(name, found)

    async def resume_schedule(self, name: str) -> None:
        """Tick again from the next tick after now (missed ticks are not sent)."""
        found = await self.console.resume_schedule(name, now=self.clock.sql_now())
        await self._require_schedule(name, found)

    async def remove_schedule(self, name: str) -> None:
        if not await self.boss.unschedule(name):
            await self._require_schedule(name, False)


__all__ = [
    "JobPage",
    "QueueInspector",
    "QueueSummary",
    "ScheduleInfo",
    "known_list",
    "parse_cursor",
    "parse_state",
]
