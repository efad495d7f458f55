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

One process leads :data:`MONITOR_DUTY` (shoal.db.leadership): the elector
given (``shoal worker`` passes its client's), else one of the monitor's own
that tries every ``interval``. When the leader dies its connection closes,
its lock is released, and another process takes over at its next try; when
it stops, it resigns and another takes over at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from shoal.clock import SYSTEM_CLOCK, Clock
from shoal.db.leadership import DEFAULT_DEPOSE_AFTER, MIN_RENEWALS_PER_DEPOSE, Elector
from shoal.errors import TransientError
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
# The duty whose leader runs the monitor. Its lock is the one the monitor
# took before the elector existed: old and new monitors contend for one lock.
MONITOR_DUTY = "ingest.monitor"


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
        elector: Elector | None = None,
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
        self.elector = elector

    @property
    def is_leader(self) -> bool:
        """Whether this process leads the monitor now."""
        elector = self.elector
        leadership = None if elector is None else elector.leadership(MONITOR_DUTY)
        return leadership is not None and leadership.is_leader

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
        """Contend for the monitor; while leading, check every ``interval``. Ends when
        ``stop`` is set, resigning (and closing the monitor's own elector, if it made one)."""
        elector = self.elector
        own = elector is None
        if elector is None:
            elector = self.elector = Elector(
                self.store.db,
                clock=self.clock,
                retry=self.interval,
                depose_after=max(DEFAULT_DEPOSE_AFTER, MIN_RENEWALS_PER_DEPOSE * self.interval),
            )
        lead = asyncio.ensure_future(elector.lead(MONITOR_DUTY, self._watch))
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait([lead, stopped], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (lead, stopped):
                task.cancel()
            try:
                # Not an await of lead: a cancellation of run() meanwhile must pass.
                await asyncio.wait([lead])
            finally:
                if own:
                    await elector.close()
        failed = None if lead.cancelled() else lead.exception()
        if failed is not None:
            raise failed

    async def _watch(self) -> None:
        """The leader's rounds, every ``interval``, until its term ends."""
        while True:
            try:
                await self.check()
                await self.prune()
            except TransientError as exc:
                log.warning("backlog monitor: %s", exc)
            except Exception:  # loop boundary: the monitor must keep running
                log.exception("backlog monitor round failed")
            await self.clock.sleep(self.interval.total_seconds())
