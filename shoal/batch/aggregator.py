"""The aggregator: one component, two duties, run by one process of the cluster.

Each pass, in its own short transactions:

1. tasks past their deadline stop taking work (pending items -> cancelled);
2. zombies are reaped: running items with no sign of life for the task's
   zombie timeout go back to pending (and get a new job) while attempts
   remain, else to error;
3. pending items untouched for a zombie timeout get their job re-sent (a
   no-op where one still waits, thanks to its singleton key);
4. every task with nothing pending or running is closed by one conditional
   statement, and its ``on_complete`` hook job is enqueued in that same
   transaction, so the hook runs exactly once per close even when two
   aggregators race.

``shoal worker`` runs :meth:`Aggregator.run` in the leader of
:data:`AGGREGATOR_DUTY` (shoal.db.leadership): deadlines and the close (1.
and 4.) every second, the whole pass every :data:`SWEEP_INTERVAL`, and the
close alone at once when a worker finishes a task's last items
(:meth:`Aggregator.wake` notifies, the leader's listener hears it). The statements are safe to race
anyway (row locks with SKIP LOCKED, guarded updates), for the moments when a
deposed leader has not yet noticed.

Before the elector, the passes were the jobs of a 1-second cron schedule
with a singleton key (:data:`AGGREGATOR_SCHEDULE`): 86,400 jobs a day
through the job table, the archive and the console's charts. ``shoal
worker`` removes that schedule where an earlier release left it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from shoal.batch.rows import ClosedTask, Dispatch
from shoal.batch.states import ItemStatus
from shoal.batch.store import BatchStore
from shoal.clock import Clock
from shoal.db.pool import AsyncConn
from shoal.errors import TransientError
from shoal.queue.client import Shoal

log = logging.getLogger("shoal.aggregator")

# The duty whose leader runs the aggregator (shoal.db.leadership).
AGGREGATOR_DUTY = "batch.aggregator"
# A pass this often. Workers also wake it the moment they finish a task's
# last items, so completion is noticed at once; the interval bounds how late
# a deadline, a zombie or a close is noticed when no wake-up comes (a worker
# without LISTEN, a lost notification).
AGGREGATOR_INTERVAL = timedelta(seconds=1)
# The zombie reaper and the orphan sweep (2. and 3.) run this often, in a
# whole pass. They look for what a zombie timeout (60 s by default) has made
# stale, so a zombie is reaped at most this long after its timeout; and in a
# big task each pass reads the entries the claims and results left in the
# item index since the last: every second, about 0.12 s of server time a
# pass at 1,000,000 items, a third of the server's time per item.
SWEEP_INTERVAL = timedelta(seconds=5)
# The wake-up: a notification on the jobs channel naming this (no job is
# sent: the name is that of the queue the aggregator's jobs had).
AGGREGATOR_QUEUE = "shoal.batch.aggregate"
# The cron schedule that ran the passes as jobs, removed at start.
AGGREGATOR_SCHEDULE = "shoal.batch.aggregate"
ZOMBIES_REAPED = "zombies_reaped"
# Rows handled per statement, so one pass never holds many locks for long.
BATCH_LIMIT = 1000


async def dispatch_items(
    boss: Shoal, conn: AsyncConn, items: Sequence[Dispatch], delay: timedelta = timedelta(0)
) -> int:
    """Send one job per item, in ``conn``'s transaction, due after ``delay``.

    Returns how many were sent. Each job carries only the item's id, and
    the item's partition key (given when its task was created), so an item
    sent again stays in its partition. Its singleton key names the item and
    attempt: a duplicate dispatch of the same run is dropped, while a
    re-dispatch after a reap is not blocked by a job of the dead worker's run
    that still waits (the phantom guard skips that one).
    """
    groups: dict[tuple[str, str], list[Dispatch]] = {}  # by queue and options
    for item in items:
        key = (item.queue, repr(sorted(item.job_options.items())))
        groups.setdefault(key, []).append(item)
    sent = 0
    for group in groups.values():
        options: dict[str, Any] = dict(group[0].job_options)
        if delay:
            options["start_after"] = delay
        keyed = any(d.partition_key is not None for d in group)
        ids = await boss.insert_many(
            group[0].queue,
            [{"item": d.id} for d in group],
            singleton_keys=[f"item-{d.id}:{d.fence}" for d in group],
            partition_keys=[d.partition_key for d in group] if keyed else None,
            conn=conn,
            **options,
        )
        sent += sum(1 for job_id in ids if job_id is not None)
    return sent


@dataclass(frozen=True, slots=True)
class AggregatorReport:
    timed_out: int
    reaped_to_pending: int
    reaped_to_error: int
    redispatched: int
    closed: tuple[ClosedTask, ...]


class Aggregator:
    def __init__(self, store: BatchStore, boss: Shoal, *, clock: Clock) -> None:
        self.store = store
        self.boss = boss
        self.clock = clock

    async def wake(self, conn: AsyncConn) -> None:
        """Ask the leading aggregator for a pass now (when ``conn``'s transaction commits)."""
        await self.boss.store.notify(conn, [AGGREGATOR_QUEUE])

    async def _dispatch(self, conn: AsyncConn, items: Sequence[Dispatch]) -> int:
        pending = [d for d in items if d.status is ItemStatus.PENDING]
        return await dispatch_items(self.boss, conn, pending) if pending else 0

    async def expire_deadlines(self) -> int:
        now = self.clock.sql_now()

        async def run(conn: AsyncConn) -> int:
            expired = await self.store.expire_deadlines(conn, now=now)
            if expired:
                await self.store.cancel_pending_items(conn, expired, now=now)
                log.warning("tasks past their deadline, stopping: %s", ", ".join(expired))
            return len(expired)

        return await self.store.db.run(run)

    async def reap_zombies(self) -> tuple[int, int, int]:
        now = self.clock.sql_now()

        async def run(conn: AsyncConn) -> tuple[int, int, int]:
            reaped = await self.store.reap_zombies(conn, limit=BATCH_LIMIT, now=now)
            if not reaped:
                return 0, 0, 0
            sent = await self._dispatch(conn, reaped)
            await self.store.count_event(ZOMBIES_REAPED, len(reaped), conn)
            back = sum(1 for d in reaped if d.status is ItemStatus.PENDING)
            log.warning(
                "reaped %d zombie item(s): %d back to pending, %d to error",
                len(reaped),
                back,
                len(reaped) - back,
            )
            return back, len(reaped) - back, sent

        return await self.store.db.run(run)

    async def sweep_orphans(self) -> int:
        now = self.clock.sql_now()

        async def run(conn: AsyncConn) -> int:
            orphans = await self.store.sweep_orphans(conn, limit=BATCH_LIMIT, now=now)
            return await self._dispatch(conn, orphans)

        sent = await self.store.db.run(run)
        if sent:
            log.warning("re-sent jobs for %d pending item(s) that had none", sent)
        return sent

    async def close_tasks(self) -> list[ClosedTask]:
        now = self.clock.sql_now()

        async def run(conn: AsyncConn) -> list[ClosedTask]:
            closed = await self.store.close_tasks(conn, limit=BATCH_LIMIT, now=now)
            hooks = [
                {
                    "queue": task.on_complete_queue,
                    "data": {"task_id": task.id, "outcome": task.outcome.value},
                }
                for task in closed
                if task.on_complete_queue
            ]
            if hooks:
                await self.boss.insert(hooks, conn=conn)
            return closed

        closed = await self.store.db.run(run)
        for task in closed:
            log.info("task %s (%s) closed: %s", task.id, task.kind, task.outcome)
        return closed

    async def run_once(self) -> AggregatorReport:
        """The whole pass: deadlines, zombies, orphans, then the close."""
        timed_out = await self.expire_deadlines()
        to_pending, to_error, resent = await self.reap_zombies()
        resent += await self.sweep_orphans()
        closed = await self.close_tasks()
        return self._report(
            AggregatorReport(timed_out, to_pending, to_error, resent, tuple(closed))
        )

    async def run_tick(self) -> AggregatorReport:
        """Deadlines, then the close: the pass of each second between two whole ones."""
        timed_out = await self.expire_deadlines()
        closed = await self.close_tasks()
        return self._report(AggregatorReport(timed_out, 0, 0, 0, tuple(closed)))

    async def run_close(self) -> AggregatorReport:
        """The close alone: what a wake-up asks for (a worker finished a task's last items)."""
        return self._report(AggregatorReport(0, 0, 0, 0, tuple(await self.close_tasks())))

    def _report(self, report: AggregatorReport) -> AggregatorReport:
        if self.boss.hooks:
            self.boss.hooks.emit("aggregator_pass", report=report)
        return report

    async def run(self) -> None:
        """Deadlines and the close every :data:`AGGREGATOR_INTERVAL`, the whole
        pass every :data:`SWEEP_INTERVAL`, and a close at each wake-up.

        A wake-up runs the close alone, in a loop of its own beside the
        passes: a close never waits for a pass (a whole one reads the entries
        the claims left in the item index, about 0.12 s at 1,000,000 items,
        longer while a lock holds it), and the passes' times are kept from the
        last tick, never pushed back by wake-ups. Each tick closes anything a
        lost wake-up left open.
        """
        notifier = self.boss.notifier
        woken = asyncio.Event()
        if notifier is not None:
            notifier.start()
            woken = notifier.subscribe(AGGREGATOR_QUEUE)
        closer = asyncio.create_task(self._close_when_woken(woken), name="aggregator close")
        try:
            await self._pass_every_tick()
        finally:
            closer.cancel()
            await asyncio.gather(closer, return_exceptions=True)
            if notifier is not None:
                notifier.unsubscribe(AGGREGATOR_QUEUE, woken)

    async def _pass_every_tick(self) -> None:
        interval = AGGREGATOR_INTERVAL.total_seconds()
        sweep_interval = SWEEP_INTERVAL.total_seconds()
        next_pass = next_sweep = self.clock.monotonic()
        while True:
            now = self.clock.monotonic()
            if now >= next_sweep:
                next_pass, next_sweep = now + interval, now + sweep_interval
                await self._guarded(self.run_once)
            elif now >= next_pass:
                next_pass = now + interval
                await self._guarded(self.run_tick)
            await self.clock.sleep(max(0.0, next_pass - self.clock.monotonic()))

    async def _close_when_woken(self, woken: asyncio.Event) -> None:
        while True:
            await woken.wait()
            woken.clear()  # a wake-up during the close asks for another
            await self._guarded(self.run_close)

    @staticmethod
    async def _guarded(run: Callable[[], Awaitable[AggregatorReport]]) -> None:
        try:
            await run()
        except TransientError as exc:
            log.warning("aggregator pass failed: %s", exc)
        except Exception:  # loop boundary: the aggregator must keep running
            log.exception("aggregator pass failed")
