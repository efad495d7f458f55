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
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from shoal.batch.item import Item
from shoal.batch.kinds import BatchKind
from shoal.batch.states import ItemId, ItemStatus, TaskId
from shoal.batch.store import BatchStore, Dispatch, GuardedItem
from shoal.clock import Clock
from shoal.db.coalesce import Coalescer
from shoal.db.pool import AsyncConn
from shoal.errors import TransientError
from shoal.queue.job import Completed, Job, Outcome, error_entry
from shoal.queue.retry import SYSTEM_JITTER, Jitter, retry_delay
from shoal.queue.states import JobId
from shoal.queue.store import ClaimedJob

log = logging.getLogger("shoal.batch")

PHANTOM_SKIPS = "phantom_skips"
# Attempts to record an outcome before giving up on it (the sweep recovers).
FINAL_WRITE_TRIES = 5
NO_DELAY = timedelta(0)
HANDED_BACK = "handed back at shutdown before it ran"


class ItemDone(NamedTuple):
    """A finished run's result, carried to ``finalize`` as the job's outcome."""

    item_id: ItemId
    fence: int
    task_id: TaskId
    result: Any


# Marks a job missing from ItemRunner._prepared.
_UNCLAIMED: Any = object()

# Enqueues an aggregator pass in the given transaction.
Wake = Callable[[AsyncConn], Awaitable[None]]
# Sends pending items a new job each, due after a delay, in the given
# transaction (dispatch_items); returns how many were sent.
Send = Callable[[AsyncConn, Sequence[Dispatch], timedelta], Awaitable[int]]


class ItemRunner:
    """The queue handler of one kind's item jobs (with ``claim`` and ``finalize``)."""

    def __init__(
        self,
        store: BatchStore,
        kind: BatchKind,
        *,
        clock: Clock,
        send: Send,
        jitter: Jitter = SYSTEM_JITTER,
        wake: Wake | None = None,
    ) -> None:
        self.store = store
        self.kind = kind
        self.clock = clock
        self.send = send
        self.jitter = jitter
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
        """Put items guarded for jobs that never ran (shutdown) back to pending.

        One statement for them all, and a new job for each in the same
        transaction: the one it was claimed with was a one-shot delivery.
        """
        unstarted = [(g.id, g.attempt) for g in self._prepared.values() if g is not None]
        self._prepared.clear()
        for item_id, _ in unstarted:
            self._held.pop(item_id, None)
        if not unstarted:
            return 0

        async def release(conn: AsyncConn) -> int:
            back = await self.store.hand_back_items(
                conn, unstarted, message=HANDED_BACK, now=self.clock.sql_now()
            )
            if back:
                await self.send(conn, back, NO_DELAY)
            return len(back)

        return await self.store.db.run(release)

    def _dispatch(self, item_id: ItemId, fence: int) -> Dispatch:
        return Dispatch(item_id, fence, ItemStatus.PENDING, self.kind.queue, self.kind.job_options)

    async def _guard_many(self, ids: Sequence[ItemId]) -> list[GuardedItem | None]:
        passed = await self.store.guard_items(ids, now=self.clock.sql_now())
        return [passed.get(item_id) for item_id in ids]

    async def finalize(
        self, conn: AsyncConn, batch: Sequence[tuple[ClaimedJob, Outcome]]
    ) -> set[JobId]:
        """Record finished items' results, for a whole batch, and complete their jobs.

        One fenced statement; a task it leaves with nothing pending or running
        wakes the aggregator. Jobs ``claim`` took are complete already; any
        other (a job this runner did not claim) is completed in the same
        statement. Returns the jobs complete.
        """
        done = [
            outcome.output
            for _, outcome in batch
            if isinstance(outcome, Completed) and isinstance(outcome.output, ItemDone)
        ]
        leased = [(c.id, c.attempt) for c, _ in batch if c.lease_expires_at is not None]
        recorded = await self.store.record_items(
            conn, [(d.item_id, d.fence, d.result) for d in done], leased, now=self.clock.sql_now()
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
        return recorded.jobs.union(c.id for c, _ in batch if c.lease_expires_at is None)

    async def _wake_if_finished(self, conn: AsyncConn, task_ids: set[TaskId]) -> None:
        if self.wake is not None and await self.store.finished_tasks(conn, list(task_ids)):
            await self.wake(conn)

    @property
    def heartbeat_interval(self) -> timedelta:
        return self.kind.zombie_timeout / 4

    async def __call__(self, job: Job) -> Any:
        guarded = self._prepared.pop(job.id, _UNCLAIMED)
        if guarded is _UNCLAIMED:  # a job this runner did not claim (no claim=self.claim)
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
        # A job claim() took is complete already (a one-shot delivery): a run
        # that ends without a result sends its item a new job. Any other job
        # is retried, or handed back, by the queue.
        taken = job.claim.lease_expires_at is None
        self._held[guarded.id] = guarded.attempt
        try:
            result = await self.kind.handler(item)
        except asyncio.CancelledError:
            # Shutdown or execution timeout: give the item back for another run.
            self._held.pop(guarded.id, None)
            await self._final(
                item,
                ItemStatus.PENDING,
                TimeoutError("run interrupted"),
                resend=NO_DELAY if taken else None,
            )
            raise
        except Exception as exc:
            self._held.pop(guarded.id, None)
            last = guarded.run >= guarded.max_attempts
            if self.kind.is_permanent(exc) or last:
                await self._final(item, ItemStatus.ERROR, exc)
                return {"item": "error"}
            if taken:
                # The backoff the queue would apply, counted in runs of the item.
                delay = retry_delay(guarded.run, job.claim.policy, self.jitter)
                await self._final(item, ItemStatus.PENDING, exc, resend=delay)
                return {"item": "retry", "in_s": delay.total_seconds()}
            await self._final(item, ItemStatus.PENDING, exc)
            raise
        # Still held (heartbeats continue) until finalize records the result.
        return ItemDone(guarded.id, guarded.attempt, guarded.task_id, result)

    async def _final(
        self,
        item: Item,
        status: ItemStatus,
        error: BaseException,
        *,
        resend: timedelta | None = None,
    ) -> None:
        """The fenced write of a failed run (error, or back to pending).

        With ``resend``, an item put back to pending gets a new job due after
        that delay, in the same transaction. Shielded from cancellation and
        retried when transient; when the item is now an error and its task has
        nothing left, the aggregator is woken.
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
                if won and resend is not None:
                    await self.send(conn, [self._dispatch(item.id, item.fence)], resend)
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
