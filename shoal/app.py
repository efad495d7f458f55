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
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from shoal.queue.client import Shoal
from shoal.queue.cron import check_cron, check_timezone
from shoal.queue.job import Handler, Job
from shoal.queue.options import check_queue_name, parse_options
from shoal.queue.worker import DEFAULT_CONCURRENCY, DEFAULT_SHUTDOWN_GRACE, Worker

log = logging.getLogger("shoal.app")

StartHook = Callable[[Shoal], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    queue: str
    handler: Handler
    concurrency: int
    batch_size: int | None


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

    def __init__(self) -> None:
        self.handlers: dict[str, HandlerSpec] = {}
        self.schedules: dict[str, ScheduleSpec] = {}
        self.start_hooks: list[StartHook] = []

    def handler(
        self, queue: str, *, concurrency: int = DEFAULT_CONCURRENCY, batch_size: int | None = None
    ) -> Callable[[Handler], Handler]:
        """Register a handler for ``queue``, running at most ``concurrency`` jobs at once."""
        check_queue_name(queue)
        if queue in self.handlers:
            raise ValueError(f"queue {queue!r} already has a handler")

        def register(fn: Handler) -> Handler:
            self.handlers[queue] = HandlerSpec(queue, fn, concurrency, batch_size)
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
        **options: Any,
    ) -> None:
        """Declare a cron schedule; it is created or updated when a worker starts."""
        check_queue_name(name, field="name")
        check_cron(cron)
        check_timezone(tz)
        parse_options(options)
        self.schedules[name] = ScheduleSpec(name, cron, data, queue, tz, dict(options))

    def on_start(self, hook: StartHook) -> StartHook:
        """Run ``hook(shoal)`` when a worker process starts, before it claims anything."""
        self.start_hooks.append(hook)
        return hook

    async def run(
        self,
        boss: Shoal,
        *,
        stop: asyncio.Event,
        grace: timedelta = DEFAULT_SHUTDOWN_GRACE,
        maintenance: bool = True,
        scheduler: bool = True,
    ) -> list[Worker]:
        """Run until ``stop`` is set, then shut down gracefully. Returns the stopped workers."""
        for spec in self.schedules.values():
            await boss.schedule(
                spec.name, spec.cron, spec.data, queue=spec.queue, tz=spec.tz, **spec.options
            )
        for hook in self.start_hooks:
            await hook(boss)
        loops: list[asyncio.Task[None]] = []
        if scheduler:
            loops.append(asyncio.create_task(boss.scheduler().run(), name="shoal-scheduler"))
        if maintenance:
            loops.append(asyncio.create_task(boss.maintenance().run(), name="shoal-maintenance"))
        workers = [
            boss.work(s.queue, s.handler, concurrency=s.concurrency, batch_size=s.batch_size)
            for s in self.handlers.values()
        ]
        log.info("running %d handler(s): %s", len(workers), ", ".join(self.handlers))
        try:
            await stop.wait()
        finally:
            log.info("stopping: finishing running jobs (grace %s)", grace)
            await boss.stop_workers(grace)
            for loop in loops:
                loop.cancel()
            for loop in loops:
                with contextlib.suppress(asyncio.CancelledError):
                    await loop
        return workers


__all__ = ["App", "HandlerSpec", "Job", "ScheduleSpec"]
