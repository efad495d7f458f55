"""The statements of queue limits: declaring them, reading their state, keeping their buckets.

The limited claim itself is a job statement (:meth:`JobStore.claim_limited
<shoal.queue.store.JobStore.claim_limited>`); :mod:`shoal.queue.limits` says
what a limit is.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta

from shoal.db.pool import AsyncConn
from shoal.queue.limits import Limits, LimitState, Rate
from shoal.queue.statements import Statements

# How long declaring limits waits for the transactions that were running when
# it committed (an insert among them may have missed the declaration), and
# how often it looks. Past the wait, the next declaration (a worker's start)
# stamps what is left.
STAMP_WAIT = timedelta(seconds=5)
STAMP_POLL_S = 0.05


class LimitStore(Statements):
    """Typed access to the limits of one schema's queues, and their partitions' buckets."""

    async def declare_limits(self, queue: str, limits: Limits, *, now: datetime | None) -> None:
        """Create or replace ``queue``'s limits, and give its unfinished jobs their partition keys.

        An insert that read ``queue_limit`` before this commit writes its jobs
        without a key, which the limited claim never sees: so after the
        commit this waits (at most ``STAMP_WAIT``) for the transactions
        running then to end, and stamps again.
        """
        rate = limits.rate
        params = {
            "queue": queue,
            "concurrency": limits.global_concurrency,
            "rate_count": None if rate is None else rate.count,
            "rate_period_s": None if rate is None else rate.per.total_seconds(),
            "rate_burst": None if rate is None else rate.bucket,
            "partition_field": limits.partition_field,
            "partition_by": limits.partition_description,
            "now": now,
        }
        declare, stamp = self.sql["declare_limits"], self.sql["stamp_partitions"]

        async def run(c: AsyncConn) -> list[str]:
            await c.execute(declare, params)
            await c.execute(stamp, {"queue": queue})
            cur = await c.execute(self.sql["other_transactions"])
            row = await cur.fetchone()
            return list(row[0] or []) if row else []

        running = await self.db.run(run)
        # Real time, not the injectable clock: this waits for other sessions'
        # transactions to end, which no test clock moves.
        deadline = time.monotonic() + STAMP_WAIT.total_seconds()
        while running and time.monotonic() < deadline:
            (count,) = (await self._rows("transactions_running", {"vxids": running}))[0]
            if not count:
                break
            await asyncio.sleep(STAMP_POLL_S)
        await self._rows("stamp_partitions", {"queue": queue})

    async def prune_buckets(self, *, limit: int, now: datetime | None) -> int:
        """Delete partition state a missing row would say as well (full, unpaused buckets)."""
        return await self._rowcount("prune_buckets", {"limit": limit, "now": now})

    async def stamp_unkeyed(self) -> int:
        """Give unfinished jobs of limited queues that have no partition key theirs."""
        return await self._rowcount("stamp_unkeyed")

    async def clear_limits(self, queue: str) -> bool:
        return bool(await self._rows("clear_limits", {"queue": queue}))

    async def is_limited(self, queue: str) -> bool:
        return bool((await self._rows("is_limited", {"queue": queue}))[0][0])

    async def limit_states(
        self, queue: str | None, *, limit: int, now: datetime | None
    ) -> list[LimitState]:
        rows = await self._rows("limit_states", {"queue": queue, "limit": limit, "now": now})
        return [
            LimitState(
                queue=r[0],
                partition_key=r[1],
                global_concurrency=r[2],
                rate=None if r[3] is None else Rate(r[3], timedelta(seconds=r[4]), r[5]),
                partition_by=r[6],
                running=r[7],
                waiting=r[8],
                tokens=r[9],
                paused_until=r[10],
            )
            for r in rows
        ]


__all__ = ["STAMP_POLL_S", "STAMP_WAIT", "LimitStore"]
