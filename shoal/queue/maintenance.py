"""Maintenance: rescue jobs whose lease expired, archive finished jobs, prune the archive
and the state of limited partitions that need none.

Every worker process runs it; passes in different processes never judge the
same job twice (rows are locked with SKIP LOCKED, and each write is fenced by
the attempt and by the lease still being past due).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from shoal.clock import Clock
from shoal.db.pool import AsyncConn
from shoal.errors import TransientError
from shoal.queue.job import event_entry
from shoal.queue.retry import Jitter, after_failure
from shoal.queue.states import JobState
from shoal.queue.store import Failure, JobStore

log = logging.getLogger("shoal.maintenance")

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


class Maintenance:
    def __init__(
        self,
        store: JobStore,
        *,
        clock: Clock,
        jitter: Jitter,
        interval: timedelta = DEFAULT_INTERVAL,
        archive_after: timedelta = DEFAULT_ARCHIVE_AFTER,
        delete_after: timedelta = DEFAULT_DELETE_AFTER,
    ) -> None:
        self.store = store
        self.clock = clock
        self.jitter = jitter
        self.interval = interval
        self.archive_after = archive_after
        self.delete_after = delete_after
        self._passes = 0  # run_once calls so far

    async def expire_leases(self) -> tuple[int, int]:
        """Active jobs past their lease go to retry (attempts left) or failed."""
        now_sql = self.clock.sql_now()

        async def rescue(conn: AsyncConn) -> tuple[int, int]:
            expired = await self.store.lock_expired_leases(conn, limit=BATCH_LIMIT, now=now_sql)
            if not expired:
                return 0, 0
            now = self.clock.now()
            failures = []
            for lease in expired:
                step = after_failure(lease.attempt, lease.policy, now, self.jitter)
                failures.append(
                    Failure(
                        lease.id,
                        lease.attempt,
                        step.state,
                        None if step.start_after is None else step.start_after - now,
                        event_entry(
                            lease.attempt,
                            "LeaseExpired",
                            "lease expired: the worker died, or ran past expire_in "
                            "without a heartbeat; lease ended "
                            + lease.lease_expires_at.isoformat(),
                            now.isoformat(),
                        ),
                    )
                )
            states = await self.store.fail(failures, now=now_sql, expired_only=True, conn=conn)
            # Retries due now wake idle workers when this commits, as an insert
            # does: a worker waiting for its poll would otherwise wait it out.
            due = {f.id for f in failures if not f.retry_in}
            wake = sorted(
                {e.queue for e in expired if e.id in due and states.get(e.id) is JobState.RETRY}
            )
            if wake:
                await self.store.notify(conn, wake)
            retried = sum(1 for s in states.values() if s is JobState.RETRY)
            return retried, len(states) - retried

        return await self.store.db.run(rescue)

    async def run_once(self) -> MaintenanceReport:
        retried, failed = await self.expire_leases()
        now_sql = self.clock.sql_now()
        archived = await self.store.archive_finished(
            retention=self.archive_after, limit=BATCH_LIMIT, now=now_sql
        )
        pruned = await self.store.prune_archive(
            retention=self.delete_after, limit=BATCH_LIMIT, now=now_sql
        )
        buckets = await self.store.prune_buckets(limit=BATCH_LIMIT, now=now_sql)
        stamped = 0
        if self._passes % STAMP_EVERY_PASSES == 0:
            stamped = await self.store.stamp_unkeyed()
        self._passes += 1
        if retried or failed:
            log.warning("expired leases: %d jobs back to retry, %d failed", retried, failed)
        return MaintenanceReport(retried, failed, archived, pruned, buckets, stamped)

    async def run(self) -> None:
        while True:
            try:
                await self.run_once()
            except TransientError as exc:
                log.warning("maintenance pass failed: %s", exc)
            except Exception:  # loop boundary: maintenance must keep running
                log.exception("maintenance pass failed")
            await self.clock.sleep(self.interval.total_seconds())
