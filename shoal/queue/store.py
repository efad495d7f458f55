"""The job statements of the queue layer: enqueue, claim, outcomes, leases, control, inspection.

The layer's other statements have stores of their own, on the same parsed
``queries.sql`` (:mod:`shoal.queue.statements`): limits
(:mod:`~shoal.queue.limit_store`), schedules (:mod:`~shoal.queue.schedule_store`),
the worker registry (:mod:`~shoal.queue.registry_store`), maintenance
(:mod:`~shoal.queue.maintenance_store`) and the history sampler
(:mod:`~shoal.queue.history_store`).

Each method takes ``now`` (``None`` = the database clock) and, where a caller
may want its own transaction, ``conn``: given a connection, the statement runs
on it as part of the caller's transaction (transactional enqueue); otherwise it
runs on the pool under the database deadline.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from shoal.db.pool import AsyncConn, Database, Pending
from shoal.db.queries import fetch_named, fetch_named_timed, int_array
from shoal.errors import InvalidInput
from shoal.queue.cursor import Position
from shoal.queue.results import encode_result
from shoal.queue.rows import (
    ClaimedJob,
    ClaimedJobs,
    Failure,
    JobRecord,
    NewJob,
    QueueDefaultRow,
    QueueStateCount,
    claim_reader,
    job_records,
    lean_claims,
    queue_default_params,
    queue_default_row,
)
from shoal.queue.statements import InsertPlan, Queries, Statements
from shoal.queue.states import JobId, JobState

# The longest label a cancel accepts for who cancelled a job, and the label a
# cancel from Python code notes when it names no one.
MAX_CANCELLED_BY = 200
DEFAULT_CANCELLED_BY = "python"


def cancel_channel(schema: str) -> str:
    """The channel that tells workers a job they may hold was cancelled (one per schema)."""
    return f"{schema}_cancels"


def cancel_note(by: str) -> dict[str, Any]:
    """The history entry a cancel appends to each job (the statement adds attempt and time).

    ``by`` names who cancelled it (``"api"``, ``"cli"``, ``"console"``, or the
    caller's own label); a blank or over-long label is refused.
    """
    if not isinstance(by, str) or not by.strip() or len(by) > MAX_CANCELLED_BY:
        raise InvalidInput(
            "by", f"must be a non-blank string of at most {MAX_CANCELLED_BY} characters, got {by!r}"
        )
    return {"type": "Cancelled", "message": f"cancelled by {by}", "traceback": None, "by": by}


class JobStore(Statements):
    """Typed access to the jobs of one schema."""

    def __init__(self, db: Database, sql: Queries | None = None) -> None:
        super().__init__(db, sql)
        # One notification channel per schema, so two shoal installs in one
        # database do not wake each other's workers.
        self.channel = f"{db.schema}_jobs"
        self.cancel_channel = cancel_channel(db.schema)
        # Recorded on every job this store claims: the number of this
        # process's registry row (set by the registry when it writes the row;
        # None: no row yet, the jobs are rescued by their lease only). Read by
        # the claims.
        self.holder: int | None = None
        # Set once the registry row this process's claims will name is
        # written (None: no row is being written); awaited before a worker's
        # first claim, so no job a registered process claims goes unnamed.
        self.holder_known: asyncio.Event | None = None

    async def _jobs(
        self, name: str, params: Mapping[str, Any], conn: AsyncConn | None = None
    ) -> list[JobRecord]:
        """The job rows of statement ``name``, read by column name (job_reader)."""
        query = self.sql[name]
        columns, rows = await self.db.on(
            conn, lambda c: fetch_named(c, query, params), transaction=False
        )
        return job_records(columns, rows)

    # -- enqueue -----------------------------------------------------------

    async def insert(
        self, jobs: Sequence[NewJob], *, now: datetime | None, conn: AsyncConn | None = None
    ) -> list[JobId | None]:
        """Insert ``jobs`` in one statement; ids in input order, None for skipped singletons."""
        if not jobs:
            return []
        plan = InsertPlan.of(jobs, now)
        insert_q = self.sql[plan.query]

        async def run(c: AsyncConn) -> list[JobId | None]:
            cur = await c.execute(insert_q, plan.params)
            ids = plan.ids(await cur.fetchall())
            if plan.wake and any(ids):
                await self.notify(c, plan.wake)
            return ids

        return await self.db.on(conn, run)

    async def notify(self, conn: AsyncConn, queues: Sequence[str]) -> None:
        """Wake idle workers of ``queues`` in every process when ``conn`` commits.

        For a layer that writes jobs with its own statement (the batch layer
        sends a task's item jobs in the statement that creates its items).
        """
        await conn.execute(self.sql["notify_queues"], {"channel": self.channel, "queues": queues})

    # -- the worker's edges ----------------------------------------------

    async def claim(
        self, queue: str, limit: int, *, now: datetime | None, after: Position | None = None
    ) -> list[ClaimedJob]:
        """Claim up to ``limit`` waiting jobs of ``queue``, in one round trip.

        From the head of the queue, or with ``after`` (a ``(priority, id)``
        position, shoal.queue.cursor) only the jobs that come after it in
        claim order: higher priorities, the same priority with a higher id,
        lower priorities.

        The claim commits without waiting for its WAL flush. That is safe: a
        claim lost to a server crash only puts its job back to waiting, and the
        worker's result then loses the attempt fence, so the job runs again
        (at-least-once, as with any crash). A completion's commit is flushed,
        and with it every earlier claim in the WAL.
        """
        return (await self.claim_with_cost(queue, limit, now=now, after=after)).jobs

    async def claim_with_cost(
        self, queue: str, limit: int, *, now: datetime | None, after: Position | None = None
    ) -> ClaimedJobs:
        """:meth:`claim`, and what its statement cost the database (see ClaimedJobs)."""
        query = self.sql["claim_jobs"]
        after_priority, after_id = after if after is not None else (None, None)
        params = {
            "queue": queue,
            "limit": limit,
            "now": now,
            "after_priority": after_priority,
            "after_id": after_id,
            "holder": self.holder,
        }
        columns, rows, cost_s = await self.db.run(
            lambda c: fetch_named_timed(c, query, params), transaction=False
        )
        return ClaimedJobs(lean_claims(columns, rows, queue), cost_s)

    async def claim_limited(
        self, queue: str, limit: int, *, now: datetime | None
    ) -> list[ClaimedJob]:
        """:meth:`claim` for a queue with limits: only jobs its limits let start now.

        Claims of the queue wait for each other (they are serialized in the
        database); a queue without limits is claimed as :meth:`claim` does.
        """
        query = self.sql["claim_limited_jobs"]
        params = {"queue": queue, "limit": limit, "now": now, "holder": self.holder}
        columns, rows = await self.db.run(
            lambda c: fetch_named(c, query, params), transaction=False
        )
        read = claim_reader(columns)
        return [read(r) for r in rows]

    async def send_complete(
        self, conn: AsyncConn, done: Sequence[tuple[JobId, int, Any]], *, now: datetime | None
    ) -> Pending[set[JobId]]:
        """Send active -> completed for (id, attempt, output); read the ids that won their fence.

        Each output is JSON text (:func:`~shoal.queue.results.encode_result`) or None.
        """
        if not done:
            return Pending(None, lambda rows: set())
        cur = await conn.execute(
            self.sql["complete_jobs"],
            {
                "ids": int_array(d[0] for d in done),
                "attempts": int_array(d[1] for d in done),
                # No outputs at all (store_output=False) go as an empty array.
                "outputs": ([d[2] for d in done] if any(d[2] is not None for d in done) else []),
                "now": now,
            },
        )
        return Pending(cur, lambda rows: {JobId(r[0]) for r in rows})

    async def send_fail(
        self,
        conn: AsyncConn,
        failures: Sequence[Failure],
        *,
        now: datetime | None,
        expired_only: bool = False,
    ) -> Pending[dict[JobId, JobState]]:
        """Send active -> retry | failed; read the new state of each job that won its fence.

        With ``expired_only`` (the rescuer) a job must also still be past its
        lease: a heartbeat that landed after the rescuer read it wins.
        """
        if not failures:
            return Pending(None, lambda rows: {})
        cur = await conn.execute(
            self.sql["fail_jobs"],
            {
                "ids": [f.id for f in failures],
                "attempts": [f.attempt for f in failures],
                "states": [f.state.value for f in failures],
                "retry_in_s": [
                    None if f.retry_in is None else f.retry_in.total_seconds() for f in failures
                ],
                "errors": [json.dumps(f.error) for f in failures],
                "expired_only": expired_only,
                "now": now,
            },
        )
        return Pending(cur, lambda rows: {JobId(r[0]): JobState(r[1]) for r in rows})

    async def send_release(
        self,
        conn: AsyncConn,
        jobs: Sequence[tuple[JobId, int, timedelta, Mapping[str, Any] | None]],
        *,
        now: datetime | None,
    ) -> Pending[set[JobId]]:
        """Send active -> created without costing an attempt (snooze, shutdown hand-back).

        Each job is (id, attempt, delay, note): a note, when given, is
        appended to the job's ``errors`` (a hand-back's ``Interrupted``).
        """
        if not jobs:
            return Pending(None, lambda rows: set())
        cur = await conn.execute(
            self.sql["release_jobs"],
            {
                "ids": [j[0] for j in jobs],
                "attempts": [j[1] for j in jobs],
                "delays_s": [j[2].total_seconds() for j in jobs],
                # No notes at all (snoozes only) go as an empty array.
                "notes": (
                    [None if j[3] is None else json.dumps(j[3]) for j in jobs]
                    if any(j[3] is not None for j in jobs)
                    else []
                ),
                "now": now,
            },
        )
        return Pending(cur, lambda rows: {JobId(r[0]) for r in rows})

    async def complete(
        self,
        done: Sequence[tuple[JobId, int, Any]],
        *,
        now: datetime | None,
        conn: AsyncConn | None = None,
    ) -> set[JobId]:
        """active -> completed for (id, attempt, output); returns the ids that won their fence.

        Raises :class:`~shoal.queue.results.UnstorableResult` for an output
        that cannot be stored, before anything is written.
        """
        encoded = [(job_id, attempt, encode_result(output)) for job_id, attempt, output in done]

        async def run(c: AsyncConn) -> set[JobId]:
            return await (await self.send_complete(c, encoded, now=now)).result()

        return await self.db.on(conn, run, transaction=False)

    async def fail(
        self,
        failures: Sequence[Failure],
        *,
        now: datetime | None,
        expired_only: bool = False,
        conn: AsyncConn | None = None,
    ) -> dict[JobId, JobState]:
        """active -> retry | failed; see :meth:`send_fail`."""

        async def run(c: AsyncConn) -> dict[JobId, JobState]:
            pending = await self.send_fail(c, failures, now=now, expired_only=expired_only)
            return await pending.result()

        return await self.db.on(conn, run, transaction=False)

    async def release(
        self,
        jobs: Sequence[tuple[JobId, int, timedelta, Mapping[str, Any] | None]],
        *,
        now: datetime | None,
        conn: AsyncConn | None = None,
    ) -> set[JobId]:
        """active -> created without costing an attempt (snooze, shutdown hand-back; with notes)."""

        async def run(c: AsyncConn) -> set[JobId]:
            return await (await self.send_release(c, jobs, now=now)).result()

        return await self.db.on(conn, run, transaction=False)

    async def send_pause_partitions(
        self, conn: AsyncConn, jobs: Sequence[tuple[JobId, timedelta]], *, now: datetime | None
    ) -> None:
        """Hold back the partition of each job (RetryAfter) for its delay."""
        if jobs:
            await conn.execute(
                self.sql["pause_partitions"],
                {
                    "ids": [j[0] for j in jobs],
                    "delays_s": [j[1].total_seconds() for j in jobs],
                    "now": now,
                },
            )

    async def send_report_costs(
        self, conn: AsyncConn, costs: Sequence[tuple[JobId, int]], *, now: datetime | None
    ) -> None:
        """Charge each job's partition the difference between its reported and its sent cost."""
        if costs:
            await conn.execute(
                self.sql["report_costs"],
                {"ids": [c[0] for c in costs], "costs": [c[1] for c in costs], "now": now},
            )

    async def cancel_active(
        self,
        job_id: JobId,
        attempt: int,
        error: Mapping[str, Any],
        *,
        now: datetime | None,
        conn: AsyncConn | None = None,
    ) -> bool:
        rows = await self._rows(
            "cancel_active_job",
            {"id": job_id, "attempt": attempt, "error": json.dumps(error), "now": now},
            conn,
        )
        return bool(rows)

    async def extend_leases(
        self, held: Sequence[tuple[JobId, int]], *, now: datetime | None
    ) -> dict[JobId, datetime]:
        if not held:
            return {}
        rows = await self._rows(
            "extend_leases",
            {"ids": [h[0] for h in held], "attempts": [h[1] for h in held], "now": now},
        )
        return {JobId(r[0]): r[1] for r in rows}

    # -- control ---------------------------------------------------------

    async def cancel(
        self,
        ids: Sequence[JobId],
        *,
        by: str,
        now: datetime | None,
        conn: AsyncConn | None = None,
    ) -> set[JobId]:
        """Cancel waiting or active jobs, noting ``by``; the holders of active ones are told."""
        rows = await self._rows("cancel_jobs", self._cancel_params(ids, by, now), conn)
        return {JobId(r[0]) for r in rows}

    def _cancel_params(self, ids: Sequence[JobId], by: str, now: datetime | None) -> dict[str, Any]:
        note = json.dumps(cancel_note(by))
        return {"ids": list(ids), "note": note, "channel": self.cancel_channel, "now": now}

    async def note_stopped_runs(
        self,
        conn: AsyncConn,
        runs: Sequence[tuple[JobId, int, Mapping[str, Any]]],
        *,
        now: datetime | None,
    ) -> set[JobId]:
        """Append a note to cancelled jobs whose handler was stopped; fenced by attempt."""
        if not runs:
            return set()
        params = {
            "ids": [r[0] for r in runs],
            "attempts": [r[1] for r in runs],
            "notes": [json.dumps(r[2]) for r in runs],
            "now": now,
        }
        rows = await self._rows("note_stopped_runs", params, conn)
        return {JobId(r[0]) for r in rows}

    async def cancelled_runs(self, runs: Sequence[tuple[JobId, int]]) -> set[JobId]:
        """Which of these runs (job id, attempt) had their job cancelled."""
        if not runs:
            return set()
        params = {"ids": [r[0] for r in runs], "attempts": [r[1] for r in runs]}
        rows = await self._rows("cancelled_runs", params)
        return {JobId(r[0]) for r in rows}

    async def resume(self, ids: Sequence[JobId], *, now: datetime | None) -> set[JobId]:
        rows = await self._rows("resume_jobs", {"ids": list(ids), "now": now})
        return {JobId(r[0]) for r in rows}

    async def retry(self, ids: Sequence[JobId], *, now: datetime | None) -> set[JobId]:
        rows = await self._rows("retry_jobs", {"ids": list(ids), "now": now})
        return {JobId(r[0]) for r in rows}

    async def redrive(self, queue: str, *, limit: int, now: datetime | None) -> dict[JobId, JobId]:
        rows = await self._rows("redrive", {"queue": queue, "limit": limit, "now": now})
        return {JobId(r[0]): JobId(r[1]) for r in rows}

    async def pause_queue(self, queue: str, *, now: datetime | None) -> None:
        await self._rows("pause_queue", {"queue": queue, "now": now})

    async def resume_queue(self, queue: str) -> None:
        await self._rows("resume_queue", {"queue": queue})

    async def paused_queues(self) -> list[str]:
        return [r[0] for r in await self._rows("paused_queues", {})]

    async def set_queue_default(self, queue: str, options: Mapping[str, Any]) -> None:
        """Store ``options`` (validated) as ``queue``'s defaults; no options removes them."""
        if options:
            await self._rows("set_queue_default", queue_default_params(queue, options))
        else:
            await self._rows("delete_queue_default", {"queue": queue})

    async def queue_default(self, queue: str) -> QueueDefaultRow | None:
        rows = await self._rows("get_queue_default", {"queue": queue})
        return queue_default_row(rows[0]) if rows else None

    # -- inspection ------------------------------------------------------

    async def get_job(self, job_id: JobId) -> JobRecord | None:
        jobs = await self._jobs("get_job", {"id": job_id})
        return jobs[0] if jobs else None

    async def list_jobs(
        self,
        queue: str | None,
        *,
        states: Sequence[JobState],
        before_id: JobId | None,
        limit: int,
        hide_prefix: str | None = None,
    ) -> list[JobRecord]:
        """Jobs in ``states`` of ``queue`` (None: of all), newest first, below ``before_id``,
        but for those of the queues named ``hide_prefix...``."""
        return await self._jobs(
            "list_jobs",
            {
                "queue": queue,
                "states": [s.value for s in states],
                "before_id": before_id,
                "limit": limit,
                "hide_prefix": hide_prefix,
            },
        )

    async def queue_stats(self, *, now: datetime | None) -> list[QueueStateCount]:
        rows = await self._rows("queue_stats", {"now": now})
        return [QueueStateCount(r[0], JobState(r[1]), r[2], r[3]) for r in rows]
