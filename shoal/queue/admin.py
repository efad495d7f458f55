"""Inspection and administration of a queue client: control, limits, schedules, maintenance.

:class:`QueueAdmin` is the half of :class:`~shoal.queue.client.Shoal` that
reads and changes jobs, queues, limits and schedules already there; the other
half (:mod:`shoal.queue.client`) connects, sends jobs and runs workers. The
methods are documented and called as ``Shoal``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Unpack

from shoal.clock import Clock
from shoal.db.pool import AsyncConn, Database
from shoal.errors import InvalidInput, NotFound
from shoal.queue.cron import Scheduler, check_cron, check_timezone
from shoal.queue.enqueue import JobBuilder
from shoal.queue.limit_store import LimitStore
from shoal.queue.limits import Limits, LimitState, Partitioner, Rate, check_queue_limits
from shoal.queue.maintenance import Maintenance, MaintenanceReport
from shoal.queue.maintenance_store import MaintenanceStore
from shoal.queue.notifier import Notifier
from shoal.queue.options import SendOptions, check_queue_name, encode_payload, parse_options
from shoal.queue.retry import Jitter
from shoal.queue.rows import JobRecord, NewJob, QueueStateCount, ScheduleRow
from shoal.queue.schedule_store import ScheduleStore
from shoal.queue.states import JobId, JobState
from shoal.queue.store import DEFAULT_CANCELLED_BY, JobStore

log = logging.getLogger("shoal.cron")


class QueueAdmin:
    """Reads and controls of one schema's jobs, queues, limits and schedules (``Shoal``'s)."""

    # Set by Shoal.__init__.
    db: Database
    store: JobStore
    limit_store: LimitStore
    schedule_store: ScheduleStore
    builder: JobBuilder
    clock: Clock
    jitter: Jitter
    notifier: Notifier | None
    max_payload_bytes: int
    _maintenance: Maintenance | None

    # -- control -----------------------------------------------------------

    async def cancel(
        self,
        ids: JobId | Sequence[JobId],
        *,
        by: str = DEFAULT_CANCELLED_BY,
        conn: AsyncConn | None = None,
    ) -> set[JobId]:
        """Cancel waiting or active jobs; returns those that were cancelled now.

        Each job's history notes ``by`` (who cancelled it) and when. The
        worker holding an active job is told in the same transaction and
        stops its handler (docs/queue.md, "Cancelling a job")::

            await boss.cancel(job_id, by="ops: duplicate order")

        With ``conn``, in the caller's open transaction (the holders are told
        when it commits).
        """
        return await self.store.cancel(_ids(ids), by=by, now=self.clock.sql_now(), conn=conn)

    async def resume(self, ids: JobId | Sequence[JobId]) -> set[JobId]:
        """Put cancelled jobs back to wait."""
        return await self.store.resume(_ids(ids), now=self.clock.sql_now())

    async def retry(self, ids: JobId | Sequence[JobId]) -> set[JobId]:
        """Run failed jobs again now; their error history stays."""
        return await self.store.retry(_ids(ids), now=self.clock.sql_now())

    async def redrive(self, dead_letter_queue: str, *, limit: int = 10_000) -> dict[JobId, JobId]:
        """Send waiting dead-letter jobs back to their queues: {dead-letter id: new id}."""
        check_queue_name(dead_letter_queue)
        return await self.store.redrive(dead_letter_queue, limit=limit, now=self.clock.sql_now())

    async def pause_queue(self, queue: str) -> None:
        """Stop every process from claiming from ``queue`` (running jobs finish)."""
        await self.store.pause_queue(check_queue_name(queue), now=self.clock.sql_now())

    async def resume_queue(self, queue: str) -> None:
        await self.store.resume_queue(check_queue_name(queue))
        if self.notifier is not None:
            self.notifier.wake(queue)

    # -- limits ------------------------------------------------------------

    async def declare_limits(
        self,
        queue: str,
        *,
        global_concurrency: int | None = None,
        rate_limit: Rate | None = None,
        partition_by: str | Partitioner | None = None,
    ) -> None:
        """Set ``queue``'s limits for every process (what ``work(..., limits)`` does at start).

        ``global_concurrency``: at most this many active jobs per partition.
        ``rate_limit``: a :class:`Rate` of starts per partition.
        ``partition_by``: a field of the job data, or a function of the data
        (then this client computes the key of each job it sends to ``queue``;
        other senders must declare the same function, or send
        ``partition_key=``). Replaces what was declared before. Jobs waiting
        without a partition key get theirs now.

        >>> await boss.declare_limits("poll", global_concurrency=20,   # doctest: +SKIP
        ...                           partition_by="account_id")
        """
        check_queue_name(queue)
        limits = Limits.of(
            global_concurrency=global_concurrency, rate_limit=rate_limit, partition_by=partition_by
        )
        if not limits:
            raise InvalidInput(
                "limits", "declare at least one of global_concurrency, rate_limit, partition_by"
            )
        check_queue_limits(queue, limits)
        self._register_partitioner(queue, limits)
        await self.limit_store.declare_limits(queue, limits, now=self.clock.sql_now())

    def _register_partitioner(self, queue: str, limits: Limits) -> None:
        by = limits.partition_by
        if by is not None and not isinstance(by, str):
            self.builder.partitioners[queue] = by
        else:
            self.builder.partitioners.pop(queue, None)

    async def clear_limits(self, queue: str) -> bool:
        """Remove ``queue``'s limits; False if it had none. Workers started with limits
        declare them again when they start."""
        self.builder.partitioners.pop(check_queue_name(queue), None)
        return await self.limit_store.clear_limits(queue)

    async def limits(self, queue: str | None = None, *, limit: int = 1000) -> list[LimitState]:
        """Each limited queue's partitions now: running against the limit, tokens, pauses.

        Partitions with active or waiting jobs or a bucket row, busiest first,
        at most ``limit`` rows in all.
        """
        if queue is not None:
            check_queue_name(queue)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidInput("limit", f"must be an integer >= 1, got {limit!r}")
        return await self.limit_store.limit_states(queue, limit=limit, now=self.clock.sql_now())

    # -- inspection --------------------------------------------------------

    async def get_job(self, job_id: JobId) -> JobRecord:
        record = await self.store.get_job(job_id)
        if record is None:
            raise NotFound(f"job {job_id} does not exist")
        return record

    async def jobs(
        self,
        queue: str,
        *,
        state: JobState | str | None = None,
        before_id: JobId | None = None,
        limit: int = 100,
    ) -> list[JobRecord]:
        check_queue_name(queue)
        try:
            parsed = None if state is None else JobState(state)
        except ValueError:
            raise InvalidInput("state", f"{state!r} is not a job state") from None
        states = tuple(JobState) if parsed is None else (parsed,)
        return await self.store.list_jobs(queue, states=states, before_id=before_id, limit=limit)

    async def stats(self) -> list[QueueStateCount]:
        """Jobs per queue and state, with the age of the oldest job waiting to run."""
        return await self.store.queue_stats(now=self.clock.sql_now())

    async def paused_queues(self) -> list[str]:
        return await self.store.paused_queues()

    # -- schedules -----------------------------------------------------------

    async def schedule(
        self,
        name: str,
        cron: str,
        data: Any = None,
        *,
        queue: str | None = None,
        tz: str = "UTC",
        **options: Unpack[SendOptions],
    ) -> None:
        """Create or replace a cron schedule (5 fields, or 6 with seconds first).

        Each tick sends one job to ``queue`` (default: ``name``), once across
        all processes running a scheduler.
        """
        check_queue_name(name, field="name")
        target = check_queue_name(queue or name)
        check_cron(cron)
        check_timezone(tz)
        parsed = parse_options(options)
        # Validate the job a tick will send now, not at the first tick.
        self.builder.job(target, data, parsed, "")
        encoded = {
            k: (v.total_seconds() if isinstance(v, timedelta) else v) for k, v in parsed.items()
        }
        if isinstance(parsed.get("start_after"), datetime):
            raise InvalidInput("start_after", "a schedule's jobs cannot start at a fixed time")
        await self.schedule_store.upsert_schedule(
            name=name,
            queue=target,
            cron=cron,
            timezone=tz,
            data=encode_payload(data, max_bytes=self.max_payload_bytes),
            options=encoded,
            now=self.clock.sql_now(),
        )
        # Once per call (a worker's start), unlike the DEBUG line of each tick.
        log.info("schedule %s: %r (%s) sends to %s", name, cron, tz, target)

    async def unschedule(self, name: str) -> bool:
        return await self.schedule_store.delete_schedule(name)

    async def schedules(self) -> list[ScheduleRow]:
        """The schedules that tick (a paused one is listed by the console only)."""
        rows = await self.schedule_store.list_schedules(now=self.clock.sql_now())
        return [row for row in rows if row.ticks]

    def scheduler(self) -> Scheduler:
        return Scheduler(
            self.store, self.schedule_store, clock=self.clock, build_job=self._tick_job
        )

    def _tick_job(self, row: ScheduleRow) -> NewJob:
        return self.builder.job(row.queue, row.data, row.options, "")

    def maintenance(self, **kwargs: Any) -> Maintenance:
        return Maintenance(
            self.store,
            MaintenanceStore(self.db, self.store.sql),
            self.limit_store,
            clock=self.clock,
            jitter=self.jitter,
            **kwargs,
        )

    async def maintain(self) -> MaintenanceReport:
        """One maintenance pass: hand back the jobs of silent processes, expire dead
        leases, archive, prune.

        The passes share one :class:`Maintenance`: a process's silence counts
        only from this client's first pass that reached the database, so the
        first call never hands back a silent process's jobs.
        """
        if self._maintenance is None:
            self._maintenance = self.maintenance()
        return await self._maintenance.run_once()


def _ids(ids: JobId | Sequence[JobId]) -> list[JobId]:
    return [ids] if isinstance(ids, int) else list(ids)
