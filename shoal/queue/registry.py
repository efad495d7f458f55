"""The worker registry: one row per live worker process, kept by its heartbeat.

Every process whose client runs workers (:meth:`Shoal.work`; ``shoal worker``
names it after its App) registers (host, pid, app, the queues it serves with
their concurrency) and heartbeats every
:data:`HEARTBEAT_S` seconds with the jobs it runs now (per queue: the history
sampler's running counts are these) and has done. A row whose
heartbeat is older than :data:`GONE_S` is shown as gone; past :data:`DROP_S`
any process's heartbeat deletes it. A process that stops cleanly deletes its
own row.

Each process also reports its ``rescue_after`` (:class:`~shoal.Shoal`'s
option, default :data:`DEFAULT_RESCUE_AFTER`): once its heartbeat is older
than that, maintenance hands back the jobs it holds (the claim records the
row's id on each job; :mod:`shoal.queue.maintenance`), and its row counts
them (``rescued``). The heartbeat comes at least :data:`BEATS_PER_RESCUE`
times within ``rescue_after``, so a process that is alive is never taken for
a silent one.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING

from shoal.errors import InvalidInput, TransientError
from shoal.queue.registry_store import RegistryStore
from shoal.queue.rows import WorkerInfo

if TYPE_CHECKING:  # the client owns its process's registry (Shoal.work)
    from shoal.queue.client import Shoal

log = logging.getLogger("shoal.registry")

HEARTBEAT_S = 5.0
GONE_S = 30.0
DROP_S = 300.0
# A process whose heartbeat is older than this has its jobs handed back
# (maintenance, every 5 s). The issue that brought it asked for at most 60 s;
# a dead process's jobs used to wait for their expire_in (15 minutes).
DEFAULT_RESCUE_AFTER = timedelta(seconds=60)
# The least rescue_after accepted: a shorter one is within the noise of a
# loaded event loop and pool (a heartbeat waiting for a connection).
MIN_RESCUE_AFTER = timedelta(seconds=1)
# Heartbeats within one rescue_after, at the least: a live process misses
# that many in a row before its jobs are taken (12 at the defaults).
BEATS_PER_RESCUE = 4


def check_rescue_after(value: object) -> timedelta:
    """``rescue_after`` as given, or InvalidInput naming it."""
    if not isinstance(value, timedelta) or value < MIN_RESCUE_AFTER:
        raise InvalidInput(
            "rescue_after",
            f"must be a timedelta of at least {MIN_RESCUE_AFTER.total_seconds():g}s, got {value!r}",
        )
    return value


# (jobs running now per queue, jobs done) of this process, read at each heartbeat.
Counters = Callable[[], tuple[Mapping[str, int], int]]


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
        rescue_after: timedelta = DEFAULT_RESCUE_AFTER,
    ) -> None:
        self.boss = boss
        self.clock = boss.clock
        self.store = RegistryStore(boss.db, boss.store.sql)
        self.id = uuid.uuid4().hex
        # The row's number (worker.no), known once it is written (register).
        self.no: int | None = None
        self.app = app
        # The queues served and their concurrency: read at each heartbeat when
        # a callable (a client whose workers come and go).
        self._queues = queues if callable(queues) else dict(queues or {})
        self.counters = counters or (lambda: ({}, 0))
        # Queues served by something other than the client's workers (an
        # App's ingest consumers), with their concurrency.
        self.also_served: dict[str, int] = {}
        self.rescue_after = check_rescue_after(rescue_after)
        self.heartbeat_s = min(heartbeat_s, rescue_after.total_seconds() / BEATS_PER_RESCUE)
        self.gone_s = gone_s
        self.drop_s = drop_s

    @property
    def queues(self) -> dict[str, int]:
        return dict(self._queues() if callable(self._queues) else self._queues)

    async def register(self) -> None:
        """Write this process's row; from now on its client's claims name the row's number."""
        no = await self.store.register_worker(
            self.id,
            host=socket.gethostname(),  # as shoal.db.leadership.this_process() names it
            pid=os.getpid(),
            app=self.app,
            queues=self.queues,
            rescue_after=self.rescue_after,
            now=self.clock.sql_now(),
        )
        # Every job the client claims from now on names the row (job.holder):
        # when its heartbeat stops, maintenance hands them back. A row written
        # anew (dropped while this process stalled) has a new number.
        self.no = no
        self.boss.store.holder = self.no
        if self.boss.store.holder_known is not None:
            self.boss.store.holder_known.set()

    async def heartbeat(self) -> None:
        """Report this process alive with its counters; drop rows long gone."""
        running, done = self.counters()
        now = self.clock.sql_now()
        queues = self.queues

        async def beat() -> bool:
            return await self.store.heartbeat_worker(
                self.id, running=running, done=done, queues=queues, now=now
            )

        if not await beat():
            await self.register()  # dropped while this process stalled
            await beat()
        await self.store.drop_gone_workers(drop_s=self.drop_s, now=now)

    async def deregister(self) -> None:
        await self.store.deregister_worker(self.id)

    async def workers(self) -> list[WorkerInfo]:
        return await self.store.list_workers(gone_s=self.gone_s, now=self.clock.sql_now())

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


__all__ = [
    "BEATS_PER_RESCUE",
    "DEFAULT_RESCUE_AFTER",
    "DROP_S",
    "GONE_S",
    "HEARTBEAT_S",
    "MIN_RESCUE_AFTER",
    "WorkerInfo",
    "WorkerRegistry",
    "check_rescue_after",
]
