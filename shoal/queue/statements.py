"""The queue layer's statements: ``queries.sql`` bound to a schema, and the stores' base.

Every store of the layer (:mod:`~shoal.queue.store` for jobs,
:mod:`~shoal.queue.limit_store`, :mod:`~shoal.queue.schedule_store`,
:mod:`~shoal.queue.registry_store`, :mod:`~shoal.queue.maintenance_store`,
:mod:`~shoal.queue.history_store`) runs statements of one parsed file, shared
between them (a client parses it once). Each method takes ``now`` (``None`` =
the database clock) and, where a caller may want its own transaction,
``conn``: given a connection, the statement runs on it as part of the
caller's transaction (transactional enqueue); otherwise it runs on the pool
under the database deadline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import Any

from psycopg import sql

from shoal.db.pool import AsyncConn, Database
from shoal.db.queries import parse_queries
from shoal.queue.rows import OPTION_COLUMNS, JobSettings, NewJob
from shoal.queue.states import JobId

Queries = Mapping[str, sql.Composed]

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


class Statements:
    """Runs named statements of the queue layer on one database: the base of its stores.

    ``sql`` is the parsed statements to share (:func:`queue_queries` of the
    database's schema when not given).
    """

    def __init__(self, db: Database, sql: Queries | None = None) -> None:
        self.db = db
        self.sql: Queries = sql if sql is not None else queue_queries(db.schema)

    async def _rows(
        self, name: str, params: Mapping[str, Any], conn: AsyncConn | None = None
    ) -> list[tuple[Any, ...]]:
        return await self.db.fetch(self.sql[name], params, conn)

    async def _rowcount(self, name: str, params: Mapping[str, Any] | None = None) -> int:
        """Run statement ``name`` in a transaction of its own; the rows it touched."""
        query = self.sql[name]

        async def run(c: AsyncConn) -> int:
            cur = await c.execute(query, params)
            return cur.rowcount

        return await self.db.run(run)


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
