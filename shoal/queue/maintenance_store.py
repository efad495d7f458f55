"""The statements of maintenance: rescuing jobs of dead leases and silent processes,
archiving finished jobs, pruning the archive.

:mod:`shoal.queue.maintenance` runs them; a rescued job's failure is written by
the job statements (:meth:`JobStore.fail <shoal.queue.store.JobStore.fail>`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from shoal.db.pool import AsyncConn
from shoal.queue.rows import ExpiredLease, OrphanedJob, retry_policy
from shoal.queue.statements import Statements
from shoal.queue.states import JobId


class MaintenanceStore(Statements):
    """Typed access to what maintenance reads and moves in one schema."""

    async def lock_expired_leases(
        self, conn: AsyncConn, *, limit: int, now: datetime | None
    ) -> list[ExpiredLease]:
        rows = await self._rows("lock_expired_leases", {"limit": limit, "now": now}, conn)
        return [
            ExpiredLease(JobId(r[0]), r[1], retry_policy(r[2], r[3], r[4], r[5]), r[6], r[7])
            for r in rows
        ]

    async def silent_workers(
        self, *, heard_since: datetime | None, now: datetime | None
    ) -> tuple[datetime, list[str]]:
        """The database's time, and the registry ids of the processes silent for longer
        than their rescue_after since ``heard_since`` (None: none is, yet)."""
        ((at, ids),) = await self._rows("silent_workers", {"heard_since": heard_since, "now": now})
        return at, list(ids)

    async def lock_jobs_of_silent_workers(
        self,
        conn: AsyncConn,
        holders: Sequence[str],
        *,
        heard_since: datetime,
        limit: int,
        now: datetime | None,
    ) -> list[OrphanedJob]:
        """Lock (SKIP LOCKED) the active jobs ``holders`` claimed before they went silent."""
        rows = await self._rows(
            "lock_jobs_of_silent_workers",
            {"holders": list(holders), "heard_since": heard_since, "limit": limit, "now": now},
            conn,
        )
        return [
            OrphanedJob(JobId(r[0]), r[1], retry_policy(r[2], r[3], r[4], r[5]), r[6], *r[7:13])
            for r in rows
        ]

    async def count_rescued(
        self, conn: AsyncConn, counts: Mapping[str, int], *, now: datetime | None
    ) -> None:
        """Add the jobs just handed back to each silent process's registry row."""
        await conn.execute(
            self.sql["count_rescued"],
            {"ids": list(counts), "counts": list(counts.values()), "now": now},
        )

    async def archive_finished(
        self, *, retention: timedelta, limit: int, now: datetime | None
    ) -> int:
        params = {"retention_s": retention.total_seconds(), "limit": limit, "now": now}
        return await self._rowcount("archive_finished", params)

    async def prune_archive(self, *, retention: timedelta, limit: int, now: datetime | None) -> int:
        params = {"retention_s": retention.total_seconds(), "limit": limit, "now": now}
        return await self._rowcount("prune_archive", params)


__all__ = ["MaintenanceStore"]
