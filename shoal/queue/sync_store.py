"""The queue statements a synchronous client runs (:mod:`shoal.queue.sync`).

The same ``queries.sql`` as :class:`shoal.queue.store.JobStore`, on a
synchronous connection.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from shoal.db.sync import SyncConn, SyncCursor, SyncDatabase
from shoal.queue.rows import JobRecord, NewJob, job_records, queue_default_params
from shoal.queue.statements import InsertPlan, queue_queries
from shoal.queue.states import JobId
from shoal.queue.store import cancel_channel, cancel_note


class SyncJobStore:
    """The statements a synchronous client runs, from the same ``queries.sql``.

    Each method runs on ``conn`` inside the caller's transaction when given
    one, else on a connection of ``db``'s pool in a transaction of its own.
    """

    def __init__(self, db: SyncDatabase) -> None:
        self.db = db
        self.sql = queue_queries(db.schema)
        self.channel = f"{db.schema}_jobs"
        self.cancel_channel = cancel_channel(db.schema)

    def _rows(
        self, name: str, params: Mapping[str, Any], conn: SyncConn | None = None
    ) -> list[tuple[Any, ...]]:
        query = self.sql[name]

        def run(cur: SyncCursor) -> list[tuple[Any, ...]]:
            cur.execute(query, params)
            return cur.fetchall() if cur.description is not None else []

        return self.db.on(conn, run)

    def insert(
        self, jobs: Sequence[NewJob], *, now: datetime | None, conn: SyncConn | None = None
    ) -> list[JobId | None]:
        """As :meth:`JobStore.insert`: one statement, and a wake-up sent on commit."""
        if not jobs:
            return []
        plan = InsertPlan.of(jobs, now)
        insert_q, notify_q = self.sql[plan.query], self.sql["notify_queues"]

        def run(cur: SyncCursor) -> list[JobId | None]:
            cur.execute(insert_q, plan.params)
            ids = plan.ids(cur.fetchall())
            if plan.wake and any(ids):
                cur.execute(notify_q, {"channel": self.channel, "queues": plan.wake})
            return ids

        return self.db.on(conn, run)

    def notify(self, conn: SyncConn | None, queues: Sequence[str]) -> None:
        self._rows("notify_queues", {"channel": self.channel, "queues": list(queues)}, conn)

    def paused_queues(self, cur: SyncCursor) -> list[str]:
        """The paused queues, read on ``cur`` (in a layer above's transaction)."""
        cur.execute(self.sql["paused_queues"], {})
        return [r[0] for r in cur.fetchall()]

    def get_job(self, job_id: JobId, *, conn: SyncConn | None = None) -> JobRecord | None:
        query = self.sql["get_job"]

        def run(cur: SyncCursor) -> list[JobRecord]:
            cur.execute(query, {"id": job_id})
            columns = [c.name for c in cur.description or ()]
            return job_records(columns, cur.fetchall())

        jobs = self.db.on(conn, run)
        return jobs[0] if jobs else None

    def cancel(
        self,
        ids: Sequence[JobId],
        *,
        by: str,
        now: datetime | None,
        conn: SyncConn | None = None,
    ) -> set[JobId]:
        """Cancel waiting or active jobs, noting ``by``; the holders of active ones are told."""
        params = {
            "ids": list(ids),
            "note": json.dumps(cancel_note(by)),
            "channel": self.cancel_channel,
            "now": now,
        }
        rows = self._rows("cancel_jobs", params, conn)
        return {JobId(r[0]) for r in rows}

    def set_queue_default(self, queue: str, options: Mapping[str, Any]) -> None:
        if options:
            self._rows("set_queue_default", queue_default_params(queue, options))
        else:
            self._rows("delete_queue_default", {"queue": queue})
