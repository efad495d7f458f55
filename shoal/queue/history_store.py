"""The statements of the history sampler (:mod:`shoal.queue.history`), in ``history.sql``."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from shoal.db.pool import AsyncConn, Database
from shoal.db.queries import load_queries
from shoal.internal import INTERNAL_PREFIX
from shoal.queue.statements import Statements


class HistoryStore(Statements):
    """Writes and prunes the history samples of one schema."""

    def __init__(self, db: Database) -> None:
        # One big statement and its companions, kept in a file of their own.
        super().__init__(db, load_queries("shoal.queue", db.schema, file="history.sql"))

    async def sample_history(
        self,
        *,
        retention_s: Mapping[int, int],
        finished_cap: int,
        depth_cap: int,
        gone_s: float,
        now: datetime | None,
    ) -> dict[int, int]:
        """One sample at each resolution of ``retention_s`` (seconds -> seconds
        kept) unless its slot has one, and the samples past retention pruned, in
        one transaction; rows written per resolution (history.sql, sample)."""

        async def run(conn: AsyncConn) -> dict[int, int]:
            await conn.execute(self.sql["plan_switches"])
            written = {}
            for resolution, keep_s in retention_s.items():
                cur = await conn.execute(
                    self.sql["sample"],
                    {
                        "now": now,
                        "resolution": resolution,
                        "finished_cap": finished_cap,
                        "depth_cap": depth_cap,
                        "gone_s": gone_s,
                        "internal_prefix": INTERNAL_PREFIX,
                    },
                )
                written[resolution] = cur.rowcount
                await conn.execute(
                    self.sql["prune_history"],
                    {"now": now, "resolution": resolution, "keep_s": keep_s},
                )
            return written

        return await self.db.run(run)


__all__ = ["HistoryStore"]
