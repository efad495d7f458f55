"""The statements of cron schedules: declaring, listing, ticking and adopting them.

:mod:`shoal.queue.cron` runs the ticks; each tick's job is sent by
:meth:`JobStore.insert <shoal.queue.store.JobStore.insert>` in the tick's own
transaction.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from shoal.db.pool import AsyncConn
from shoal.queue.rows import ScheduleRow
from shoal.queue.statements import Statements
from shoal.queue.states import JobId, JobState


class ScheduleStore(Statements):
    """Typed access to the schedules of one schema."""

    async def upsert_schedule(
        self,
        *,
        name: str,
        queue: str,
        cron: str,
        timezone: str,
        data: str,
        options: Mapping[str, Any],
        now: datetime | None,
    ) -> None:
        await self._rows(
            "upsert_schedule",
            {
                "name": name,
                "queue": queue,
                "cron": cron,
                "timezone": timezone,
                "data": data,
                "options": json.dumps(dict(options)),
                "now": now,
            },
        )

    async def delete_schedule(self, name: str) -> bool:
        return bool(await self._rows("delete_schedule", {"name": name}))

    async def list_schedules(self, *, now: datetime | None) -> list[ScheduleRow]:
        """Every schedule, paused or not (``ScheduleRow.ticks``), by name."""
        rows = await self._rows("list_schedules", {"now": now})
        return [
            ScheduleRow(
                name=r[0],
                queue=r[1],
                cron=r[2],
                timezone=r[3],
                data=r[4],
                options=r[5],
                last_tick=r[6],
                db_now=r[7],
                created_at=r[8],
                updated_at=r[9],
                paused_at=r[10],
                owner=r[11],
                last_job_id=None if r[12] is None else JobId(r[12]),
                last_job_state=None if r[13] is None else JobState(r[13]),
            )
            for r in rows
        ]

    async def advance_schedule(self, conn: AsyncConn, name: str, tick: datetime) -> bool:
        """Claim ``tick`` of schedule ``name`` inside ``conn``'s transaction."""
        return bool(await self._rows("advance_schedule", {"name": name, "tick": tick}, conn))

    async def record_tick_job(self, conn: AsyncConn, name: str, job_id: JobId | None) -> None:
        """The job ``name``'s latest tick sent (None: a singleton key skipped
        it), in the tick's own transaction."""
        await self._rows("record_tick_job", {"name": name, "job_id": job_id}, conn)

    async def adopt_schedules(self, owner: str, names: Sequence[str]) -> list[str]:
        """Mark ``names`` as declared by ``owner`` and delete the schedules ``owner``
        declared before and no longer does, in one transaction; the names deleted."""
        params = {"owner": owner, "names": list(names)}

        async def run(conn: AsyncConn) -> list[str]:
            await self._rows("own_schedules", params, conn)
            return [r[0] for r in await self._rows("drop_disowned_schedules", params, conn)]

        return await self.db.run(run)


__all__ = ["ScheduleStore"]
