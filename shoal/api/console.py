"""The console's ``/v1`` routes: queues, jobs, schedules and topics, to list and control.

Every route is a thin translation of one :class:`~shoal.console.queues.QueueInspector`
or :class:`~shoal.console.topics.TopicInspector` call; the SQL and the rules
live in those layers. An unknown queue, job, schedule or topic answers 404
naming the field (a name's message lists the known ones), a bad cursor or
state 422, a job in the wrong state for the action 409; nothing changes.

The lists (``/queues``, ``/jobs``, ``/schedules``, ``/overview`` and
``/history``) leave out shoal's own queues and schedules (names starting
with ``shoal.``) unless asked with ``?internal=true``; ``/jobs/{id}`` shows
any job.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query

from shoal.api.console_contract import (
    BulkDone,
    DeadPageOut,
    Deleted,
    Discarded,
    HistoryOut,
    JobOut,
    JobPageOut,
    OverviewOut,
    QueueAction,
    QueueList,
    Redrive,
    Redriven,
    ScheduleAction,
    ScheduleList,
    TopicList,
    WorkerDetailOut,
    WorkerList,
)
from shoal.api.errors import ApiError, ErrorBody
from shoal.console.history import (
    ALL_QUEUES,
    EVERY_QUEUE,
    SERIES,
    WINDOWS,
    History,
    Sample,
    parse_series,
    parse_window,
)
from shoal.console.queues import DEFAULT_PAGE, MAX_PAGE, QueueInspector, QueueSummary, ScheduleInfo
from shoal.console.store import RunningWork
from shoal.console.topics import MAX_PAGE as MAX_DEAD_PAGE
from shoal.console.topics import TopicInspector
from shoal.console.why import job_reason
from shoal.console.workers import DEFAULT_RUNNING, MAX_RUNNING, WorkerInspector
from shoal.db.writes import CachedWriteCheck, WriteCheck
from shoal.ingest.postgres import QUEUE_PREFIX as TOPIC_QUEUE_PREFIX
from shoal.ingest.store import DeadLetter
from shoal.ingest.transport import Transport
from shoal.queue.registry import WorkerRegistry
from shoal.queue.rows import JobRecord, WorkerInfo
from shoal.queue.store import MAX_CANCELLED_BY

# Job ids are Postgres bigints: a larger one would fail in the driver.
MAX_ID = 2**63 - 1
NAME = Annotated[str, Path(min_length=1, max_length=200)]
JOB_ID = Annotated[int, Path(ge=1, le=MAX_ID)]
DEAD_ID = Annotated[
    int, Path(ge=1, le=MAX_ID, description="The dead letter's id (not its message's).")
]
CANCELLED_BY = Annotated[
    str,
    Query(
        description="Who cancels the job, as noted on its history.",
        min_length=1,
        max_length=MAX_CANCELLED_BY,
    ),
]
WINDOW = Annotated[str, Query(description=f"One of {', '.join(WINDOWS)}.", max_length=10)]
INTERNAL = Annotated[
    bool,
    Query(description="Show shoal's own queues and schedules too (names starting 'shoal.')."),
]

# What a topic redrive publishes on: built (and started) on first use.
TransportSource = Callable[[], Awaitable[Transport]]


class LazyTransport:
    """A transport made and started on the first redrive, closed by :meth:`close`.

    An API that never redrives never connects to the transport (a NATS server
    need not be up for the console to serve).
    """

    def __init__(self, make: Callable[[], Transport]) -> None:
        self._make = make
        self._transport: Transport | None = None
        self._lock = asyncio.Lock()

    async def __call__(self) -> Transport:
        async with self._lock:
            if self._transport is None:
                transport = self._make()
                await transport.start()
                self._transport = transport
            return self._transport

    async def close(self) -> None:
        if self._transport is not None:
            transport, self._transport = self._transport, None
            await transport.close()


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorBody} for status in statuses}


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat()


def queue_dict(q: QueueSummary) -> dict[str, Any]:
    return {
        "queue": q.queue,
        "counts": q.counts,
        "oldest_waiting_s": q.oldest_waiting_s,
        "paused": q.paused,
        "paused_at": _iso(q.paused_at),
        "completed_5m": q.completed_5m,
        "failed_5m": q.failed_5m,
        "throughput_per_min": q.throughput_per_min,
        "estimated": list(q.estimated),
    }


def database_dict(check: WriteCheck) -> dict[str, str]:
    return {"state": check.state.value, "message": check.message}


def job_summary(job: JobRecord) -> dict[str, Any]:
    return {
        "id": job.id,
        "queue": job.queue,
        "state": job.state.value,
        "attempt": job.attempt,
        "retry_limit": job.policy.retry_limit,
        "priority": job.priority,
        "singleton_key": job.singleton_key,
        "created_at": job.created_at.isoformat(),
        "started_at": _iso(job.started_at),
        "finished_at": _iso(job.finished_at),
        "error": job.errors[-1].message if job.errors else None,
    }


def job_detail(job: JobRecord) -> dict[str, Any]:
    started, finished = job.started_at, job.finished_at
    return {
        **job_summary(job),
        "data": job.data,
        "output": job.output,
        "errors": [
            {
                "attempt": e.attempt,
                "at": e.at,
                "type": e.type,
                "message": e.message,
                "traceback": e.traceback,
            }
            for e in job.errors
        ],
        "start_after": job.start_after.isoformat(),
        "lease_expires_at": _iso(job.lease_expires_at),
        "holder": job.holder,
        "dead_letter": job.dead_letter,
        "origin_queue": job.origin_queue,
        "origin_id": job.origin_id,
        "retry_delay_s": job.policy.retry_delay.total_seconds(),
        "retry_backoff": job.policy.retry_backoff,
        "retry_delay_max_s": job.policy.retry_delay_max.total_seconds(),
        "expire_in_s": job.expire_in.total_seconds(),
        "wait_s": None if started is None else (started - job.created_at).total_seconds(),
        "run_s": (
            None
            if started is None or finished is None or finished < started
            else (finished - started).total_seconds()
        ),
    }


def schedule_dict(s: ScheduleInfo) -> dict[str, Any]:
    return {
        "name": s.name,
        "queue": s.queue,
        "cron": s.cron,
        "timezone": s.timezone,
        "data": s.data,
        "paused": s.paused_at is not None,
        "paused_at": _iso(s.paused_at),
        "owner": s.owner,
        "last_run": s.last_tick.isoformat(),
        "next_run": _iso(s.next_tick),
        "last_job_id": s.last_job_id,
        "last_job_state": None if s.last_job_state is None else s.last_job_state.value,
        "created_at": s.created_at.isoformat(),
        "updated_at": s.updated_at.isoformat(),
    }


def dead_dict(letter: DeadLetter) -> dict[str, Any]:
    return {
        "id": letter.id,
        "message_id": letter.message_id,
        "reason": letter.reason,
        "error": letter.error,
        "attempt": letter.attempt,
        "dead_at": letter.dead_at.isoformat(),
        "redriven_at": _iso(letter.redriven_at),
        "envelope": json.loads(letter.envelope_json),
    }


def queues_router(queues: QueueInspector) -> APIRouter:
    router = APIRouter(tags=["queues"])

    @router.get("/queues", response_model=QueueList, responses=_errors(401))
    async def list_queues(internal: INTERNAL = False) -> dict[str, Any]:
        """Every queue: jobs per state, oldest wait, pause, recent throughput."""
        return {"queues": [queue_dict(q) for q in await queues.queues(internal=internal)]}

    @router.post(
        "/queues/{name}/pause", response_model=QueueAction, responses=_errors(401, 403, 404)
    )
    async def pause_queue(name: NAME) -> dict[str, Any]:
        """Stop every process claiming from the queue (running jobs finish)."""
        await queues.pause_queue(name)
        return {"queue": name, "paused": True}

    @router.post(
        "/queues/{name}/resume", response_model=QueueAction, responses=_errors(401, 403, 404)
    )
    async def resume_queue(name: NAME) -> dict[str, Any]:
        await queues.resume_queue(name)
        return {"queue": name, "paused": False}

    @router.post(
        "/queues/{name}/retry-failed", response_model=BulkDone, responses=_errors(401, 403, 404)
    )
    async def retry_failed(name: NAME) -> dict[str, Any]:
        """Every failed job of the queue to run again now; ``count`` says how many."""
        return {"queue": name, "count": await queues.retry_failed(name)}

    @router.post(
        "/queues/{name}/delete-failed", response_model=BulkDone, responses=_errors(401, 403, 404)
    )
    async def delete_failed(name: NAME) -> dict[str, Any]:
        """Delete every failed job of the queue; ``count`` says how many."""
        return {"queue": name, "count": await queues.delete_failed(name)}

    return router


def jobs_router(queues: QueueInspector) -> APIRouter:
    router = APIRouter(tags=["jobs"])

    @router.get("/jobs", response_model=JobPageOut, responses=_errors(401, 404, 422))
    async def list_jobs(
        queue: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
        state: Annotated[str | None, Query(max_length=20)] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
        cursor: Annotated[str | None, Query(max_length=40)] = None,
        q: Annotated[str | None, Query(max_length=200)] = None,
        internal: INTERNAL = False,
    ) -> dict[str, Any]:
        """Jobs, failed first, then newest first; ``q`` finds by id or singleton key."""
        page = await queues.jobs(
            queue=queue, state=state, limit=limit, cursor=cursor, q=q, internal=internal
        )
        return {"jobs": [job_summary(j) for j in page.jobs], "next_cursor": page.next_cursor}

    @router.get("/jobs/{job_id}", response_model=JobOut, responses=_errors(401, 404, 422))
    async def get_job(job_id: JOB_ID) -> dict[str, Any]:
        """One job (live or archived): payload, output, every attempt's error and
        history note, timings, and why it is where it is (``reason``)."""
        job = await queues.job(job_id)
        paused_at = await queues.queue_paused_at(job.queue)
        now = queues.clock.now()
        reason = job_reason(job, now=now, queue_paused=paused_at is not None)
        return {
            **job_detail(job),
            "reason": reason.value,
            "queue_paused_at": _iso(paused_at),
            "now": now.isoformat(),
        }

    @router.post(
        "/jobs/{job_id}/retry", response_model=JobOut, responses=_errors(401, 403, 404, 409)
    )
    async def retry_job(job_id: JOB_ID) -> dict[str, Any]:
        """A failed or cancelled job runs again now (409 in any other state)."""
        return job_detail(await queues.retry_job(job_id))

    @router.post(
        "/jobs/{job_id}/cancel", response_model=JobOut, responses=_errors(401, 403, 404, 409)
    )
    async def cancel_job(job_id: JOB_ID, by: CANCELLED_BY = "api") -> dict[str, Any]:
        """A waiting or active job is cancelled (409 once it finished); an active one's
        handler is stopped. ``by`` (who cancelled it) goes on the job's history."""
        return job_detail(await queues.cancel_job(job_id, by=by))

    @router.delete("/jobs/{job_id}", response_model=Deleted, responses=_errors(401, 403, 404, 409))
    async def delete_job(job_id: JOB_ID) -> dict[str, Any]:
        """Delete a job that is not running (409 while active: cancel it first)."""
        await queues.delete_job(job_id)
        return {"id": job_id, "deleted": True}

    return router


def schedules_router(queues: QueueInspector) -> APIRouter:
    router = APIRouter(tags=["schedules"])

    @router.get("/schedules", response_model=ScheduleList, responses=_errors(401))
    async def list_schedules(internal: INTERNAL = False) -> dict[str, Any]:
        schedules = await queues.schedules(internal=internal)
        return {"schedules": [schedule_dict(s) for s in schedules]}

    @router.post(
        "/schedules/{name}/pause", response_model=ScheduleAction, responses=_errors(401, 403, 404)
    )
    async def pause_schedule(name: NAME) -> dict[str, Any]:
        """Stop the schedule ticking, in every process, until resumed."""
        await queues.pause_schedule(name)
        return {"name": name, "paused": True}

    @router.post(
        "/schedules/{name}/resume", response_model=ScheduleAction, responses=_errors(401, 403, 404)
    )
    async def resume_schedule(name: NAME) -> dict[str, Any]:
        """Tick again from the next tick after now (ticks missed while paused are not sent)."""
        await queues.resume_schedule(name)
        return {"name": name, "paused": False}

    @router.delete(
        "/schedules/{name}", response_model=ScheduleAction, responses=_errors(401, 403, 404)
    )
    async def remove_schedule(name: NAME) -> dict[str, Any]:
        await queues.remove_schedule(name)
        return {"name": name, "removed": True}

    return router


def topics_router(
    topics: TopicInspector, transport: TransportSource | None, registry: WorkerRegistry
) -> APIRouter:
    router = APIRouter(tags=["topics"])

    @router.get("/topics", response_model=TopicList, responses=_errors(401))
    async def list_topics() -> dict[str, Any]:
        """Every topic: backlog as the monitor last saw it, pause flag, dead letters waiting."""
        consumers: dict[str, int] = {}
        for worker in await registry.workers():
            for queue, concurrency in worker.queues.items():
                if not worker.gone and queue.startswith(TOPIC_QUEUE_PREFIX):
                    topic = queue.removeprefix(TOPIC_QUEUE_PREFIX)
                    consumers[topic] = consumers.get(topic, 0) + concurrency
        out = []
        for t in await topics.topics():
            out.append(
                {
                    "topic": t.topic,
                    "depth": t.depth,
                    "ready": t.ready,
                    "in_flight": t.in_flight,
                    "delayed": t.delayed,
                    "oldest_age_s": t.oldest_age_s,
                    "wait_s": t.wait_s,
                    "paused": t.paused,
                    "checked_at": _iso(t.checked_at),
                    "dead": t.dead,
                    "consumers": consumers.get(t.topic, 0),
                }
            )
        return {"topics": out}

    @router.get("/topics/{name}/dead", response_model=DeadPageOut, responses=_errors(401, 404, 422))
    async def dead_letters(
        name: NAME,
        limit: Annotated[int, Query(ge=1, le=MAX_DEAD_PAGE)] = 50,
        cursor: Annotated[str | None, Query(max_length=40)] = None,
        all: Annotated[bool, Query(description="Include redriven letters.")] = False,
    ) -> dict[str, Any]:
        """A topic's dead letters with their errors, oldest first."""
        page = await topics.dead(name, limit=limit, cursor=cursor, include_redriven=all)
        return {"dead": [dead_dict(d) for d in page.letters], "next_cursor": page.next_cursor}

    @router.delete(
        "/topics/{name}/dead/{dead_id}",
        response_model=Discarded,
        responses=_errors(401, 403, 404, 422),
    )
    async def discard_dead_letter(name: NAME, dead_id: DEAD_ID) -> dict[str, Any]:
        """Delete one dead letter for good (waiting or redriven); on the postgres
        transport, with the failed job its message left in the topic's queue."""
        message_id = await topics.discard(name, dead_id)
        return {"topic": name, "id": dead_id, "message_id": message_id, "discarded": True}

    @router.post(
        "/topics/{name}/redrive",
        response_model=Redriven,
        responses=_errors(401, 403, 404, 422, 503),
    )
    async def redrive(name: NAME, body: Redrive | None = None) -> dict[str, Any]:
        """Publish the topic's waiting dead letters again: those of ``ids``, or all."""
        await topics.require_topic(name)
        if transport is None:
            raise ApiError(503, "this API has no ingest transport to publish on")
        count = await topics.redrive(
            name, await transport(), ids=None if body is None else body.ids
        )
        return {"topic": name, "redriven": count}

    return router


def history_dict(
    queue: str, window: str, resolution: int, samples: list[Sample], series: list[str]
) -> dict[str, Any]:
    return {
        "queue": queue,
        "window": window,
        "resolution_s": resolution,
        "at": [s.at.isoformat() for s in samples],
        "series": {name: [s.value(name) for s in samples] for name in series},
    }


def worker_dict(w: WorkerInfo) -> dict[str, Any]:
    return {
        "id": w.id,
        "host": w.host,
        "pid": w.pid,
        "app": w.app,
        "queues": w.queues,
        "started_at": w.started_at.isoformat(),
        "heartbeat_at": w.heartbeat_at.isoformat(),
        "running": w.running,
        "done": w.done,
        "gone": w.gone,
        "rescued": w.rescued,
        "rescued_at": _iso(w.rescued_at),
    }


def running_dict(r: RunningWork) -> dict[str, Any]:
    return {
        "what": r.what,
        "id": r.id,
        "queue": r.queue,
        "task_id": r.task_id,
        "ref": r.ref,
        "attempt": r.attempt,
        "started_at": r.started_at.isoformat(),
        "lease_expires_at": _iso(r.lease_expires_at),
        "preview": r.preview,
    }


def workers_router(registry: WorkerRegistry) -> APIRouter:
    router = APIRouter(tags=["workers"])
    inspector = WorkerInspector(registry)

    @router.get("/workers", response_model=WorkerList, responses=_errors(401))
    async def list_workers() -> dict[str, Any]:
        """Every worker process that heartbeats (or stopped lately: ``gone``)."""
        return {"workers": [worker_dict(w) for w in await registry.workers()]}

    @router.get(
        "/workers/{worker_id}", response_model=WorkerDetailOut, responses=_errors(401, 404, 422)
    )
    async def get_worker(
        worker_id: Annotated[str, Path(min_length=1, max_length=64)],
        limit: Annotated[int, Query(ge=1, le=MAX_RUNNING)] = DEFAULT_RUNNING,
    ) -> dict[str, Any]:
        """One worker process and the jobs and batch items it runs now, oldest first
        (at most ``limit`` of each; ``truncated`` when more were running)."""
        detail = await inspector.worker(worker_id, limit=limit)
        return {
            **worker_dict(detail.worker),
            "running_now": [running_dict(r) for r in detail.running],
            "truncated": detail.truncated,
        }

    return router


def history_router(
    queues: QueueInspector,
    topics: TopicInspector,
    registry: WorkerRegistry,
    charts: History,
    open_tasks: Callable[[], Awaitable[int]],
    writes: CachedWriteCheck,
) -> APIRouter:
    router = APIRouter(tags=["history"])

    async def history_of(
        queue: str | None, window: str, series: list[str], internal: bool
    ) -> dict[str, Any]:
        parse_window(window)  # a bad window is named before anything else
        if queue is None:
            name = EVERY_QUEUE if internal else ALL_QUEUES
        else:
            name = await queues.require_queue(queue)
        resolution, samples = await charts.history(queue=name, window=window)
        return history_dict(name, window, resolution, samples, series)

    @router.get("/history", response_model=HistoryOut, responses=_errors(401, 404, 422))
    async def history(
        series: Annotated[str | None, Query(max_length=400)] = None,
        queue: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
        window: WINDOW = "1h",
        internal: INTERNAL = False,
    ) -> dict[str, Any]:
        """Samples of a queue (or all) over a window: ``series`` is a comma-separated
        list of completed, failed, waiting, running, retrying, run_p50_s, run_p95_s,
        wait_p50_s, wait_p95_s (default: all). All queues are those but shoal's
        own (``queue`` ``*``), unless ``internal`` (``**``)."""
        return await history_of(queue, window, parse_series(series), internal)

    @router.get("/overview", response_model=OverviewOut, responses=_errors(401, 404, 422))
    async def overview(
        window: WINDOW = "1h",
        queue: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
        internal: INTERNAL = False,
    ) -> dict[str, Any]:
        """The counts an operator looks at first, every series over the window, and
        whether the database accepts writes (as ``/readyz`` probes it); shoal's
        own queues count only with ``internal``."""
        # The write probe (up to its timeout while commits stall) runs beside the reads.
        probe = asyncio.ensure_future(writes.get())
        try:
            charts = await history_of(queue, window, list(SERIES), internal)
        except BaseException:
            probe.cancel()  # the probe itself is shielded; only this wait stops
            raise
        workers = await registry.workers()
        return {
            "counts": {
                # Not summed over queues(): that counts every state of every queue.
                "failed_jobs": await queues.failed_total(internal=internal),
                "dead_letters": sum(t.dead for t in await topics.topics()),
                "open_tasks": await open_tasks(),
                "live_workers": sum(1 for w in workers if not w.gone),
                "paused_queues": len(await queues.paused_queues(internal=internal)),
            },
            "history": charts,
            "database": database_dict(await probe),
        }

    return router


__all__ = [
    "LazyTransport",
    "TransportSource",
    "history_router",
    "jobs_router",
    "queues_router",
    "schedules_router",
    "topics_router",
    "workers_router",
]
