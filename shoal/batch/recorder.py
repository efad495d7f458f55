"""The item runner's recorder: the fenced writes of finished item runs.

The run loop (:mod:`shoal.batch.item_runner`) hands each run's end here, as
the queue worker hands outcomes to its completer (:mod:`shoal.queue.completer`):

- ``finalize`` records the results of a whole batch of finished items in the
  statement that completes their jobs (the queue completer calls it with each
  batch); a task left with nothing pending or running wakes the aggregator;
- ``fail`` records a failed run, fenced: ``error``, or back to ``pending``
  with a new job when its run's job is gone;
- ``hand_back`` and ``hand_back_unstarted`` put items this worker's shutdown
  stopped, or never started, back to ``pending`` without spending an attempt.

Each write names the fence (the item's attempt) its run was handed, so a run
that lost its item never overwrites the item's next run. Single writes are
shielded from cancellation and retried when transient. Each item outcome is
reported to the ``item_finished`` hook here or by the run loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from datetime import timedelta
from typing import NamedTuple

from shoal.batch.item import Item
from shoal.batch.kinds import BatchKind
from shoal.batch.rows import Dispatch
from shoal.batch.states import ItemId, ItemStatus, TaskId
from shoal.batch.store import BatchStore
from shoal.clock import Clock
from shoal.db.leadership import this_process
from shoal.db.pool import AsyncConn
from shoal.errors import TransientError
from shoal.hooks import Hooks
from shoal.queue.job import Completed, Outcome, error_entry
from shoal.queue.rows import ClaimedJob
from shoal.queue.states import JobId

log = logging.getLogger("shoal.batch")

# Attempts to record an outcome before giving up on it (the sweep recovers).
FINAL_WRITE_TRIES = 5
NO_DELAY = timedelta(0)
# History notes of items handed back at shutdown, naming the process
# (``{process}``: shoal.db.leadership.this_process()).
HANDED_BACK = "handed back at shutdown of worker process {process} before it ran"
INTERRUPTED = (
    "stopped by the shutdown of worker process {process}; handed back without spending an attempt"
)


class ItemDone(NamedTuple):
    """A finished run's result, carried to ``finalize`` as the job's outcome."""

    item_id: ItemId
    fence: int
    task_id: TaskId
    result: str | None  # as JSON text (shoal.queue.results.encode_result)


# What an item job's run returns when it ends without a result to record:
# ``{"item": "error" | "retry"}``, or ``{SKIPPED: why}`` when it ran nothing.
SKIPPED = "skipped"


def job_outcome(outcome: Outcome, recorded: Collection[ItemId]) -> str:
    """The outcome an item job reports (``job_finished``): its item's, in a job's words.

    Every item job completes, whatever its item's run did; what it reports
    follows the item: ``completed`` (its result recorded), ``lost`` (its
    fence moved on first), ``failed`` (the item is in error), ``retried``
    (back to pending for another run), ``skipped`` (a phantom, cancelled or
    superseded delivery that ran nothing). So an alert on failed jobs sees
    failed items.
    """
    output = outcome.output if isinstance(outcome, Completed) else None
    if isinstance(output, ItemDone):
        return "completed" if output.item_id in recorded else "lost"
    if isinstance(output, dict):
        if output.get("item") == "error":
            return "failed"
        if output.get("item") == "retry":
            return "retried"
        if SKIPPED in output:
            return SKIPPED
    return "completed"


# Enqueues an aggregator pass in the given transaction.
Wake = Callable[[AsyncConn], Awaitable[None]]
# Sends pending items a new job each, due after a delay, in the given
# transaction (dispatch_items); returns how many were sent.
Send = Callable[[AsyncConn, Sequence[Dispatch], timedelta], Awaitable[int]]


class ItemRecorder:
    """Writes the outcomes of one kind's item runs; counts the items handed back."""

    def __init__(
        self,
        store: BatchStore,
        kind: BatchKind,
        *,
        clock: Clock,
        send: Send,
        forget: Callable[[ItemId], object],
        wake: Wake | None = None,
        hooks: Hooks | None = None,
    ) -> None:
        self.store = store
        self.kind = kind
        self.clock = clock
        self.send = send
        # Called for each item whose result finalize wrote (or lost): its
        # runner holds it no longer.
        self.forget = forget
        self.wake = wake
        # Observers of item outcomes (item_finished; shoal.metrics counts them).
        self.hooks = hooks if hooks is not None else Hooks()
        # Items handed back at shutdown (unstarted, or stopped mid-run).
        self.handed_back = 0

    async def finalize(
        self, conn: AsyncConn, batch: Sequence[tuple[ClaimedJob, Outcome]]
    ) -> dict[JobId, str]:
        """Record finished items' results, for a whole batch, and complete their jobs.

        One fenced statement; a task it leaves with nothing pending or running
        wakes the aggregator (asked again once the statement has committed
        for a task whose last items another write held). ``conn`` is in
        autocommit, as the completer's is. Jobs the runner's ``claim`` took are gone already
        (deleted); any other (a job the runner did not claim) is completed in the same
        statement. Returns the jobs complete, each with the outcome of its
        item's run as a job outcome (:func:`job_outcome`).
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
            self.forget(d.item_id)
            if self.hooks:
                self.report(d.item_id, "completed" if d.item_id in recorded.items else "lost")
            if d.item_id not in recorded.items:
                log.warning(
                    "item %s: a run lost its fence (reaped or cancelled meanwhile); "
                    "its result was not recorded",
                    d.item_id,
                )
        finished = recorded.finished_tasks
        if recorded.tail_tasks and not finished and self.wake is not None:
            # Their last items were running in another write when this one
            # began: asked again now that this write has committed (``conn``
            # is in autocommit), so of two writes that end a task together,
            # the one that commits last sees it finished.
            finished = await self.store.finished_tasks(conn, recorded.tail_tasks)
        if finished and self.wake is not None:
            await self.store.db.run(self.wake)
        return {
            claim.id: job_outcome(outcome, recorded.items)
            for claim, outcome in batch
            if claim.lease_expires_at is None or claim.id in recorded.jobs
        }

    async def _wake_if_finished(self, conn: AsyncConn, task_ids: set[TaskId]) -> None:
        if self.wake is not None and await self.store.finished_tasks(conn, list(task_ids)):
            await self.wake(conn)

    async def hand_back_unstarted(self, unstarted: Sequence[tuple[ItemId, int]]) -> int:
        """running -> pending for items (id, fence) guarded for jobs that never ran.

        One statement for them all, and a new job for each in the same
        transaction: the one each was claimed with was a one-shot delivery.
        Returns how many were handed back.
        """

        async def release(conn: AsyncConn) -> int:
            back = await self.store.hand_back_items(
                conn,
                unstarted,
                message=HANDED_BACK.format(process=this_process()),
                now=self.clock.sql_now(),
            )
            if back:
                await self.send(conn, back, NO_DELAY)
            return len(back)

        handed = await self.store.db.run(release)
        self.handed_back += handed
        return handed

    async def hand_back(
        self,
        item: Item,
        *,
        resend: timedelta | None,
        message: str | None = None,
        note_type: str = "Interrupted",
    ) -> None:
        """running -> pending for a run that costs no attempt: our shutdown stopped it, or it
        snoozed.

        With ``resend``, the item gets a new job due after that delay, in the
        same transaction. ``message`` and ``note_type`` are its history note
        (by default, the shutdown's). Shielded from cancellation and retried
        when transient.
        """

        async def hand_back(conn: AsyncConn) -> bool:
            back = await self.store.hand_back_items(
                conn,
                [(item.id, item.fence)],
                message=message or INTERRUPTED.format(process=this_process()),
                now=self.clock.sql_now(),
                note_type=note_type,
            )
            if back and resend is not None:
                await self.send(conn, back, resend)
            if not back:
                log.warning(
                    "item %s: run %d lost its fence before its hand-back", item.id, item.fence
                )
            return bool(back)

        for attempt in range(FINAL_WRITE_TRIES):
            try:
                if await asyncio.shield(self.store.db.run(hand_back)):
                    self.handed_back += 1
                return
            except TransientError as exc:
                if attempt == FINAL_WRITE_TRIES - 1:
                    raise
                log.warning("item %s: handing back failed (%s); retrying", item.id, exc)
                await self.clock.sleep(0.2 * 2**attempt)

    async def fail(
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
                failed = await self.store.fail_item(
                    item.id,
                    item.fence,
                    status=status,
                    message=f"{type(error).__name__}: {error}",
                    entry=error_entry(item.attempt, error, self.clock.now().isoformat()),
                    now=self.clock.sql_now(),
                    conn=conn,
                )
                if failed is not None and status is ItemStatus.ERROR:
                    await self._wake_if_finished(conn, {item.task_id})
                if failed is not None and resend is not None:
                    dispatch = self._dispatch(item.id, item.fence, failed.partition_key)
                    await self.send(conn, [dispatch], resend)
                return failed is not None

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

    def _dispatch(self, item_id: ItemId, fence: int, partition_key: str | None) -> Dispatch:
        return Dispatch(
            item_id,
            fence,
            ItemStatus.PENDING,
            self.kind.queue,
            self.kind.job_options,
            partition_key,
        )

    def report(self, item_id: ItemId, outcome: str) -> None:
        self.hooks.emit(
            "item_finished", self.kind.queue, kind=self.kind.name, item_id=item_id, outcome=outcome
        )
