"""The backlog monitor: one leader in the cluster watches every topic's depth and wait.

Every ``interval`` (a minute by default) the leader reads each topic's depth
from its transport (ready + in flight + delayed: NSQ's own ``/stats`` left
in-flight and deferred messages out of its depth, which hid a backlog of
retries), the age of the oldest unacknowledged message, and the wait
consumers last reported (now minus ``published_at`` of a message they just
applied). It logs ERROR past ``alert_depth`` or ``alert_wait``, and sets a
topic's pause flag past ``pause_depth``, clearing it only below half of that,
so producers do not flap around the threshold. Producers read the flag with
``Pipeline.admit``.

Leadership is a session advisory lock held on a dedicated connection: when
the leader dies its connection closes, the lock is released, and another
process takes over at its next try.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from shoal.clock import SYSTEM_CLOCK, Clock
from shoal.db.pool import AsyncConn
from shoal.hooks import Hooks
from shoal.ingest.store import IngestStore
from shoal.ingest.transport import Depth, Transport

log = logging.getLogger("shoal.ingest.monitor")

DEFAULT_INTERVAL = timedelta(minutes=1)
DEFAULT_ALERT_DEPTH = 200_000
DEFAULT_PAUSE_DEPTH = 500_000
DEFAULT_ALERT_WAIT = timedelta(minutes=10)
# Expired done-markers are deleted in statements of this many.
PRUNE_BATCH = 10_000


@dataclass(frozen=True, slots=True)
class Reading:
    topic: str
    depth: Depth
    wait: timedelta | None
    paused: bool
    alerted: bool


class BacklogMonitor:
    def __init__(
        self,
        transport: Transport,
        store: IngestStore,
        topics: Sequence[tuple[str, str]],  # (topic, consumer group)
        *,
        interval: timedelta = DEFAULT_INTERVAL,
        alert_depth: int = DEFAULT_ALERT_DEPTH,
        pause_depth: int = DEFAULT_PAUSE_DEPTH,
        alert_wait: timedelta = DEFAULT_ALERT_WAIT,
        clock: Clock = SYSTEM_CLOCK,
        hooks: Hooks | None = None,
    ) -> None:
        self.transport = transport
        self.store = store
        self.topics = list(topics)
        self.interval = interval
        self.alert_depth = alert_depth
        self.pause_depth = pause_depth
        self.alert_wait = alert_wait
        self.clock = clock
        # Observers of each sample (shoal.testing.Probe).
        self.hooks = hooks if hooks is not None else Hooks()
        self.is_leader = False

    async def check(self) -> list[Reading]:
        """One round over every topic (the leader's job; callable directly in tests)."""
        readings = []
        for topic, group in self.topics:
            depth = await self.transport.depth(topic, group)
            backlog = await self.store.record_backlog(
                topic,
                depth,
                pause_depth=self.pause_depth,
                recent=2 * self.interval,
                now=self.clock.sql_now(),
            )
            wait = None if backlog.wait_s is None else timedelta(seconds=backlog.wait_s)
            alerted = depth.total > self.alert_depth or (
                wait is not None and wait > self.alert_wait
            )
            level = logging.ERROR if alerted else logging.INFO
            log.log(
                level,
                "topic %s: depth %d (ready %d, in flight %d, delayed %d), wait %s%s",
                topic,
                depth.total,
                depth.ready,
                depth.in_flight,
                depth.delayed,
                "-" if wait is None else f"{wait.total_seconds():.1f}s",
                ", PAUSED: producers hold off" if backlog.paused else "",
            )
            reading = Reading(topic, depth, wait, backlog.paused, alerted)
            readings.append(reading)
            if self.hooks:
                self.hooks.emit("monitor_sampled", topic, reading=reading)
        return readings

    async def prune(self) -> int:
        """Delete expired done-markers (the leader's second job); how many."""
        removed = 0
        while (
            batch := await self.store.prune_done(limit=PRUNE_BATCH, now=self.clock.sql_now())
        ) > 0:
            removed += batch
            if batch < PRUNE_BATCH:
                break
        return removed

    async def run(self, stop: asyncio.Event) -> None:
        """Try to lead; while leading, check every ``interval``. Ends when ``stop`` is set."""
        while not stop.is_set():
            conn: AsyncConn | None = None
            try:
                conn = await self.store.db.connect()
                cur = await conn.execute(
                    "SELECT pg_try_advisory_lock(hashtext(%s))", (self._lock_name(),)
                )
                row = await cur.fetchone()
                self.is_leader = bool(row and row[0])
                while self.is_leader and not stop.is_set():
                    await self.check()
                    await self.prune()
                    await _wait(stop, self.interval, self.clock)
                    await conn.execute("SELECT 1")  # still connected, so still the leader
            except Exception as exc:
                log.warning("backlog monitor: %s", exc)
            finally:
                self.is_leader = False
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()
            await _wait(stop, self.interval, self.clock)

    def _lock_name(self) -> str:
        return f"{self.store.db.schema}.ingest.monitor"


async def _wait(stop: asyncio.Event, interval: timedelta, clock: Clock) -> None:
    """Wait ``interval`` of ``clock``'s time, or until ``stop`` is set."""
    waits = [
        asyncio.ensure_future(clock.sleep(interval.total_seconds())),
        asyncio.ensure_future(stop.wait()),
    ]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waits:
            waiter.cancel()
