"""``App``: what a worker process runs, declared in a few lines.

>>> app = App()
>>> @app.handler("email_send", concurrency=10)
... async def send_email(job: Job) -> None:
...     ...
>>> app.schedule("nightly_report", "0 0 3 * * *")

``shoal worker --app mymodule:app`` then runs every handler, the cron
scheduler and maintenance until SIGTERM or SIGINT, and shuts down gracefully:
it stops claiming, lets running jobs finish within the grace period, and hands
the rest back without spending an attempt.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Unpack

from shoal._deprecation import retry_limit_from_max_attempts
from shoal.batch.aggregator import AGGREGATOR_DUTY
from shoal.batch.kinds import (
    DEFAULT_CONCURRENCY as DEFAULT_BATCH_CONCURRENCY,
)
from shoal.batch.kinds import (
    DEFAULT_EXPIRE_IN,
    DEFAULT_RETRY_DELAY,
    DEFAULT_RETRY_LIMIT,
    DEFAULT_ZOMBIE_TIMEOUT,
    BatchKind,
    Classifier,
    ItemHandler,
    TaskHook,
    check_kind_limits,
)
from shoal.batch.service import Batches
from shoal.errors import InvalidInput, ShoalError
from shoal.ingest.consumer import Apply, WriteBatch
from shoal.ingest.message import Topic
from shoal.ingest.monitor import MONITOR_DUTY
from shoal.ingest.pipeline import Pipeline
from shoal.ingest.postgres import PostgresTransport
from shoal.ingest.supervisor import (
    ConsumerSpec,
    IngestSettings,
    SinkSpec,
    TransportFactory,
    start_pipeline,
)
from shoal.queue.client import Shoal
from shoal.queue.cron import CRON_DUTY, check_cron, check_timezone
from shoal.queue.history import HISTORY_DUTY
from shoal.queue.job import Handler, Job
from shoal.queue.limits import Limits, Partitioner, Rate, check_queue_limits
from shoal.queue.maintenance import MAINTENANCE_DUTY
from shoal.queue.options import (
    QueueDefaults,
    SendOptions,
    check_queue_name,
    parse_options,
    parse_queue_defaults,
)
from shoal.queue.threaded import is_async_callable
from shoal.queue.worker import DEFAULT_CONCURRENCY, DEFAULT_SHUTDOWN_GRACE, Worker
from shoal.worker_process import run_process
from shoal.workflow.runner import (
    DEFAULT_CONCURRENCY as DEFAULT_WORKFLOW_CONCURRENCY,
)
from shoal.workflow.runner import (
    DEFAULT_JOB_OPTIONS as DEFAULT_WORKFLOW_JOB_OPTIONS,
)
from shoal.workflow.runner import WorkflowFunction, WorkflowSpec, queue_of
from shoal.workflow.runtime import StepOptions, current_workflow
from shoal.workflow.service import Workflows

log = logging.getLogger("shoal.app")

# Every duty a worker process may lead (shoal.db.leadership), as ``shoal
# status`` lists them: its App's maintenance, cron, history sampler,
# aggregator (when it declares batch kinds) and backlog monitor (topics).
DUTIES = (CRON_DUTY, MAINTENANCE_DUTY, HISTORY_DUTY, AGGREGATOR_DUTY, MONITOR_DUTY)


StartHook = Callable[[Shoal], Awaitable[None]]
# Called by ``shoal api`` with the FastAPI app it built, the client and the
# bearer token (None when open): an application adds its own routes and pages.
ApiHook = Callable[[Any, Shoal, "str | None"], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    queue: str
    handler: Handler
    concurrency: int
    batch_size: int | None
    # Default options of every job sent to the queue (QueueDefaults), stored
    # for all senders when a worker starts.
    defaults: dict[str, Any] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)


@dataclass(frozen=True, slots=True)
class Served:
    """What one process of an App runs: its choice of the App's queues, kinds and topics."""

    handlers: list[HandlerSpec]
    kinds: dict[str, BatchKind]
    consumers: list[ConsumerSpec]
    sinks: list[SinkSpec]
    workflows: dict[str, WorkflowSpec] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    name: str
    cron: str
    data: Any
    queue: str | None
    tz: str
    options: dict[str, Any] = field(default_factory=dict)


class App:
    """A registry of handlers and schedules, run by ``shoal worker --app module:attr``."""

    def __init__(self, name: str | None = None) -> None:
        # Owns the schedules this App declares (see :meth:`schedule`);
        # ``shoal worker --app module:attr`` names an unnamed App by that spec.
        self.name = name
        self.handlers: dict[str, HandlerSpec] = {}
        self.schedules: dict[str, ScheduleSpec] = {}
        self.start_hooks: list[StartHook] = []
        self.api_hooks: list[ApiHook] = []
        self.kinds: dict[str, BatchKind] = {}
        self.consumers: list[ConsumerSpec] = []
        self.sinks: list[SinkSpec] = []
        self.workflow_specs: dict[str, WorkflowSpec] = {}
        self.ingest_settings = IngestSettings()
        self._pipeline: Pipeline | None = None

    def handler(
        self,
        queue: str,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        batch_size: int | None = None,
        global_concurrency: int | None = None,
        rate_limit: Rate | None = None,
        partition_by: str | Partitioner | None = None,
        **defaults: Unpack[QueueDefaults],
    ) -> Callable[[Handler], Handler]:
        """Register a handler for ``queue``, running at most ``concurrency`` jobs at once.

        ``concurrency`` counts in each worker process; ``global_concurrency``,
        ``rate_limit`` and ``partition_by`` limit the queue across all of them
        (see :meth:`Shoal.declare_limits` and docs/limits.md).

        ``defaults`` (``retry_limit``, ``retry_delay``, ``retry_backoff``,
        ``retry_delay_max``, ``expire_in``, ``priority``, ``dead_letter``)
        apply to every job sent to ``queue`` that does not name the option
        itself, whoever sends it: a worker's start stores them in the
        database (:meth:`Shoal.set_queue_defaults`), where every client,
        process and ``shoal.send()`` in SQL reads them. A handler declared
        without defaults removes its queue's stored ones when a worker starts.

        >>> app = App()
        >>> @app.handler("email_send", retry_limit=5, retry_backoff=True)
        ... def send_email(job: Job) -> None:
        ...     ...
        >>> @app.handler("poll", concurrency=50, global_concurrency=20, partition_by="account_id")
        ... async def poll(job: Job) -> None:
        ...     ...
        """
        check_queue_name(queue)
        if queue in self.handlers:
            raise InvalidInput("queue", f"{queue!r} already has a handler")
        parsed = parse_queue_defaults(defaults)
        limits = check_queue_limits(
            queue,
            Limits.of(
                global_concurrency=global_concurrency,
                rate_limit=rate_limit,
                partition_by=partition_by,
            ),
        )

        def register(fn: Handler) -> Handler:
            self.handlers[queue] = HandlerSpec(queue, fn, concurrency, batch_size, parsed, limits)
            return fn

        return register

    def schedule(
        self,
        name: str,
        cron: str,
        data: Any = None,
        *,
        queue: str | None = None,
        tz: str = "UTC",
        **options: Unpack[SendOptions],
    ) -> None:
        """Declare a cron schedule; it is created or updated when a worker starts.

        A named App (``App(name=...)``, or run by ``shoal worker --app
        module:attr``, which names it after that spec) owns the schedules it
        declares: when it starts, a schedule it declared before and declares
        no more is removed, so a schedule dropped from the code stops
        firing. An unnamed App removes nothing.
        """
        check_queue_name(name, field="name")
        check_cron(cron)
        check_timezone(tz)
        parse_options(options)
        self.schedules[name] = ScheduleSpec(name, cron, data, queue, tz, dict(options))

    def batch(
        self,
        kind: str,
        *,
        concurrency: int = DEFAULT_BATCH_CONCURRENCY,
        retry_limit: int = DEFAULT_RETRY_LIMIT,
        retry_delay: timedelta = DEFAULT_RETRY_DELAY,
        retry_backoff: bool = True,
        expire_in: timedelta = DEFAULT_EXPIRE_IN,
        zombie_timeout: timedelta = DEFAULT_ZOMBIE_TIMEOUT,
        on_complete: TaskHook | None = None,
        permanent: tuple[type[BaseException], ...] = (),
        classify: Classifier | None = None,
        global_concurrency: int | None = None,
        rate_limit: Rate | None = None,
        partition_by: str | Partitioner | None = None,
    ) -> Callable[[ItemHandler], ItemHandler]:
        """Declare a batch kind: ``handler(item)`` runs once per item of its tasks.

        ``concurrency`` counts in each worker process; ``global_concurrency``
        and ``rate_limit`` hold the kind's items across all of them, per key
        of ``partition_by`` (a field of the item's data, or a function of it)
        when it is given (see :class:`BatchKind` and docs/limits.md). Bad
        limits raise :class:`InvalidInput` here, naming the option.

        >>> app = App()
        >>> @app.batch("extract_paper", concurrency=10, retry_limit=3)
        ... async def extract(item):
        ...     return {"title": "..."}
        >>> @app.batch("call_model", concurrency=20, global_concurrency=4,
        ...            rate_limit=Rate(60, per=timedelta(minutes=1)))
        ... async def call_model(item):
        ...     item.report_cost(3)  # this run took 3 of the 60 a minute
        >>> @app.batch("per_account", global_concurrency=1, partition_by="account_id")
        ... async def per_account(item):
        ...     return {"account": item.data["account_id"]}  # one at a time per account
        """
        if kind in self.kinds:
            raise InvalidInput("kind", f"batch kind {kind!r} is already declared")
        check_kind_limits(
            kind,
            global_concurrency=global_concurrency,
            rate_limit=rate_limit,
            partition_by=partition_by,
        )

        def register(fn: ItemHandler) -> ItemHandler:
            self.kinds[kind] = BatchKind(
                name=kind,
                handler=fn,
                concurrency=concurrency,
                retry_limit=retry_limit,
                retry_delay=retry_delay,
                retry_backoff=retry_backoff,
                expire_in=expire_in,
                zombie_timeout=zombie_timeout,
                on_complete=on_complete,
                permanent=permanent,
                classify=classify,
                global_concurrency=global_concurrency,
                rate_limit=rate_limit,
                partition_by=partition_by,
            )
            return fn

        return register

    def consumer(self, topic: Topic[Any], **options: Any) -> Callable[[Apply[Any]], Apply[Any]]:
        """Declare ``apply(message)`` as the consumer of ``topic`` (see :class:`Consumer`).

        >>> readings = Topic("card.ingest")
        >>> @App().consumer(readings, concurrency=30)
        ... async def apply_reading(message):
        ...     ...
        """

        _retry_limit_option(options)

        def register(fn: Apply[Any]) -> Apply[Any]:
            _require_async(fn, "apply", topic.name)
            self.consumers.append(ConsumerSpec(topic, fn, dict(options)))
            return fn

        return register

    def sink(
        self, topic: Topic[Any], **options: Any
    ) -> Callable[[WriteBatch[Any]], WriteBatch[Any]]:
        """Declare ``write(messages)`` as the batch sink of ``topic`` (a :class:`BatchConsumer`)."""

        _retry_limit_option(options)

        def register(fn: WriteBatch[Any]) -> WriteBatch[Any]:
            _require_async(fn, "write", topic.name)
            self.sinks.append(SinkSpec(topic, fn, dict(options)))
            return fn

        return register

    def workflow(
        self,
        name: str,
        *,
        concurrency: int = DEFAULT_WORKFLOW_CONCURRENCY,
        expire_in: timedelta | None = None,
    ) -> Callable[[WorkflowFunction], WorkflowFunction]:
        """Declare a durable workflow ``fn(wf, input)``, its steps checkpointed (docs/workflows.md).

        Each run is resumed by a job of queue ``workflow.<name>``; a worker
        process runs at most ``concurrency`` of them at once. ``expire_in``
        bounds how long one job may run between two waits (15 minutes by
        default): a longer step calls ``wf`` through smaller steps.

        >>> app = App()
        >>> @app.workflow("onboard")
        ... async def onboard(wf, user_id):
        ...     await wf.step(send_welcome, user_id)
        ...     await wf.sleep(timedelta(days=3))
        """
        queue = check_queue_name(queue_of(name), field="name")
        if name in self.workflow_specs:
            raise InvalidInput("name", f"workflow {name!r} is already declared")
        if queue in self.handlers:
            raise InvalidInput("name", f"queue {queue!r} already has a handler")
        options = dict(DEFAULT_WORKFLOW_JOB_OPTIONS)
        if expire_in is not None:
            options["expire_in"] = expire_in
        parse_options(options)

        def register(fn: WorkflowFunction) -> WorkflowFunction:
            if not is_async_callable(fn):
                raise InvalidInput("fn", f"workflow {name!r} must be an async def function")
            self.workflow_specs[name] = WorkflowSpec(name, fn, concurrency, options)
            return fn

        return register

    def step(
        self,
        *,
        name: str | None = None,
        retry_limit: int = 0,
        retry_delay: timedelta = timedelta(0),
        retry_backoff: bool = False,
        transaction: bool = False,
    ) -> Callable[[Callable[..., Any]], Callable[..., Awaitable[Any]]]:
        """Make a function a workflow step: called inside a run, it is checkpointed.

        ``await fn(...)`` inside a workflow is ``await wf.step(fn, ...)`` with
        these options; called anywhere else, it simply runs.

        >>> app = App()
        >>> @app.step(retry_limit=3, retry_backoff=True)
        ... async def charge(order_id):
        ...     ...
        """
        options = StepOptions.of(name, retry_limit, retry_delay, retry_backoff, transaction)

        def wrap(fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
            @functools.wraps(fn)
            async def step(*args: Any, **kwargs: Any) -> Any:
                wf = current_workflow()
                if wf is not None:
                    return await wf.call(fn, args, kwargs, options)
                result = fn(*args, **kwargs)
                return await result if inspect.isawaitable(result) else result

            return step

        return wrap

    def workflows(self, boss: Shoal) -> Workflows:
        """The workflow API over ``boss`` for this app's workflows."""
        return Workflows(boss, self.workflow_specs, batches=self.batches(boss))

    def batches(self, boss: Shoal) -> Batches:
        """The batch API over ``boss`` for this app's kinds."""
        return Batches(boss, self.kinds)

    @property
    def pipeline(self) -> Pipeline:
        """The running worker's ingest pipeline, for applies that publish follow-up messages.

        Set when :meth:`run` starts (before the ``on_start`` hooks) in an app
        with consumers or sinks, on the transport :meth:`run` was given.
        """
        if self._pipeline is None:
            raise ShoalError(
                "app.pipeline exists once the app runs (shoal worker) and has consumers or "
                "sinks; use it from on_start hooks, handlers and applies"
            )
        return self._pipeline

    def on_start(self, hook: StartHook) -> StartHook:
        """Run ``hook(shoal)`` when a worker process starts, before it claims anything."""
        self.start_hooks.append(hook)
        return hook

    def on_api(self, hook: ApiHook) -> ApiHook:
        """Run ``hook(api, shoal, token)`` when ``shoal api --app`` has built its FastAPI app.

        The application mounts its own routes and pages there, behind the
        same token as ``/v1``.
        """
        self.api_hooks.append(hook)
        return hook

    def serves(self) -> list[str]:
        """The names :meth:`select` knows: handlers' queues, kinds, topics, workflows' queues."""
        names = [*self.handlers, *self.kinds, *(s.queue for s in self.workflow_specs.values())]
        names += [c.topic.name for c in self.consumers] + [s.topic.name for s in self.sinks]
        return sorted(set(names))

    def select(
        self, queues: Collection[str] | None = None, exclude_queues: Collection[str] = ()
    ) -> Served:
        """The part of this App one process runs (``shoal worker --queues/--exclude-queues``).

        ``queues`` names what to run (all when None), ``exclude_queues`` what
        not to: queues with a handler, batch kinds (by name) and topics (their
        consumers and sinks). A name the App does not declare raises
        :class:`InvalidInput` naming the ones it does, and so does a choice
        that leaves nothing to run.
        """
        known = self.serves()
        for field_name, names in (("queues", queues or ()), ("exclude_queues", exclude_queues)):
            unknown = sorted(set(names) - set(known))
            if unknown:
                raise InvalidInput(
                    field_name,
                    f"{', '.join(map(repr, unknown))} not declared by this app; "
                    f"it serves: {', '.join(known) or 'nothing'}",
                )
        chosen = set(known if queues is None else queues) - set(exclude_queues)
        served = Served(
            [s for s in self.handlers.values() if s.queue in chosen],
            {name: kind for name, kind in self.kinds.items() if name in chosen},
            [c for c in self.consumers if c.topic.name in chosen],
            [s for s in self.sinks if s.topic.name in chosen],
            {n: s for n, s in self.workflow_specs.items() if s.queue in chosen},
        )
        if known and not chosen:
            raise InvalidInput(
                "queues", f"selects nothing to run; this app serves: {', '.join(known)}"
            )
        return served

    async def run(
        self,
        boss: Shoal,
        *,
        stop: asyncio.Event,
        grace: timedelta = DEFAULT_SHUTDOWN_GRACE,
        maintenance: bool = True,
        scheduler: bool = True,
        aggregator: bool = True,
        transport: TransportFactory = PostgresTransport,
        queues: Collection[str] | None = None,
        exclude_queues: Collection[str] = (),
        hurry: asyncio.Event | None = None,
    ) -> list[Worker]:
        """Run until ``stop`` is set, then shut down gracefully. Returns the stopped workers.

        The topics are on ``transport`` unless :attr:`ingest_settings` names one.
        ``queues`` and ``exclude_queues`` choose what this process runs
        (:meth:`select`); every declaration (queue defaults, schedules, batch
        kinds) is stored whatever the choice. ``maintenance`` (lease expiry,
        archiving, the history sampler), ``scheduler`` (cron ticks) and
        ``aggregator`` (the batch aggregator's passes, when the App declares
        batch kinds) choose which of the cluster's duties this process
        contends for: each runs in one process at a time, the duty's leader
        (shoal.db.leadership). Setting ``hurry`` after ``stop`` cuts the grace short:
        running handlers are stopped at once and their work handed back.
        """
        served = self.select(queues, exclude_queues)
        for spec in self.schedules.values():
            await boss.schedule(
                spec.name, spec.cron, spec.data, queue=spec.queue, tz=spec.tz, **spec.options
            )
        for handler in self.handlers.values():
            # Before any start hook or handler sends: their sends get them too.
            await boss.set_queue_defaults(handler.queue, **handler.defaults)
        if self.kinds:
            # Likewise: SyncBatches and create_task() in SQL create tasks from these.
            await self.batches(boss).store_kinds()
        if self.name is not None:
            removed = await boss.schedule_store.adopt_schedules(self.name, list(self.schedules))
            for name in removed:
                log.warning("schedule %s: removed, app %s no longer declares it", name, self.name)
        if served.consumers or served.sinks:
            # Before the start hooks: they, handlers and applies may publish on it.
            self._pipeline = await start_pipeline(
                boss, self.ingest_settings, stop=stop, default_transport=transport
            )
            if self._pipeline is None:  # stopped while waiting for the transport
                return []
        try:
            return await run_process(
                self,
                boss,
                served,
                self._pipeline,
                stop=stop,
                hurry=hurry,
                grace=grace,
                duties=(maintenance, scheduler, aggregator),
            )
        finally:
            pipeline, self._pipeline = self._pipeline, None
            if pipeline is not None:
                await pipeline.close()


def _retry_limit_option(options: dict[str, Any]) -> None:
    """Turn a deprecated ``max_attempts=`` into ``retry_limit=``, warning at the caller's line."""
    if "max_attempts" in options:
        options["retry_limit"] = retry_limit_from_max_attempts(
            options.get("retry_limit"), options.pop("max_attempts"), stacklevel=3
        )


__all__ = ["App", "HandlerSpec", "Job", "ScheduleSpec"]


def _require_async(fn: object, field: str, topic: str) -> None:
    """Ingest applies share the producer's event loop (sync mode): they must be ``async def``."""
    if not is_async_callable(fn):
        raise InvalidInput(
            field, f"the consumer of topic {topic!r} must be an async def function, got {fn!r}"
        )
