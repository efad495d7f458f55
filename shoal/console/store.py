"""The only code that runs the console's SQL (console.sql): one typed method per statement.

The console reads every layer's tables (jobs, schedules, workers, topics,
dead letters, history samples), so its statements are its own rather than
any one layer's; what a layer itself needs (get_job, list_jobs, the
schedules, the workers, taking dead letters) stays in that layer's store
and the console calls it there. The operator's controls that are the
console's alone (retry or delete failed jobs, pause a schedule) are here too.

Each method takes ``now`` where its statement depends on the time (None: the
database clock), and returns plain values or the layers' row types.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from psycopg import sql

from shoal.db.pool import AsyncConn, Database
from shoal.db.queries import fetch_named, load_queries
from shoal.ingest.store import DeadLetter
from shoal.queue.limits import ITEM_QUEUE_PREFIX
from shoal.queue.rows import JobRecord, job_records
from shoal.queue.states import JobState


@dataclass(frozen=True, slots=True)
class RunningWork:
    """A job or a batch item a worker process runs now (``worker_running``)."""

    what: Literal["job", "item"]
    id: int
    queue: str  # an item's: its kind's queue, batch.<kind>
    task_id: str | None  # an item's task
    ref: str | None  # an item's ref
    attempt: int
    started_at: datetime
    lease_expires_at: datetime | None  # a job's; an item's heartbeat is its lease
    preview: str  # the payload's JSON, cut short


class ConsoleStore:
    """Typed access to console.sql over one schema."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.sql = load_queries("shoal.console", db.schema, file="console.sql")
        self._job_table = sql.Identifier(db.schema, "job").as_string()

    async def _rows(
        self, name: str, params: dict[str, Any], conn: AsyncConn | None = None
    ) -> list[tuple[Any, ...]]:
        return await self.db.fetch(self.sql[name], params, conn)

    async def _count(self, name: str, params: dict[str, Any], conn: AsyncConn) -> int:
        cur = await conn.execute(self.sql[name], params)
        return cur.rowcount

    # -- queues ----------------------------------------------------------------

    async def queue_names(self, *, now: datetime | None) -> list[str]:
        return [r[0] for r in await self._rows("queue_names", {"now": now})]

    async def queue_known(self, queue: str) -> bool:
        return bool((await self._rows("queue_known", {"queue": queue}))[0][0])

    async def queue_paused_at(self) -> dict[str, datetime]:
        return dict(await self._rows("queue_paused_at", {}))

    async def job_rows_estimate(self) -> float:
        """The planner's count of the job table's rows (-1 before its first analyze)."""
        return float((await self._rows("job_rows_estimate", {"job_table": self._job_table}))[0][0])

    async def queue_counts_indexed(
        self, *, now: datetime | None
    ) -> list[tuple[str, int, int, int, int, timedelta | None]]:
        """(queue, created, retry, active, failed, oldest wait) from the state indexes."""
        return [
            (r[0], r[1], r[2], r[3], r[4], r[5])
            for r in await self._rows("queue_counts_indexed", {"now": now})
        ]

    async def finished_estimates(self) -> list[tuple[str, str, int]]:
        """(queue, state, estimated jobs) of the completed and cancelled states."""
        params = {"job_table": self._job_table, "schema_name": self.db.schema}
        return [(r[0], r[1], r[2]) for r in await self._rows("finished_estimates", params)]

    async def failed_total(self, *, hide_prefix: str | None = None) -> int:
        """Failed jobs of every queue but those named ``hide_prefix...``."""
        return int((await self._rows("failed_total", {"hide_prefix": hide_prefix}))[0][0])

    async def queue_finished_since(
        self, *, since_s: float, now: datetime | None
    ) -> dict[str, tuple[int, int]]:
        """Per queue: (completed, failed) that finished in the last ``since_s`` seconds."""
        rows = await self._rows("queue_finished_since", {"now": now, "since_s": since_s})
        return {r[0]: (r[1], r[2]) for r in rows}

    # -- jobs ------------------------------------------------------------------

    async def _jobs(self, name: str, params: dict[str, Any]) -> list[JobRecord]:
        query = self.sql[name]
        columns, rows = await self.db.run(
            lambda c: fetch_named(c, query, params), transaction=False
        )
        return job_records(columns, rows)

    async def list_failed_jobs(
        self,
        *,
        queue: str | None,
        before_id: int | None,
        limit: int,
        hide_prefix: str | None = None,
    ) -> list[JobRecord]:
        """Failed jobs, newest first, below ``before_id`` (list_jobs of the queue's store
        for the failed state, walking its own index), but those of queues named
        ``hide_prefix...``."""
        params = {
            "queue": queue,
            "before_id": before_id,
            "limit": limit,
            "hide_prefix": hide_prefix,
        }
        return await self._jobs("list_failed_jobs", params)

    async def search_jobs(
        self,
        *,
        search: str,
        search_id: int | None,
        states: Sequence[JobState],
        queue: str | None,
        before_id: int | None,
        limit: int,
    ) -> list[JobRecord]:
        """The job with id ``search_id`` and those with singleton key ``search``."""
        params = {
            "search": search,
            "search_id": search_id,
            "states": [s.value for s in states],
            "queue": queue,
            "before_id": before_id,
            "limit": limit,
        }
        return await self._jobs("search_jobs", params)

    async def retry_job(self, conn: AsyncConn, job_id: int, *, now: datetime | None) -> bool:
        """A failed or cancelled job to run again now, in ``conn``'s transaction; False
        when it is in neither state or another job holds its singleton key."""
        return bool(await self._count("retry_job", {"id": job_id, "now": now}, conn))

    async def retry_failed(self, conn: AsyncConn, queue: str, *, now: datetime | None) -> int:
        """Every failed job of ``queue`` to run again now, in ``conn``'s transaction."""
        return await self._count("retry_failed", {"queue": queue, "now": now}, conn)

    async def delete_failed(self, queue: str) -> int:
        return await self.db.run(lambda c: self._count("delete_failed", {"queue": queue}, c))

    async def delete_job(self, job_id: int) -> bool:
        """Delete a job that is not running, live or archived; False if none was."""
        return bool(await self._rows("delete_job", {"id": job_id}))

    # -- schedules -------------------------------------------------------------

    async def schedule_names(self) -> list[str]:
        return [r[0] for r in await self._rows("schedule_names", {})]

    async def pause_schedule(self, name: str, *, now: datetime | None) -> bool:
        """False when there is no such schedule."""
        return bool(await self._rows("pause_schedule", {"name": name, "now": now}))

    async def resume_schedule(self, name: str, *, now: datetime | None) -> bool:
        """False when there is no such schedule."""
        return bool(await self._rows("resume_schedule", {"name": name, "now": now}))

    # -- topics ----------------------------------------------------------------

    async def topics(self) -> list[tuple[Any, ...]]:
        """Each topic's row of ``topics`` (console.sql), in TopicSummary's field order."""
        return await self._rows("topics", {})

    async def topic_known(self, topic: str) -> bool:
        return bool((await self._rows("topic_known", {"topic": topic}))[0][0])

    async def topic_names(self) -> list[str]:
        return [r[0] for r in await self._rows("topic_names", {})]

    async def dead_page(
        self, topic: str, *, include_redriven: bool, after_id: int | None, limit: int
    ) -> list[DeadLetter]:
        params = {"topic": topic, "all": include_redriven, "after_id": after_id, "limit": limit}
        return [DeadLetter(*r) for r in await self._rows("dead_page", params)]

    async def discard_dead(
        self, conn: AsyncConn, topic: str, letter_id: int, *, queue: str
    ) -> str | None:
        """Delete dead letter ``letter_id`` of ``topic`` and the failed job its message
        left in ``queue`` (postgres transport), in ``conn``'s transaction; the letter's
        message id, or None when the topic has no such letter."""
        rows = await self._rows("discard_dead", {"topic": topic, "id": letter_id}, conn)
        if not rows:
            return None
        message_id: str = rows[0][0]
        params = {"queue": queue, "message_id": message_id}
        await self._count("discard_dead_job", params, conn)
        return message_id

    # -- workers ---------------------------------------------------------------

    async def worker_running(
        self, worker_id: str, *, limit: int, preview: int
    ) -> list[RunningWork]:
        """The jobs and batch items worker ``worker_id`` runs now (each at most ``limit``)."""
        params = {
            "worker": worker_id,
            "limit": limit,
            "preview": preview,
            "item_prefix": ITEM_QUEUE_PREFIX,
        }
        return [RunningWork(*r) for r in await self._rows("worker_running", params)]

    # -- history ---------------------------------------------------------------

    async def history(
        self, *, queue: str, resolution: int, window_s: int, now: datetime | None
    ) -> list[tuple[Any, ...]]:
        """The samples of ``queue`` (or '*') at ``resolution`` over the last ``window_s``
        seconds, in Sample's field order."""
        params = {"now": now, "resolution": resolution, "queue": queue, "window_s": window_s}
        return await self._rows("history", params)


__all__ = ["ConsoleStore", "RunningWork"]
