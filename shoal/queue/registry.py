"""The worker registry: one row per live worker process, kept by its heartbeat.

Every process whose client runs workers (:meth:`Shoal.work`; ``shoal worker``
names it after its App) registers (host, pid, app, the queues it serves with
their concurrency) and heartbeats every
:data:`HEARTBEAT_S` seconds with the jobs it runs now (per queue: the history
sampler's running counts are these) and has done. A row whose
heartbeat is older than :data:`GONE_S` is shown as gone; past :data:`DROP_S`
any process's heartbeat deletes it. A process that stops cleanly deletes its
own row.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from shoal.db.queries import load_queries
from shoal.errors import TransientError

if TYPE_CHECKING:  # the client owns its process's registry (Shoal.work)
    from shoal.queue.client import Shoal

log = logging.getLogger("shoal.registry")

HEARTBEAT_S = 5.0
GONE_S = 30.0
DROP_S = 300.0

# (jobs running now per queue, jobs done) of this process, read at each heartbeat.
Counters = Callable[[], tuple[Mapping[str, int], int]]


def this_process() -> str:
    """This process as the Workers page shows it: ``host:pid``.

    Named in the history notes of work it hands back at shutdown.
    """
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    id: str
    host: str
    pid: int
    app: str
    queues: dict[str, int]
    started_at: datetime
    heartbeat_at: datetime
    running: int
    done: int
    gone: bool


class WorkerRegistry:
    """This process's row in the registry, and reads of everyone's."""

    def __init__(
        self,
        boss: Shoal,
        *,
        app: str = "",
        queues: Mapping[str, int] | Callable[[], Mapping[str, int]] | None = None,
        counters: Counters | None = None,
        heartbeat_s: float = HEARTBEAT_S,
        gone_s: float = GONE_S,
        drop_s: float = DROP_S,
    ) -> None:
        self.boss = boss
        self.clock = boss.clock
        self.sql = load_queries("shoal.queue", boss.db.schema, file="history.sql")
        self.id = uuid.uuid4().hex
        self.app = app
        # The queues served and their concurrency: read at each heartbeat when
        # a callable (a client whose workers come and go).
        self._queues = queues if callable(queues) else dict(queues or {})
        self.counters = counters or (lambda: ({}, 0))
        # Queues served by something other than the client's workers (an
        # App's ingest consumers), with their concurrency.
        self.also_served: dict[str, int] = {}
        self.heartbeat_s = heartbeat_s
        self.gone_s = gone_s
        self.drop_s = drop_s

    async def _run(self, name: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        return await self.boss.db.fetch(self.sql[name], params)

    @property
    def queues(self) -> dict[str, int]:
        return dict(self._queues() if callable(self._queues) else self._queues)

    async def register(self) -> None:
        await self._run(
            "register_worker",
            {
                "id": self.id,
                "host": socket.gethostname(),  # as this_process() names it
                "pid": os.getpid(),
                "app": self.app,
                "queues": json.dumps(self.queues),
                "now": self.clock.sql_now(),
            },
        )

    async def heartbeat(self) -> None:
        """Report this process alive with its counters; drop rows long gone."""
        running, done = self.counters()
        now = self.clock.sql_now()
        params = {
            "id": self.id,
            "running": sum(running.values()),
            "running_by_queue": json.dumps({q: n for q, n in running.items() if n}),
            "done": done,
            "queues": json.dumps(self.queues),
            "now": now,
        }
        if not await self._run("heartbeat_worker", params):
            await self.register()  # dropped while this process stalled
            await self._run("heartbeat_worker", params)
        await self._run("drop_gone_workers", {"now": now, "drop_s": self.drop_s})

    async def deregister(self) -> None:
        await self._run("deregister_worker", {"id": self.id})

    async def workers(self) -> list[WorkerInfo]:
        rows = await self._run("list_workers", {"now": self.clock.sql_now(), "gone_s": self.gone_s})
        return [WorkerInfo(*r) for r in rows]

    async def run(self) -> None:
        """Register, then heartbeat until cancelled (the caller deregisters)."""
        registered = False
        while True:
            try:
                if not registered:
                    await self.register()
                    registered = True
                await self.heartbeat()
            except TransientError as exc:
                log.warning("worker heartbeat failed: %s", exc)
            except Exception:  # loop boundary: the heartbeat must keep running
                log.exception("worker heartbeat failed")
            await self.clock.sleep(self.heartbeat_s)


__all__ = ["DROP_S", "GONE_S", "HEARTBEAT_S", "WorkerInfo", "WorkerRegistry"]
