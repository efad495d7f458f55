"""One worker process of an :class:`~shoal.app.App`: what ``shoal worker`` runs.

:meth:`App.run <shoal.app.App.run>` stores the App's declarations (queue
defaults, schedules, batch kinds), starts its ingest pipeline and hands the
part this process serves (:meth:`App.select <shoal.app.App.select>`) to
:func:`run_process`, which runs it: the start hooks, a worker per queue and
batch kind, the duties this process may lead (shoal.db.leadership), the
ingest consumers and sinks, then the graceful stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from shoal.batch.aggregator import AGGREGATOR_DUTY, AGGREGATOR_QUEUE, AGGREGATOR_SCHEDULE
from shoal.batch.kind_worker import KindWorker
from shoal.batch.kinds import BatchKind
from shoal.batch.service import Batches
from shoal.ingest.consumer import DEFAULT_CONCURRENCY as DEFAULT_CONSUMER_CONCURRENCY
from shoal.ingest.pipeline import Pipeline
from shoal.ingest.postgres import QUEUE_PREFIX as TOPIC_QUEUE_PREFIX
from shoal.ingest.supervisor import run_ingest
from shoal.queue.client import Shoal
from shoal.queue.cron import CRON_DUTY
from shoal.queue.history import HISTORY_DUTY, HistorySampler
from shoal.queue.job import Handler, Job
from shoal.queue.maintenance import MAINTENANCE_DUTY
from shoal.queue.worker import Worker
from shoal.tracing import traced_apply

if TYPE_CHECKING:
    from shoal.app import App, Served

log = logging.getLogger("shoal.app")


async def run_process(
    app: App,
    boss: Shoal,
    served: Served,
    pipeline: Pipeline | None,
    *,
    stop: asyncio.Event,
    hurry: asyncio.Event | None,
    grace: timedelta,
    duties: tuple[bool, bool, bool],
) -> list[Worker]:
    """Run ``served`` in this process until ``stop`` is set, then shut down gracefully.

    ``app``'s declarations are stored already, and ``pipeline`` (None: the
    process runs no consumer or sink) started (:meth:`App.run`). ``duties``
    says which of maintenance, the scheduler and the aggregator this process
    contends for. Returns the workers stopped.
    """
    maintenance, scheduler, aggregator = duties
    for hook in app.start_hooks:
        await hook(boss)
    # This process's registry row (kept by the client from its first
    # worker on): named after the App, with the topics it consumes.
    registry = boss.process_registry()
    registry.app = app.name or ""
    registry.also_served = _consumed(served)
    loops: list[asyncio.Task[None]] = []
    workers = [
        boss.work(
            s.queue,
            s.handler,
            concurrency=s.concurrency,
            batch_size=s.batch_size,
            global_concurrency=s.limits.global_concurrency,
            rate_limit=s.limits.rate,
            partition_by=s.limits.partition_by,
        )
        for s in served.handlers
    ]
    batches = app.batches(boss)
    kind_workers: list[KindWorker] = []
    if app.kinds:
        await _drop_aggregator_schedule(boss)
        for kind in served.kinds.values():
            kind_workers.append(batches.work(kind.name))
            if kind.hook_queue is not None:
                workers.append(boss.work(kind.hook_queue, _on_complete(batches, kind)))
    if served.workflows:
        workflows = app.workflows(boss)
        workers.extend(workflows.work(name) for name in served.workflows)
    # Each duty runs in the one process that leads it; each term starts
    # it afresh (a new Maintenance counts silence from its own first pass).
    elector = boss.elector()
    led: list[tuple[str, Callable[[], Awaitable[None]]]] = []
    if scheduler:
        led.append((CRON_DUTY, lambda: boss.scheduler().run()))
    if maintenance:
        led.append((MAINTENANCE_DUTY, lambda: boss.maintenance().run()))
        led.append((HISTORY_DUTY, lambda: HistorySampler(boss).run()))
    if app.kinds and aggregator:
        led.append((AGGREGATOR_DUTY, batches.aggregator.run))
    for duty, work in led:
        loops.append(asyncio.create_task(elector.lead(duty, work), name=f"shoal-{duty}"))
    ingest_stop = asyncio.Event()
    ingest: asyncio.Task[None] | None = None
    if pipeline is not None:
        # A span per apply when tracing is on by now (shoal.tracing).
        consumers = [
            replace(c, apply=traced_apply(c.topic.name, c.apply)) for c in served.consumers
        ]
        ingest = asyncio.create_task(
            run_ingest(
                pipeline,
                consumers,
                served.sinks,
                app.ingest_settings,
                ingest_stop,
                grace=grace,
            ),
            name="shoal-ingest",
        )
        loops.append(ingest)
    queues = [w.queue for w in workers] + [k.worker.queue for k in kind_workers]
    log.info("running %d worker(s): %s", len(queues), ", ".join(queues))
    boss.register_process()  # also when only consumers run here
    try:
        await stop.wait()
    finally:
        log.info("stopping: finishing running jobs (grace %s)", grace)
        ingest_stop.set()
        # Every worker of this client, the kind workers' own included.
        running = boss.workers
        stopping: asyncio.Future[Any] = asyncio.ensure_future(
            asyncio.gather(boss.stop_workers(grace), *(k.stop(grace) for k in kind_workers))
        )
        hurried: asyncio.Future[Any] = asyncio.ensure_future((hurry or asyncio.Event()).wait())
        try:
            await asyncio.wait([stopping, hurried], return_when=asyncio.FIRST_COMPLETED)
            if not stopping.done():
                log.warning("stopping at once: handing back what still runs")
                for worker in running:
                    worker.hurry()
            await stopping
            if ingest is not None and not hurried.done():
                # Consumers finish their applies within the grace too.
                await asyncio.wait([ingest, hurried], timeout=grace.total_seconds())
        finally:
            hurried.cancel()
            for loop in loops:
                loop.cancel()
            for loop in loops:
                with contextlib.suppress(asyncio.CancelledError):
                    await loop
        jobs = sum(w.stats.handed_back for w in running)
        items = sum(k.runner.recorder.handed_back for k in kind_workers)
        log.info(
            "stopped: handed back %d job(s) and %d batch item(s), no attempt spent",
            jobs,
            items,
        )
    return workers


def _consumed(served: Served) -> dict[str, int]:
    """The topic queues a process's consumers and sinks serve, with their concurrency."""
    queues: dict[str, int] = {}
    for consumer in served.consumers:
        queue = f"{TOPIC_QUEUE_PREFIX}{consumer.topic.name}"
        queues[queue] = int(consumer.options.get("concurrency", DEFAULT_CONSUMER_CONCURRENCY))
    for sink in served.sinks:
        queues.setdefault(f"{TOPIC_QUEUE_PREFIX}{sink.topic.name}", 1)
    return queues


async def _drop_aggregator_schedule(boss: Shoal) -> None:
    """Remove the schedule that ran the aggregator's passes as jobs before the elector, and
    the pass it may have left waiting (the leader of AGGREGATOR_DUTY runs them now)."""
    if await boss.unschedule(AGGREGATOR_SCHEDULE):
        log.info("schedule %s: removed, the aggregator runs in its leader", AGGREGATOR_SCHEDULE)
    waiting = [j.id for j in await boss.jobs(AGGREGATOR_QUEUE) if j.state in ("created", "retry")]
    if waiting:
        await boss.cancel(waiting, by="shoal: the aggregator runs in its leader")


def _on_complete(batches: Batches, kind: BatchKind) -> Handler:
    hook = kind.on_complete
    assert hook is not None

    async def on_complete(job: Job) -> None:
        await hook(await batches.get(job.data["task_id"]))

    return on_complete
