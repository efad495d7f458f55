"""The only code that runs the queue layer's SQL: one typed function per query.

Each function takes ``now`` (``None`` = the database clock) and, where a caller
may want its own transaction, ``conn``: given a connection, the statement runs
on it as part of the caller's transaction (transactional enqueue); otherwise it
runs on the pool under the database deadline.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib import resources
from typing import Any, TypeVar

from psycopg import sql

from shoal.db.pool import AsyncConn, Database, Pending
from shoal.db.queries import (
    fetch_named,
    fetch_named_timed,
    int_array,
    load_queries,
    parse_queries,
)
from shoal.errors import InvalidInput
from shoal.internal import INTERNAL_PREFIX
from shoal.queue.cursor import Position
from shoal.queue.limits import Limits, LimitState, Rate
from shoal.queue.results import encode_result
from shoal.queue.rows import (
    OPTION_COLUMNS,
    ClaimedJob,
    ClaimedJobs,
    ExpiredLease,
    Failure,
    JobRecord,
    JobSettings,
    NewJob,
    OrphanedJob,
    QueueDefaultRow,
    QueueStateCount,
    ScheduleRow,
    WorkerInfo,
    claim_reader,
    job_records,
    queue_default_params,
    queue_default_row,
    retry_policy,
)
from shoal.queue.states import JobId, JobState

T = TypeVar("T")

# How long declaring limits waits for the transactions that were running when
# it committed (an insert among them may have missed the declaration), and
# how often it looks. Past the wait, the next declaration (a worker's start)
# stamps what is left.
STAMP_WAIT = timedelta(seconds=5)
STAMP_POLL_S = 0.05
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


# What insert_jobs does on a conflict, and what it returns to tell which job
# was skipped; only a singleton key can cause one.
ON_CONFLICT = "ON CONFLICT DO NOTHING RETURNING id, queue, singleton_key"


def queue_queries(schema: str) -> dict[str, sql.Composed]:
    """queries.sql bound to ``schema``, and insert_jobs without its conflict check.

    ``insert_jobs_unkeyed`` is for a batch in which no job has a singleton
    key: ids come from the sequence, so no row can conflict, and a plain
    insert skips ON CONFLICT's speculative insertion (a pre-check of each
    unique index and a confirmation record per row): about a third of the
    statement's server time for 10,000 jobs. It returns the ids alone. One
    text, so the two never drift.
    """
    text = resources.files("shoal.queue").joinpath("queries.sql").read_text(encoding="utf-8")
    queries = parse_queries(text, schema, regclasses=["job_id_seq"], where="shoal.queue")
    block = text[text.index("-- name: insert_jobs\n") :]
    block = block[: block.index("\n-- name: ", 1)]
    if block.count(ON_CONFLICT) != 1:
        raise RuntimeError(f"insert_jobs in queries.sql must say {ON_CONFLICT!r} once")
    unkeyed = block.replace("-- name: insert_jobs\n", "-- name: insert_jobs_unkeyed\n")
    unkeyed = unkeyed.replace(ON_CONFLICT, "RETURNING id")
    queries.update(parse_queries(unkeyed, schema, regclasses=["job_id_seq"], where="shoal.queue"))
    return queries


@dataclass(frozen=True, slots=True)
class InsertPlan:
    """The parameters of one ``insert_jobs`` statement, whichever client runs it."""

    params: dict[str, Any]
    # Queues whose new jobs may run at once: their idle workers are woken.
    wake: list[str]
    # insert_jobs when a job has a singleton key, else insert_jobs_unkeyed.
    query: str
    # How many jobs were asked for; with singleton keys, each one's (queue,
    # key), to tell which the statement skipped.
    count: int
    keys: list[tuple[str, str | None]] | None

    @classmethod
    def of(cls, jobs: Sequence[NewJob], now: datetime | None) -> InsertPlan:
        keys: list[tuple[str, str | None]] | None = None
        count = len(jobs)
        if any(j.singleton_key is not None for j in jobs):
            # A job whose queue and key an earlier job of the same call holds
            # is skipped here, as the statement would skip it: every key the
            # statement sees is then its batch's only one, which is how a
            # returned row names the job it came from.
            keys = [(j.settings.queue, j.singleton_key) for j in jobs]
            seen: set[tuple[str, str | None]] = set()
            unique = []
            for job, key in zip(jobs, keys, strict=True):
                if key[1] is not None:
                    if key in seen:
                        continue
                    seen.add(key)
                unique.append(job)
            jobs = unique
        # Jobs sent alike share one JobSettings object (JobBuilder), so the
        # option sets are found by identity first: hashing the settings'
        # eleven fields for each of 10,000 jobs cost more than the lookup.
        sets: dict[JobSettings, int] = {}
        by_identity: dict[int, int] = {}
        option_set = []
        for job in jobs:
            settings = job.settings
            number = by_identity.get(id(settings))
            if number is None:
                number = by_identity[id(settings)] = sets.setdefault(settings, len(sets) + 1)
            option_set.append(number)
        columns = list(zip(*(settings.row() for settings in sets), strict=True))
        params: dict[str, Any] = dict(zip(OPTION_COLUMNS, map(list, columns), strict=True))
        params["option_set"] = option_set
        params["data"] = [j.data for j in jobs]
        # unnest pads a shorter array with NULLs: no keys at all costs nothing.
        params["singleton_key"] = [j.singleton_key for j in jobs] if keys is not None else []
        # Likewise for partition keys and costs, which most jobs never have.
        keyed = any(j.partition_key is not None for j in jobs)
        params["partition_key"] = [j.partition_key for j in jobs] if keyed else []
        params["cost"] = [j.cost for j in jobs] if any(j.cost is not None for j in jobs) else []
        params["now"] = now
        query = "insert_jobs" if keys is not None else "insert_jobs_unkeyed"
        return cls(params, sorted({s.queue for s in sets if s.runs_now}), query, count, keys)

    def ids(self, rows: Sequence[Sequence[Any]]) -> list[JobId | None]:
        """The statement's rows as ids in input order (None: a singleton key was taken).

        The statement draws ids in input order (queries.sql), so the rows
        sorted by id are the inserted jobs in order. With singleton keys, a
        row's (queue, key) names its job, and a keyless row is the next
        keyless job's.
        """
        if self.keys is None:
            ids = sorted(JobId(r[0]) for r in rows)
            if len(ids) != self.count:
                raise RuntimeError(f"inserted {len(ids)} jobs of {self.count} without keys")
            return list(ids)
        by_key = {(r[1], r[2]): JobId(r[0]) for r in rows if r[2] is not None}
        keyless = iter(sorted(JobId(r[0]) for r in rows if r[2] is None))
        return [next(keyless) if key[1] is None else by_key.pop(key, None) for key in self.keys]


class JobStore:
    """Typed access to the queue tables of one schema."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.sql = queue_queries(db.schema)
        # The history sampler's statements (shoal.queue.history): one big
        # statement and its companions, kept in a file of their own.
        self.sql.update(load_queries("shoal.queue", db.schema, file="history.sql"))
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

    async def _rows(
        self, name: str, params: Mapping[str, Any], conn: AsyncConn | None = None
    ) -> list[tuple[Any, ...]]:
        return await self.db.fetch(self.sql[name], params, conn)

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
        read = claim_reader(columns)
        return ClaimedJobs([read(r) for r in rows], cost_s)

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

    # -- maintenance -----------------------------------------------------

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
        query = self.sql["archive_finished"]
        params = {"retention_s": retention.total_seconds(), "limit": limit, "now": now}

        async def run(c: AsyncConn) -> int:
            cur = await c.execute(query, params)
            return cur.rowcount

        return await self.db.run(run)

    async def prune_archive(self, *, retention: timedelta, limit: int, now: datetime | None) -> int:
        query = self.sql["prune_archive"]
        params = {"retention_s": retention.total_seconds(), "limit": limit, "now": now}

        async def run(c: AsyncConn) -> int:
            cur = await c.execute(query, params)
            return cur.rowcount

        return await self.db.run(run)

    # -- control ---------------------------------------------------------

    async def cancel(self, ids: Sequence[JobId], *, by: str, now: datetime | None) -> set[JobId]:
        """Cancel waiting or active jobs, noting ``by``; the holders of active ones are told."""
        rows = await self._rows("cancel_jobs", self._cancel_params(ids, by, now))
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

    # -- limits ------------------------------------------------------------

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
        query = self.sql["prune_buckets"]

        async def run(c: AsyncConn) -> int:
            cur = await c.execute(query, {"limit": limit, "now": now})
            return cur.rowcount

        return await self.db.run(run)

    async def stamp_unkeyed(self) -> int:
        """Give unfinished jobs of limited queues that have no partition key theirs."""
        query = self.sql["stamp_unkeyed"]

        async def run(c: AsyncConn) -> int:
            cur = await c.execute(query)
            return cur.rowcount

        return await self.db.run(run)

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

    # -- schedules -------------------------------------------------------

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

    # -- history (shoal.queue.history) -------------------------------------------

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

    # -- worker registry (shoal.queue.registry) ----------------------------------

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
