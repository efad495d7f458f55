"""The statements of the worker registry: one row per running worker process.

:mod:`shoal.queue.registry` keeps this process's row; maintenance reads the
silent ones (:mod:`shoal.queue.maintenance_store`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta

from shoal.queue.rows import WorkerInfo
from shoal.queue.statements import Statements


class RegistryStore(Statements):
    """Typed access to the worker registry of one schema."""

    async def register_worker(
        self,
        worker_id: str,
        *,
        host: str,
        pid: int,
        app: str,
        queues: Mapping[str, int],
        rescue_after: timedelta,
        now: datetime | None,
    ) -> int:
        """Write (or refresh) this process's row; its number (worker.no)."""
        rows = await self._rows(
            "register_worker",
            {
                "id": worker_id,
                "host": host,
                "pid": pid,
                "app": app,
                "queues": json.dumps(dict(queues)),
                "rescue_after_s": rescue_after.total_seconds(),
                "now": now,
            },
        )
        return int(rows[0][0])

    async def heartbeat_worker(
        self,
        worker_id: str,
        *,
        running: Mapping[str, int],
        done: int,
        queues: Mapping[str, int],
        now: datetime | None,
    ) -> bool:
        """Report the process alive with its counters; False when its row is gone."""
        rows = await self._rows(
            "heartbeat_worker",
            {
                "id": worker_id,
                "running": sum(running.values()),
                "running_by_queue": json.dumps({q: n for q, n in running.items() if n}),
                "done": done,
                "queues": json.dumps(dict(queues)),
                "now": now,
            },
        )
        return bool(rows)

    async def drop_gone_workers(self, *, drop_s: float, now: datetime | None) -> None:
        """Delete the rows whose heartbeat is older than ``drop_s`` seconds."""
        await self._rows("drop_gone_workers", {"drop_s": drop_s, "now": now})

    async def deregister_worker(self, worker_id: str) -> None:
        await self._rows("deregister_worker", {"id": worker_id})

    async def list_workers(self, *, gone_s: float, now: datetime | None) -> list[WorkerInfo]:
        """Every registered process; ``gone`` past ``gone_s`` seconds (or its rescue_after)."""
        rows = await self._rows("list_workers", {"gone_s": gone_s, "now": now})
        return [WorkerInfo(*r) for r in rows]


__all__ = ["RegistryStore"]
