"""The aggregator: one component, two duties, run as a cluster-wide singleton.

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

It runs as the job of a 1-second cron schedule with a singleton key, so one
pass runs at a time across all processes; the statements are safe to race
anyway (row locks with SKIP LOCKED, guarded updates).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from shoal.batch.states import ItemStatus
from shoal.batch.store import BatchStore, ClosedTask, Dispatch
from shoal.clock import Clock
from shoal.db.pool import AsyncConn
from shoal.queue.client import Shoal

log = logging.getLogger("shoal.aggregator")

AGGREGATOR_QUEUE = "shoal.batch.aggregate"
AGGREGATOR_SCHEDULE = "shoal.batch.aggregate"
# Every second. Workers also wake it the
# moment they finish a task's last items, so completion is noticed at once.
AGGREGATOR_CRON = "* * * * * *"
# One pass at a time across the cluster: a tick (or wake-up) that finds the
# previous pass unfinished is dropped. A pass takes milliseconds; one whose
# process died loses its lease after expire_in (maintenance looks every 5 s).
AGGREGATOR_JOB_OPTIONS: dict[str, Any] = {
    "singleton_key": "aggregate",
    "retry_limit": 0,
    "expire_in": 5,
}
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
        """Enqueue a pass now (in ``conn``'s transaction); a no-op while one is pending."""
        await self.boss.insert([{"queue": AGGREGATOR_QUEUE, **AGGREGATOR_JOB_OPTIONS}], conn=conn)

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
        timed_out = await self.expire_deadlines()
        to_pending, to_error, resent = await self.reap_zombies()
        resent += await self.sweep_orphans()
        closed = await self.close_tasks()
        report = AggregatorReport(timed_out, to_pending, to_error, resent, tuple(closed))
        if self.boss.hooks:
            self.boss.hooks.emit("aggregator_pass", report=report)
        return report
