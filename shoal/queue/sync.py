"""``SyncClient``: send, insert, inspect and cancel jobs from synchronous code.

For scripts, Django views and Flask handlers: no event loop needed. Every
call validates exactly as :class:`~shoal.queue.client.Shoal` does (one
:class:`~shoal.queue.enqueue.JobBuilder`) and runs the same statements of
``queries.sql``. Given ``conn=``, a synchronous psycopg 3 connection, the
write joins the caller's open transaction: it commits, and wakes workers,
when the caller commits, and vanishes if the caller rolls back.

>>> with SyncClient.connect("postgresql://localhost/app") as client:  # doctest: +SKIP
...     job_id = client.send("email_send", {"user_id": 7}, retry_limit=3)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Unpack

from shoal.clock import SYSTEM_CLOCK, Clock
from shoal.db.pool import DEFAULT_DEADLINE, DEFAULT_SCHEMA
from shoal.db.sync import DEFAULT_SYNC_POOL_SIZE, SyncConn, SyncDatabase
from shoal.errors import NotFound
from shoal.queue.enqueue import JobBuilder
from shoal.queue.options import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    JobOptions,
    QueueDefaults,
    SendOptions,
    SharedJobOptions,
    check_queue_name,
    parse_queue_defaults,
)
from shoal.queue.rows import JobRecord
from shoal.queue.states import JobId
from shoal.queue.store import DEFAULT_CANCELLED_BY
from shoal.queue.sync_store import SyncJobStore
from shoal.tracing import carrier


class SyncClient:
    """A synchronous client of one shoal schema.

    Thread-safe: threads share its pool. It does not migrate the schema; a
    worker's start or ``shoal migrate`` does.
    """

    def __init__(
        self,
        db: SyncDatabase,
        *,
        clock: Clock = SYSTEM_CLOCK,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        defaults: JobOptions | None = None,
    ) -> None:
        self.db = db
        self.clock = clock
        self.builder = JobBuilder(max_payload_bytes=max_payload_bytes, defaults=defaults)
        self.store = SyncJobStore(db)

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        min_size: int = 1,
        max_size: int = DEFAULT_SYNC_POOL_SIZE,
        deadline: timedelta = DEFAULT_DEADLINE,
        clock: Clock = SYSTEM_CLOCK,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        defaults: JobOptions | None = None,
    ) -> SyncClient:
        """Open a pool of ``max_size`` connections on ``url`` (a migrated schema)."""
        db = SyncDatabase(
            url, schema=schema, min_size=min_size, max_size=max_size, deadline=deadline
        ).open()
        return cls(db, clock=clock, max_payload_bytes=max_payload_bytes, defaults=defaults)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- enqueue -----------------------------------------------------------

    def send(
        self,
        queue: str,
        data: Any = None,
        *,
        conn: SyncConn | None = None,
        **options: Unpack[SendOptions],
    ) -> JobId | None:
        """Enqueue one job; its id, or None when its ``singleton_key`` is taken.

        With ``conn`` (a psycopg 3 connection in a transaction), the job is
        written in that transaction and exists only if the caller commits.
        """
        job = self.builder.job(queue, data, options, "", carrier())
        (job_id,) = self.store.insert([job], now=self.clock.sql_now(), conn=conn)
        return job_id

    def insert(
        self, jobs: Iterable[Mapping[str, Any]], *, conn: SyncConn | None = None
    ) -> list[JobId | None]:
        """Enqueue many jobs in one statement: ``[{"queue", "data", **options}, ...]``.

        Ids in input order (None for a skipped singleton); one bad job writes nothing.
        """
        new_jobs = self.builder.jobs(jobs, carrier())
        return self.store.insert(new_jobs, now=self.clock.sql_now(), conn=conn)

    def insert_many(
        self,
        queue: str,
        payloads: Sequence[Any],
        *,
        singleton_keys: Sequence[str | None] | None = None,
        partition_keys: Sequence[str | None] | None = None,
        conn: SyncConn | None = None,
        **options: Unpack[SharedJobOptions],
    ) -> list[JobId | None]:
        """Enqueue many jobs of one queue sharing ``options``, in one statement."""
        jobs = self.builder.many(
            queue,
            payloads,
            options,
            singleton_keys=singleton_keys,
            partition_keys=partition_keys,
            trace=carrier(),
        )
        return self.store.insert(jobs, now=self.clock.sql_now(), conn=conn)

    def set_queue_defaults(self, queue: str, **options: Unpack[QueueDefaults]) -> None:
        """Store default options for every job sent to ``queue``, by any client or ``shoal.send``.

        A send that names an option keeps its own value. No options removes
        the queue's defaults. (``App.handler(..., retry_limit=...)`` stores
        its handler's defaults this way when a worker starts.)
        """
        self.store.set_queue_default(check_queue_name(queue), parse_queue_defaults(options))

    # -- inspection and control -------------------------------------------

    def get_job(self, job_id: JobId, *, conn: SyncConn | None = None) -> JobRecord:
        """A job as stored (live or archived); :class:`NotFound` when there is none."""
        record = self.store.get_job(job_id, conn=conn)
        if record is None:
            raise NotFound(f"job {job_id} does not exist")
        return record

    def cancel(
        self,
        ids: JobId | Sequence[JobId],
        *,
        by: str = DEFAULT_CANCELLED_BY,
        conn: SyncConn | None = None,
    ) -> set[JobId]:
        """Cancel waiting or active jobs, noting ``by``; returns those cancelled now.

        The workers holding active ones are told when the transaction commits.
        """
        listed = [ids] if isinstance(ids, int) else list(ids)
        return self.store.cancel(listed, by=by, now=self.clock.sql_now(), conn=conn)
