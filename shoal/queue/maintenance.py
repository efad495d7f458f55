"""Maintenance: rescue jobs whose lease expired or whose worker process went silent,
archive finished jobs, prune the archive and the state of limited partitions that need none.

A job records the process that claimed it (``holder``, the number of that
process's registry row, :mod:`shoal.queue.registry`). When a process's
registry heartbeat is older than its own ``rescue_after`` (it reports the
setting when it registers), its active jobs are handed back as a lease expiry
would (back to retry while attempts remain, else failed), with a
``WorkerGone`` note naming the process, without waiting for their lease
(``expire_in``, 15 minutes by default). A process that is alive heartbeats
every few seconds whatever its handlers do, so its jobs, however slow, are
never taken. Nor are the jobs of processes that only look silent because
the database was away: a pass counts a process's silence only from when this
process's passes began reaching the database without a failure in between,
so after an outage every process gets its ``rescue_after`` to heartbeat again.

``shoal worker`` runs it in one process of the cluster, the leader of
:data:`MAINTENANCE_DUTY` (shoal.db.leadership); each term starts a fresh
:class:`Maintenance`, so a new leader counts silence from its own first pass
(a process that died while leading has its jobs handed back one ``retry`` of
the elector later than ``rescue_after``). Passes that do race (a deposed
leader that has not yet noticed, ``Shoal.maintain()``) never judge the same
job twice: rows are locked with SKIP LOCKED, and each write is fenced by the
attempt and by the lease still being past due.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from shoal.clock import Clock
from shoal.db.pool import AsyncConn
from shoal.errors import TransientError
from shoal.queue.job import event_entry
from shoal.queue.limit_store import LimitStore
from shoal.queue.maintenance_store import MaintenanceStore
from shoal.queue.retry import Jitter, after_failure
from shoal.queue.rows import ExpiredLease, Failure, OrphanedJob
from shoal.queue.states import JobId, JobState
from shoal.queue.store import JobStore

log = logging.getLogger("shoal.maintenance")

# The duty a worker process leads to run maintenance (shoal.db.leadership).
MAINTENANCE_DUTY = "queue.maintenance"

DEFAULT_INTERVAL = timedelta(seconds=5)
# Finished jobs stay in the live table this long (inspectable, and singleton
# keys of finished jobs no longer block anything), then move to the archive.
DEFAULT_ARCHIVE_AFTER = timedelta(hours=12)
# Archived jobs are deleted after this long (pg-boss keeps 7 days too).
DEFAULT_DELETE_AFTER = timedelta(days=7)
# Rows handled per statement, so one pass never holds long locks.
BATCH_LIMIT = 5000
# Every this many passes (about a minute at the default interval), jobs of
# limited queues that arrived without a partition key get theirs: the
# statement reads every waiting job of those queues.
STAMP_EVERY_PASSES = 12


@dataclass(frozen=True, slots=True)
class MaintenanceReport:
    retried: int
    failed: int
    archived: int
    pruned: int
    # limit_bucket rows of partitions back to a full bucket and no pause
    buckets_pruned: int = 0
    # jobs of limited queues given the partition key they arrived without
    keys_stamped: int = 0
    # active jobs of processes whose heartbeat stopped, handed back
    # (back to retry or failed, as a lease expiry)
    rescued: int = 0


def gone_note(job: OrphanedJob) -> str:
    """The history note of a job handed back because its process went silent."""
    return (
        f"worker process gone: {job.host} pid {job.pid}"
        + (f" (app {job.app})" if job.app else "")
        + f", worker {job.holder}, held this job and stopped heartbeating; last heartbeat "
        f"{job.heartbeat_at.isoformat()}, handed back after its rescue_after of "
        f"{job.rescue_after_s:g}s"
    )


class Maintenance:
    def __init__(
        self,
        store: JobStore,
        upkeep: MaintenanceStore,
        limits: LimitStore,
        *,
        clock: Clock,
        jitter: Jitter,
        interval: timedelta = DEFAULT_INTERVAL,
        archive_after: timedelta = DEFAULT_ARCHIVE_AFTER,
        delete_after: timedelta = DEFAULT_DELETE_AFTER,
    ) -> None:
        self.store = store
        self.upkeep = upkeep
        self.limits = limits
        self.clock = clock
        self.jitter = jitter
        self.interval = interval
        self.archive_after = archive_after
        self.delete_after = delete_after
        self._passes = 0  # run_once calls so far
        # The database's time at the first of the passes that have reached it
        # since the last failed one (None: none has yet). Set and cleared by
        # run_once, read by rescue_silent_workers.
        self._reachable_since: datetime | None = None

    def _failure(self, job: ExpiredLease | OrphanedJob, kind: str, message: str) -> Failure:
        """The failed attempt of a job handed back by maintenance, with its history note."""
        now = self.clock.now()
        step = after_failure(job.attempt, job.policy, now, self.jitter)
        return Failure(
            job.id,
            job.attempt,
            step.state,
            None if step.start_after is None else step.start_after - now,
            event_entry(job.attempt, kind, message, now.isoformat()),
        )

    async def _hand_back(
        self,
        conn: AsyncConn,
        jobs: Sequence[ExpiredLease | OrphanedJob],
        failures: list[Failure],
        *,
        expired_only: bool,
    ) -> dict[JobId, JobState]:
        """Write the failures (fenced by attempt), waking the queues of retries due now."""
        now_sql = self.clock.sql_now()
        states = await self.store.fail(failures, now=now_sql, expired_only=expired_only, conn=conn)
        # Retries due now wake idle workers when this commits, as an insert
        # does: a worker waiting for its poll would otherwise wait it out.
        due = {f.id for f in failures if not f.retry_in}
        wake = sorted({j.queue for j in jobs if j.id in due and states.get(j.id) is JobState.RETRY})
        if wake:
            await self.store.notify(conn, wake)
        return states

    async def expire_leases(self) -> tuple[int, int]:
        """Active jobs past their lease go to retry (attempts left) or failed."""
        now_sql = self.clock.sql_now()

        async def rescue(conn: AsyncConn) -> tuple[int, int]:
            expired = await self.upkeep.lock_expired_leases(conn, limit=BATCH_LIMIT, now=now_sql)
            if not expired:
                return 0, 0
            failures = [
                self._failure(
                    lease,
                    "LeaseExpired",
                    "lease expired: the worker died, or ran past expire_in "
                    "without a heartbeat; lease ended " + lease.lease_expires_at.isoformat(),
                )
                for lease in expired
            ]
            states = await self._hand_back(conn, expired, failures, expired_only=True)
            retried = sum(1 for s in states.values() if s is JobState.RETRY)
            return retried, len(states) - retried

        return await self.store.db.run(rescue)

    async def rescue_silent_workers(self) -> int:
        """Hand back the active jobs of processes silent for longer than their rescue_after.

        Each goes to retry (attempts left) or failed, as a lease expiry does,
        fenced by its attempt: a late answer of the process that held it
        loses the fence and is refused. Returns the jobs handed back. Costs
        one read of the registry when no process is silent.

        Silence counts only from this maintenance's first pass of those that
        have reached the database since its last failed one: the first pass
        after a start or an outage hands back nothing.
        """
        now_sql = self.clock.sql_now()
        heard_since = self._reachable_since
        at, silent = await self.upkeep.silent_workers(heard_since=heard_since, now=now_sql)
        if heard_since is None:
            # This pass is the first to reach the database: silence is
            # counted from now on.
            self._reachable_since = at
            return 0
        if not silent:
            return 0
        since = heard_since

        async def rescue(conn: AsyncConn) -> int:
            orphans = await self.upkeep.lock_jobs_of_silent_workers(
                conn, silent, heard_since=since, limit=BATCH_LIMIT, now=now_sql
            )
            if not orphans:
                return 0
            failures = [self._failure(job, "WorkerGone", gone_note(job)) for job in orphans]
            states = await self._hand_back(conn, orphans, failures, expired_only=False)
            counts: dict[str, int] = {}
            for job in orphans:
                if job.id in states:
                    counts[job.holder] = counts.get(job.holder, 0) + 1
            if counts:
                await self.upkeep.count_rescued(conn, counts, now=now_sql)
            return len(states)

        rescued = await self.store.db.run(rescue)
        if rescued:
            log.warning(
                "handed back %d job(s) of %d worker process(es) whose heartbeat stopped",
                rescued,
                len(silent),
            )
        return rescued

    async def run_once(self) -> MaintenanceReport:
        try:
            return await self._pass()
        except BaseException:
            # Perhaps the database was away: the processes' heartbeats may
            # have failed too, so their silence is counted again from the
            # next pass that reaches it.
            self._reachable_since = None
            raise

    async def _pass(self) -> MaintenanceReport:
        rescued = await self.rescue_silent_workers()
        retried, failed = await self.expire_leases()
        now_sql = self.clock.sql_now()
        archived = await self.upkeep.archive_finished(
            retention=self.archive_after, limit=BATCH_LIMIT, now=now_sql
        )
        pruned = await self.upkeep.prune_archive(
            retention=self.delete_after, limit=BATCH_LIMIT, now=now_sql
        )
        buckets = await self.limits.prune_buckets(limit=BATCH_LIMIT, now=now_sql)
        stamped = 0
        if self._passes % STAMP_EVERY_PASSES == 0:
            stamped = await self.limits.stamp_unkeyed()
        self._passes += 1
        if retried or failed:
            log.warning("expired leases: %d jobs back to retry, %d failed", retried, failed)
        return MaintenanceReport(retried, failed, archived, pruned, buckets, stamped, rescued)

    async def run(self) -> None:
        while True:
            try:
                await self.run_once()
            except TransientError as exc:
                log.warning("maintenance pass failed: %s", exc)
            except Exception:  # loop boundary: maintenance must keep running
                log.exception("maintenance pass failed")
            await self.clock.sleep(self.interval.total_seconds())
