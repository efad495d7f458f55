"""Runs one item per job: the phantom guard, the handler, the fenced final write.

The guard is a conditional ``pending -> running`` update: a job delivered for
an item that is already running, finished or cancelled (a duplicate or late
delivery) does nothing and costs no handler call (counted as a phantom skip).
It runs for a whole claimed batch in the statement that claims its jobs
(``claim``). The worker writes only its own item row, never the task row. Each
outcome is written fenced by the attempt the guard handed out:

- the handler returns: ``completed`` with its result, written by ``finalize``
  for a whole batch of finished items in the statement that completes their
  jobs; a task left with nothing pending or running wakes the aggregator;
- a permanent error, or a transient one on the last attempt: ``error`` with
  the message (the job then completes: the item's outcome is recorded);
- a transient error with attempts left: back to ``pending``, and the error is
  re-raised so the queue retries the job with backoff;
- cancelled (shutdown, or the job's execution timeout): back to ``pending``;
  the job is handed back or retried, and the aggregator's sweep re-dispatches
  any item whose job is gone.

While the handler runs, a heartbeat loop refreshes the item's ``updated_at``
every quarter of the zombie timeout, so only a dead or frozen process lets an
item go stale.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from shoal.batch.item import Item
from shoal.batch.kinds import BatchKind
from shoal.batch.states import ItemId, ItemStatus, TaskId
from shoal.batch.store import BatchStore, GuardedItem
from shoal.clock import Clock
from shoal.db.coalesce import Coalescer
from shoal.db.pool import AsyncConn
from shoal.errors import TransientError
from shoal.queue.job import Completed, Job, Outcome, error_entry, event_entry
from shoal.queue.states import JobId
from shoal.queue.store import ClaimedJob

log = logging.getLogger("shoal.batch")

PHANTOM_SKIPS = "phantom_skips"
# Attempts to record an outcome before giving up on it (the sweep recovers).
FINAL_WRITE_TRIES = 5


@dataclass(frozen=True, slots=True)
class ItemDone:
    """A finished run's result, carried to ``finalize`` as the job's outcome."""

    item_id: ItemId
    fence: int
    task_id: TaskId
    result: Any


# Enqueues an aggregator pass in the given transaction.
Wake = Callable[[AsyncConn], Awaitable[None]]


class ItemRunner:
    """The queue handler of one kind's item jobs (with ``prepare`` and ``finalize``)."""

    def __init__(
        self, store: BatchStore, kind: BatchKind, *, clock: Clock, wake: Wake | None = None
    ) -> None:
        self.store = store
        self.kind = kind
        self.clock = clock
        self.wake = wake
        # Items running in this process, by id, with their fence. Written by
        # runs as they start and end, read by the heartbeat loop.
        self._held: dict[ItemId, int] = {}
        # Guard results of claimed jobs not yet run, by job id (None: phantom).
        # Written by claim(), taken by the job's run.
        self._prepared: dict[JobId, GuardedItem | None] = {}
        self.phantom_skips = 0
        # The guard and the completion of concurrent items share round trips.
        self._guard: Coalescer[ItemId, GuardedItem | None] = Coalescer(
            self._guard_many, name=f"shoal-guard:{kind.name}"
        )

    async def claim(self, queue: str, limit: int, *, now: datetime | None) -> list[ClaimedJob]:
        """Claim item jobs and guard their items in one statement (the worker's ``claim``).

        Items that pass count as running (and get heartbeats) from here on;
        ``release_unstarted`` hands back those whose job never ran.
        """
        claimed = await self.store.claim_items(queue, limit, now=now)
        for job, guarded in claimed:
            self._prepared[job.id] = guarded
            if guarded is not None:
                self._held[guarded.id] = guarded.attempt
        return [job for job, _ in claimed]

    async def release_unstarted(self) -> int:
        """Put items guarded for jobs that never ran (shutdown) back to pending."""
        released = 0
        for guarded in list(self._prepared.values()):
            if guarded is None:
                continue
            self._held.pop(guarded.id, None)
            released += await self.store.fail_item(
                guarded.id,
                guarded.attempt,
                status=ItemStatus.PENDING,
                message="handed back at shutdown before it ran",
                entry=event_entry(
                    guarded.run,
                    "Interrupted",
                    "handed back at shutdown before it ran",
                    self.clock.now().isoformat(),
                ),
                now=self.clock.sql_now(),
            )
        self._prepared.clear()
        return released

    async def _guard_many(self, ids: Sequence[ItemId]) -> list[GuardedItem | None]:
        passed = await self.store.guard_items(ids, now=self.clock.sql_now())
        return [passed.get(item_id) for item_id in ids]

    async def finalize(
        self, conn: AsyncConn, batch: Sequence[tuple[ClaimedJob, Outcome]]
    ) -> set[JobId]:
        """Record finished items' results and complete their jobs, for a whole batch.

        One fenced statement, so a result and its job commit together; a task
        it leaves with nothing pending or running wakes the aggregator.
        Returns the jobs completed.
        """
        done = [
            outcome.output
            for _, outcome in batch
            if isinstance(outcome, Completed) and isinstance(outcome.output, ItemDone)
        ]
        recorded = await self.store.record_items(
            conn,
            [(d.item_id, d.fence, d.result) for d in done],
            [(claim.id, claim.attempt) for claim, _ in batch],
            now=self.clock.sql_now(),
        )
        for d in done:
            self._held.pop(d.item_id, None)
            if d.item_id not in recorded.items:
                log.warning(
                    "item %s: a run lost its fence (reaped or cancelled meanwhile); "
                    "its result was not recorded",
                    d.item_id,
                )
        if recorded.finished_tasks and self.wake is not None:
            await self.store.db.run(self.wake)
        return recorded.jobs

    async def _wake_if_finished(self, conn: AsyncConn, task_ids: set[TaskId]) -> None:
        if self.wake is not None and await self.store.finished_tasks(conn, list(task_ids)):
            await self.wake(conn)

    @property
    def heartbeat_interval(self) -> timedelta:
        return self.kind.zombie_timeout / 4

    async def __call__(self, job: Job) -> Any:
        if job.id in self._prepared:
            guarded = self._prepared.pop(job.id)
        else:  # a job this runner did not claim (a worker without claim=self.claim)
            guarded = await self._guard.submit(ItemId(int(job.data["item"])))
        if guarded is None:
            self.phantom_skips += 1
            await self.store.count_event(PHANTOM_SKIPS)
            log.info("item %s: phantom delivery skipped (job %s)", job.data["item"], job.id)
            return {"skipped": "phantom"}
        item = Item(guarded, job, self._heartbeat)
        if guarded.run > guarded.max_attempts:
            error = RuntimeError(f"no attempts left ({guarded.max_attempts} allowed)")
            await self._final(item, ItemStatus.ERROR, error)
            return {"item": "error"}
        self._held[item.id] = item.fence
        try:
            result = await self.kind.handler(item)
        except asyncio.CancelledError:
            # Shutdown or execution timeout: give the item back for another run.
            self._held.pop(item.id, None)
            await self._final(item, ItemStatus.PENDING, TimeoutError("run interrupted"))
            raise
        except Exception as exc:
            self._held.pop(item.id, None)
            last = guarded.run >= guarded.max_attempts
            if self.kind.is_permanent(exc) or last:
                await self._final(item, ItemStatus.ERROR, exc)
                return {"item": "error"}
            await self._final(item, ItemStatus.PENDING, exc)
            raise
        # Still held (heartbeats continue) until finalize records the result.
        return ItemDone(item.id, item.fence, item.task_id, result)

    async def _final(self, item: Item, status: ItemStatus, error: BaseException) -> None:
        """The fenced write of a failed run (error, or back to pending).

        Shielded from cancellation and retried when transient; when the item
        is now an error and its task has nothing left, the aggregator is woken.
        """

        async def write() -> bool:
            async def fail(conn: AsyncConn) -> bool:
                won = await self.store.fail_item(
                    item.id,
                    item.fence,
                    status=status,
                    message=f"{type(error).__name__}: {error}",
                    entry=error_entry(item.attempt, error, self.clock.now().isoformat()),
                    now=self.clock.sql_now(),
                    conn=conn,
                )
                if won and status is ItemStatus.ERROR:
                    await self._wake_if_finished(conn, {item.task_id})
                return won

            return await self.store.db.run(fail)

        for attempt in range(FINAL_WRITE_TRIES):
            try:
                won = await asyncio.shield(write())
            except TransientError as exc:
                if attempt == FINAL_WRITE_TRIES - 1:
                    raise
                log.warning("item %s: recording %s failed (%s); retrying", item.id, status, exc)
                await self.clock.sleep(0.2 * 2**attempt)
                continue
            if not won:
                log.warning(
                    "item %s: run %d lost its fence (reaped or cancelled meanwhile); "
                    "its %s was not recorded",
                    item.id,
                    item.attempt,
                    status,
                )
            return

    async def _heartbeat(self, item: Item) -> bool:
        held = await self.store.heartbeat_items([(item.id, item.fence)], now=self.clock.sql_now())
        await item.job.heartbeat()
        return item.id in held

    async def heartbeat_loop(self) -> None:
        """Refresh the sign of life of every item running in this process."""
        while True:
            await self.clock.sleep(self.heartbeat_interval.total_seconds())
            if not self._held:
                continue
            try:
                await self.store.heartbeat_items(list(self._held.items()), now=self.clock.sql_now())
            except TransientError as exc:
                log.warning("item heartbeat failed: %s", exc)
            except Exception:  # loop boundary: heartbeats must keep going
                log.exception("item heartbeat failed")
