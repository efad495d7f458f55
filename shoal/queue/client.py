"""``Shoal``: the queue's front door, with pg-boss's names.

>>> async with await Shoal.connect() as boss:            # doctest: +SKIP
...     job_id = await boss.send("email_send", {"user_id": 7}, retry_limit=3)
...     worker = boss.work("email_send", handle, concurrency=10)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Unpack

from shoal.clock import SYSTEM_CLOCK, Clock
from shoal.db.leadership import Elector, this_process
from shoal.db.migrate import migrate
from shoal.db.pool import AsyncConn, Database
from shoal.db.writes import STALL_ERROR_AFTER, WriteStallWatch
from shoal.errors import InvalidInput, ShoalError, UnstorableResult
from shoal.hooks import Hooks
from shoal.queue.admin import QueueAdmin
from shoal.queue.completer import Finalize
from shoal.queue.cursor import ClaimCursor
from shoal.queue.enqueue import MAX_INSERT, JobBuilder
from shoal.queue.fetcher import Claim
from shoal.queue.job import Handler, Job, error_entry
from shoal.queue.limit_store import LimitStore
from shoal.queue.limits import Limits, Partitioner, Rate, check_queue_limits
from shoal.queue.maintenance import Maintenance
from shoal.queue.notifier import Notifier
from shoal.queue.options import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    JobOptions,
    QueueDefaults,
    SendOptions,
    SharedJobOptions,
    check_queue_name,
    parse_queue_defaults,
)
from shoal.queue.registry import DEFAULT_RESCUE_AFTER, WorkerRegistry, check_rescue_after
from shoal.queue.results import callable_name
from shoal.queue.retry import SYSTEM_JITTER, Jitter, RetryPolicy, after_failure
from shoal.queue.rows import Failure, NewJob
from shoal.queue.schedule_store import ScheduleStore
from shoal.queue.statements import queue_queries
from shoal.queue.states import JobId, JobState
from shoal.queue.store import JobStore
from shoal.queue.threaded import as_async
from shoal.queue.worker import DEFAULT_CONCURRENCY, DEFAULT_POLL_INTERVAL, Worker
from shoal.tracing import carrier

log = logging.getLogger("shoal.cron")


class Shoal(QueueAdmin):
    """A connection to one shoal schema: send jobs, work them, inspect and control them.

    Inspection and control (cancel, limits, schedules, maintenance...) are the
    half it inherits from :class:`~shoal.queue.admin.QueueAdmin`.
    """

    def __init__(
        self,
        db: Database,
        *,
        clock: Clock = SYSTEM_CLOCK,
        jitter: Jitter = SYSTEM_JITTER,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        defaults: JobOptions | None = None,
        listen: bool = True,
        hooks: Hooks | None = None,
        register: bool = True,
        write_stall_after: timedelta = STALL_ERROR_AFTER,
        rescue_after: timedelta = DEFAULT_RESCUE_AFTER,
    ) -> None:
        self.db = db
        # How long this process may go without a registry heartbeat before
        # maintenance (in any process) hands back the jobs it holds.
        self.rescue_after = check_rescue_after(rescue_after)
        # Observers of everything this client's workers, aggregator and
        # consumers do (shoal.testing.Probe registers here).
        self.hooks = hooks if hooks is not None else Hooks()
        self.clock = clock
        self.jitter = jitter
        # Validation and job rows, shared with SyncClient.
        self.builder = JobBuilder(max_payload_bytes=max_payload_bytes, defaults=defaults)
        self.max_payload_bytes = max_payload_bytes
        self.defaults = self.builder.defaults
        # The layer's stores, each for one concern, on one parse of queries.sql.
        queries = queue_queries(db.schema)
        self.store = JobStore(db, queries)
        self.limit_store = LimitStore(db, queries)
        self.schedule_store = ScheduleStore(db, queries)
        self.notifier: Notifier | None = (
            Notifier(db, self.store.channel, clock=clock, cancel_channel=self.store.cancel_channel)
            if listen
            else None
        )
        self._workers: list[Worker] = []
        # This process's row in the worker registry, kept while it has
        # workers (register=False: none).
        self._register = register
        self._registry: WorkerRegistry | None = None
        self._registry_task: asyncio.Task[None] | None = None
        # A registered process also watches its commits (WriteStallWatch):
        # one ERROR once they have stalled this long.
        self.write_stall_after = write_stall_after
        # The maintenance of maintain()'s passes (made by the first).
        self._maintenance: Maintenance | None = None
        # This process's side of the cluster's duties (elector(): made by the first call).
        self._elector: Elector | None = None

    @classmethod
    async def connect(
        cls, url: str, *, schema: str = "shoal", run_migrations: bool = True, **kwargs: Any
    ) -> Shoal:
        """Open a pool on ``url`` and (by default) bring the schema up to date."""
        pool_keys = {"min_size", "max_size", "deadline", "application_name", "prepare_threshold"}
        db = Database(url, schema=schema, **{k: v for k, v in kwargs.items() if k in pool_keys})
        await db.open()
        if run_migrations:
            await migrate(db)
        return cls(db, **{k: v for k, v in kwargs.items() if k not in pool_keys})

    async def close(self) -> None:
        for worker in list(self._workers):
            await worker.stop()
        await self._leave_registry()
        if self._elector is not None:
            await self._elector.close()  # resigns: the other processes take over at once
        if self.notifier is not None:
            await self.notifier.stop()
        await self.db.close()

    async def __aenter__(self) -> Shoal:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- enqueue -----------------------------------------------------------

    def _new_job(
        self,
        queue: object,
        data: object,
        options: Mapping[str, Any],
        field: str,
        trace: Mapping[str, str] | None = None,
        *,
        template: bool = False,
    ) -> NewJob:
        return self.builder.job(queue, data, options, field, trace, template=template)

    async def send(
        self,
        queue: str,
        data: Any = None,
        *,
        conn: AsyncConn | None = None,
        **options: Unpack[SendOptions],
    ) -> JobId | None:
        """Enqueue one job; its id, or None when its ``singleton_key`` is taken.

        With ``conn``, the job is written in the caller's open transaction and
        commits (and wakes workers) with it.
        """
        job = self._new_job(queue, data, options, "", carrier())
        (job_id,) = await self.store.insert([job], now=self.clock.sql_now(), conn=conn)
        return job_id

    async def insert(
        self, jobs: Iterable[Mapping[str, Any]], *, conn: AsyncConn | None = None
    ) -> list[JobId | None]:
        """Enqueue many jobs in one statement: ``[{"queue", "data", **options}, ...]``.

        Returns ids in input order (None for a skipped singleton). All are
        validated first; one bad job writes nothing.
        """
        new_jobs = self.builder.jobs(jobs, carrier())
        return await self.store.insert(new_jobs, now=self.clock.sql_now(), conn=conn)

    async def insert_many(
        self,
        queue: str,
        payloads: Sequence[Any],
        *,
        singleton_keys: Sequence[str | None] | None = None,
        partition_keys: Sequence[str | None] | None = None,
        conn: AsyncConn | None = None,
        **options: Unpack[SharedJobOptions],
    ) -> list[JobId | None]:
        """Enqueue many jobs of one queue sharing ``options``, in one statement.

        The fast path of :meth:`insert` for fan-out: the options are validated
        once, each payload on its own. ``singleton_keys`` and
        ``partition_keys``, when given, hold one key (or None) per payload.
        """
        jobs = self.builder.many(
            queue,
            payloads,
            options,
            singleton_keys=singleton_keys,
            partition_keys=partition_keys,
            trace=carrier(),
        )
        return await self.store.insert(jobs, now=self.clock.sql_now(), conn=conn)

    async def insert_json(
        self,
        queue: str,
        payloads: Sequence[str],
        *,
        conn: AsyncConn | None = None,
        **options: Unpack[SharedJobOptions],
    ) -> list[JobId | None]:
        """:meth:`insert_many` for payloads that are already JSON text, checked by the caller.

        For layers that build their own JSON (ingest envelopes): each text
        must be one JSON value without NUL characters, within the payload cap.
        """
        if len(payloads) > MAX_INSERT:
            raise InvalidInput("payloads", f"more than {MAX_INSERT} jobs in one insert")
        if "singleton_key" in options:
            raise InvalidInput("singleton_key", "insert_json takes no singleton keys")
        template = self._new_job(queue, None, options, "", template=True)
        self.check_payload_sizes(payloads)
        jobs = [
            NewJob(template.settings, text, None, template.partition_key, template.cost)
            for text in payloads
        ]
        return await self.store.insert(jobs, now=self.clock.sql_now(), conn=conn)

    def check_payload_sizes(self, payloads: Sequence[str]) -> None:
        """Refuse, by position, a JSON payload text over the payload cap."""
        self.builder.check_payload_sizes(payloads)

    async def set_queue_defaults(self, queue: str, **options: Unpack[QueueDefaults]) -> None:
        """Store default options for every job sent to ``queue``, from any process.

        Every sender sees them (this client, other processes, ``SyncClient``
        and the SQL function ``shoal.send``): an option a send names keeps
        its value, the others take the queue's default, then the client's.
        No options removes the queue's defaults. ``App.handler(...,
        retry_limit=...)`` stores its handler's defaults this way when a
        worker starts.
        """
        await self.store.set_queue_default(check_queue_name(queue), parse_queue_defaults(options))

    async def queue_defaults(self, queue: str) -> dict[str, Any]:
        """The default options stored for ``queue`` (empty when it has none)."""
        row = await self.store.queue_default(check_queue_name(queue))
        return {} if row is None else dict(row.options)

    # -- working -----------------------------------------------------------

    def work(
        self,
        queue: str,
        handler: Handler,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        batch_size: int | None = None,
        poll_interval: timedelta = DEFAULT_POLL_INTERVAL,
        claim: Claim | None = None,
        claim_cursor: ClaimCursor[Any] | None = None,
        finalize: Finalize | None = None,
        store_output: bool = True,
        global_concurrency: int | None = None,
        rate_limit: Rate | None = None,
        partition_by: str | Partitioner | None = None,
        max_hold: timedelta | None = None,
        keys_given: bool = False,
    ) -> Worker:
        """Start running ``handler`` on ``queue`` in this process; returns the running worker.

        At most ``concurrency`` handlers run at once in this process. With
        limits (``global_concurrency``, ``rate_limit``, ``partition_by``; see
        :meth:`declare_limits` and docs/limits.md), the worker declares them
        before its first claim and claims only what they let start, across
        every process. Stop it with
        ``await worker.stop()`` (or :meth:`close`). ``claim``, if given, claims
        jobs in place of the store's claim (a layer above sets its rows up in
        the same statement) while the queue has no limits: while another
        process's declaration gives it some, the limited claim takes its
        place, and ``handler`` gets jobs claimed as any queue's.
        ``claim_cursor`` is the position such a claim keeps in its queue, if
        it keeps one (shoal.queue.cursor); ``finalize``
        records each batch of completed jobs in place of the worker's own
        write (see ``shoal.queue.worker``).
        With ``store_output=False`` handlers' return values are not kept on
        the job rows. ``max_hold`` bounds the claimed jobs the worker holds
        unstarted to what its runners start in that long at the current rate
        (at most a quarter of a job's lease in any case). ``keys_given=True``
        says a layer above sends every job of ``queue`` with its partition
        key (``partition_key=``), as the batch layer sends a kind's item jobs
        keyed by their items: ``partition_by`` is then declared with the
        limits, never run on what this client sends, and may partition a
        batch kind's queue.
        """
        check_queue_name(queue)
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidInput("concurrency", f"must be an integer >= 1, got {concurrency!r}")
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise InvalidInput("batch_size", f"must be an integer >= 1, got {batch_size!r}")
        limits = Limits.of(
            global_concurrency=global_concurrency, rate_limit=rate_limit, partition_by=partition_by
        )
        if keys_given:
            self.builder.partitioners.pop(queue, None)
        else:
            check_queue_limits(queue, limits)
        if limits and claim is not None:
            raise InvalidInput("claim", "a worker with limits claims through the limited claim")
        if limits and not keys_given:
            self._register_partitioner(queue, limits)
        name = callable_name(handler)
        handler = as_async(handler, threads=concurrency, name=queue)
        if self.notifier is not None:
            self.notifier.start()
        worker = Worker(
            self.store,
            queue,
            handler,
            concurrency=concurrency,
            batch_size=batch_size,
            poll_interval=poll_interval,
            clock=self.clock,
            jitter=self.jitter,
            notifier=self.notifier,
            claim=claim,
            claim_cursor=claim_cursor,
            finalize=finalize,
            store_output=store_output,
            hooks=self.hooks,
            limits=limits or None,
            max_hold=max_hold,
            handler_name=name,
            limit_store=self.limit_store,
        )
        worker.start()
        self._workers.append(worker)
        if self._register:
            self.register_process()
        return worker

    @property
    def workers(self) -> list[Worker]:
        """The workers this client runs now (:meth:`work`), a copy."""
        return list(self._workers)

    async def stop_workers(self, grace: timedelta) -> None:
        """Stop every worker of this client gracefully, together."""
        await asyncio.gather(*(w.stop(grace) for w in self._workers))
        self._workers.clear()
        await self._leave_registry()

    def process_registry(self) -> WorkerRegistry:
        """This process's row in the worker registry (the Workers page).

        The first :meth:`work` registers it and it heartbeats while the client
        has workers: the queues they serve, the jobs they run now (per queue:
        the history's running line) and have done. ``shoal worker`` names it
        after its App and adds the topics its consumers serve.
        """
        if self._registry is None:
            self._registry = WorkerRegistry(
                self,
                queues=self._served,
                counters=self._counters,
                rescue_after=self.rescue_after,
            )
        return self._registry

    def register_process(self) -> None:
        """Register this process in the worker registry and heartbeat until its
        workers stop (:meth:`work` does it; a process with none calls it)."""
        if self._registry_task is None:
            self.store.holder_known = asyncio.Event()
            self._registry_task = asyncio.create_task(self._keep_process(), name="shoal-registry")

    async def _keep_process(self) -> None:
        """The registry's heartbeat, and the watch on this process's commits, until cancelled.

        The watch is the one place a stall is escalated: the loops that write
        (claims, completions, heartbeats) each only log their own timeouts.
        """
        watch = WriteStallWatch(self.db, clock=self.clock, error_after=self.write_stall_after)
        try:
            await asyncio.gather(self.process_registry().run(), watch.run())
        finally:
            await watch.close()

    def _served(self) -> dict[str, int]:
        served = dict(self.process_registry().also_served)
        for worker in self._workers:
            served[worker.queue] = served.get(worker.queue, 0) + worker.concurrency
        return served

    def _counters(self) -> tuple[dict[str, int], int]:
        running: dict[str, int] = {}
        for worker in self._workers:
            running[worker.queue] = running.get(worker.queue, 0) + worker.in_flight
        done = sum(w.stats.completed + w.stats.failed for w in self._workers)
        return running, done

    async def _leave_registry(self) -> None:
        """Stop heartbeating and remove this process's row (it goes by its
        timeout instead when the database cannot be reached)."""
        task, self._registry_task = self._registry_task, None
        if task is None:
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if self._registry is not None:
            try:
                await self._registry.deregister()
            except ShoalError as exc:  # the row is dropped after DROP_S instead
                log.warning("could not remove this process from the worker registry: %s", exc)

    async def fetch(self, queue: str, batch_size: int = 1) -> list[Job]:
        """Claim up to ``batch_size`` jobs to process outside ``work`` (pg-boss ``fetch``).

        Finish each with :meth:`complete` or :meth:`fail` before its ``expire_in``
        runs out, or maintenance hands it to another worker.
        """
        check_queue_name(queue)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidInput("batch_size", f"must be an integer >= 1, got {batch_size!r}")
        # The limited claim: it honours the queue's limits when it has any,
        # and claims as the plain one does when it has none.
        claims = await self.store.claim_limited(queue, batch_size, now=self.clock.sql_now())
        return [Job(claim, self.heartbeat) for claim in claims]

    async def heartbeat(self, job: Job) -> bool:
        """Extend an active job's lease by its ``expire_in``; False if it is no longer held."""
        held = await self.store.extend_leases([(job.id, job.attempt)], now=self.clock.sql_now())
        return job.id in held

    async def complete(self, job: Job | JobId, output: Any = None) -> bool:
        """Mark an active job completed; False when it is no longer active under that attempt."""
        job_id, attempt, _ = await self._fence(job)
        try:
            won = await self.store.complete([(job_id, attempt, output)], now=self.clock.sql_now())
        except UnstorableResult as exc:
            raise InvalidInput("output", str(exc)) from None
        return job_id in won

    async def fail(self, job: Job | JobId, error: BaseException | str) -> JobState | None:
        """Record a failed attempt of an active job: ``retry`` or ``failed`` by its policy.

        Returns the new state, or None when the job was no longer active under that attempt.
        """
        job_id, attempt, policy = await self._fence(job)
        exc = error if isinstance(error, BaseException) else RuntimeError(error)
        now = self.clock.now()
        step = after_failure(attempt, policy, now, self.jitter)
        failure = Failure(
            job_id,
            attempt,
            step.state,
            None if step.start_after is None else step.start_after - now,
            error_entry(attempt, exc, now.isoformat()),
        )
        states = await self.store.fail([failure], now=self.clock.sql_now())
        return states.get(job_id)

    async def _fence(self, job: Job | JobId) -> tuple[JobId, int, RetryPolicy]:
        if isinstance(job, Job):
            return job.id, job.attempt, job.claim.policy
        record = await self.get_job(job)
        return record.id, record.attempt, record.policy

    def elector(self) -> Elector:
        """This client's side of the once-per-cluster duties (maintenance, cron, the
        history sampler, the aggregator, the backlog monitor): one connection of
        its own, on which it leads the duties it wins (shoal.db.leadership)."""
        if self._elector is None:
            self._elector = Elector(self.db, clock=self.clock, identity=this_process())
        return self._elector
