"""Runs one item per job: the phantom guard, the handler, the fenced final write.

The guard is a conditional ``pending -> running`` update: a job delivered for
an item that is already running, finished or cancelled (a duplicate or late
delivery) does nothing and costs no handler call. It is counted as a phantom
skip, unless its item was cancelled (its task was stopped before the item
ran): that delivery was expected, and counts as a cancelled skip.
It runs for a whole claimed batch in the statement that claims its jobs
(``claim``). The worker writes only its own item row, never the task row. Each
outcome is written, by the runner's recorder (:mod:`shoal.batch.recorder`),
fenced by the attempt the guard handed out:

- the handler returns: ``completed`` with its result, written by ``finalize``
  for a whole batch of finished items in the statement that completes their
  jobs; a task left with nothing pending or running wakes the aggregator;
- a permanent error, or a transient one on the last attempt: ``error`` with
  the message (the job then completes: the item's outcome is recorded);
- a transient error with attempts left: back to ``pending``, and the error is
  re-raised so the queue retries the job with backoff;
- stopped by this worker's shutdown: handed back to ``pending`` with a new
  job, without spending an attempt (an ``Interrupted`` note is appended to its
  history, not an error);
- cut off by the job's execution timeout (``expire_in``): back to ``pending``
  with a new job, and the attempt counts, as a failure.

While the handler runs, a heartbeat loop refreshes the item's ``updated_at``
every quarter of the zombie timeout, so only a dead or frozen process lets an
item go stale.

Cancelling a task cancels its running items in the same transaction and
notifies the processes running them (item id and fence, on the queue layer's
cancel channel). The runner holding such an item stops its handler (cancels
its task; a thread only sees ``item.cancelled``) and writes nothing: the item
is ``cancelled`` already. A buffered one is skipped as a cancelled skip. A
heartbeat that no longer finds a running item looks whether it was cancelled,
which catches a notification that never came.

A claimed item waits in the worker's buffer until a runner is free. If the
process stops giving signs of life meanwhile (paused, or its heartbeats failed
through a database restart), the aggregator reaps the item and another worker
may run it. So a buffered item is never started on trust: the heartbeat loop
drops every item its answer no longer names, and a run starts only on an item
whose fence was confirmed (by its claim or a heartbeat) less than half the
zombie timeout ago; an older one is confirmed by one more fenced heartbeat
first. An item taken elsewhere is skipped as ``superseded``: its handler
never runs here. The window that remains is a run already started when the
process stops (docs/batch.md).

A claimed item is ``running`` (fenced, heartbeated) from its claim on, but
progress counts it as running only while a handler runs it: a mark loop sets
the item's ``in_handler`` once its handler has run for ``MARK_AFTER`` (one
statement for all such items), and clears it when the handler ends before the
result is recorded. So what users see running is bounded by the kind's
concurrency in each worker, whatever the worker holds in its buffer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from shoal.batch.item import Item
from shoal.batch.kinds import BatchKind
from shoal.batch.recorder import NO_DELAY, SKIPPED, ItemDone, ItemRecorder, Send, Wake
from shoal.batch.rows import GuardedItem
from shoal.batch.states import ItemId, ItemStatus
from shoal.batch.store import BatchStore
from shoal.clock import Clock, work_seconds
from shoal.db.coalesce import Coalescer
from shoal.errors import RetryAfter, Snooze, TransientError
from shoal.hooks import Hooks
from shoal.queue.completer import backoff_s
from shoal.queue.cursor import ClaimCursor, ItemPosition, item_order
from shoal.queue.job import Job
from shoal.queue.notifier import CancelNote
from shoal.queue.results import callable_name, encode_result, returned_by
from shoal.queue.retry import SYSTEM_JITTER, Jitter, retry_delay
from shoal.queue.rows import ClaimedJob
from shoal.queue.states import JobId
from shoal.queue.worker import is_shutdown, stop_run, take_cancel

log = logging.getLogger("shoal.batch")

PHANTOM_SKIPS = "phantom_skips"
CANCELLED_SKIPS = "cancelled_skips"
SUPERSEDED_SKIPS = "superseded_skips"
# A handler is marked as running once it has run this long. Shorter runs are
# never marked (the many marks of fast items would cost a write each); the
# running count users see lags a handler's start by about this much.
MARK_AFTER = timedelta(milliseconds=50)


class Held(NamedTuple):
    """An item this runner holds: its fence, and when that fence was last confirmed.

    ``at`` is the clock's monotonic time at which the statement that last
    refreshed the item's sign of life (its claim, or a heartbeat that named
    it) was sent: the item's ``updated_at`` is no older than that.
    """

    fence: int
    at: float


# Marks a job missing from ItemRunner._prepared.
_UNCLAIMED: Any = object()


class ItemRunner:
    """The queue handler of one kind's item jobs (with ``claim``; its ``recorder`` finalizes)."""

    def __init__(
        self,
        store: BatchStore,
        kind: BatchKind,
        *,
        clock: Clock,
        send: Send,
        jitter: Jitter = SYSTEM_JITTER,
        wake: Wake | None = None,
        hooks: Hooks | None = None,
    ) -> None:
        self.store = store
        self.kind = kind
        self.clock = clock
        self.jitter = jitter
        # Items held by this process (claimed, buffered or running), by id,
        # with their fence and when it was last confirmed. Written by claims,
        # runs and the heartbeat loop (which drops what its answer no longer
        # names); read by runs before they start a handler.
        self._held: dict[ItemId, Held] = {}
        # Items whose handler runs now, with their fence and the clock's
        # monotonic start. Written by runs, read by the mark loop.
        self._in_handler: dict[ItemId, tuple[int, float]] = {}
        # Items whose handler runs now, with the task running it. Written by
        # runs, read by the cancel listener and the heartbeats, which stop
        # those cancelled.
        self._running_items: dict[ItemId, tuple[Item, asyncio.Task[Any]]] = {}
        # Buffered items someone cancelled (their task): skipped when their
        # job runs. Written by the cancel listener, taken by runs.
        self._cancelled_buffered: set[ItemId] = set()
        # The lookup of cancels missed while the listen connection was down.
        self._cancel_check: asyncio.Task[None] | None = None
        # Items marked in_handler in the database, with their fence. Written
        # and read by the mark loop only.
        self._marked: dict[ItemId, int] = {}
        # Guard results of claimed jobs not yet run, by job id (None: phantom).
        # Written by claim(), taken by the job's run.
        self._prepared: dict[JobId, GuardedItem | None] = {}
        self.phantom_skips = 0
        # Where the next claim of the kind's item jobs starts (claim() only;
        # the worker's idle wait reads when a claim from the head is owed).
        self.cursor: ClaimCursor[ItemPosition] = ClaimCursor(item_order)
        # Writes the outcomes of runs (shoal.batch.recorder); its hooks are
        # the observers of item outcomes (item_finished).
        self.recorder = ItemRecorder(
            store,
            kind,
            clock=clock,
            send=send,
            forget=self._forget,
            wake=wake,
            hooks=hooks,
        )
        self.hooks = self.recorder.hooks
        # The guard and the completion of concurrent items share round trips.
        self._guard: Coalescer[ItemId, GuardedItem | None] = Coalescer(
            self._guard_many, name=f"shoal-guard:{kind.name}"
        )
        self.superseded_skips = 0
        # Prefixes the error of a run whose result cannot be stored.
        self._returned_by = returned_by(callable_name(kind.handler), f"batch kind {kind.name!r}")

    async def claim(self, queue: str, limit: int, *, now: datetime | None) -> list[ClaimedJob]:
        """Claim item jobs and guard their items in one statement (the worker's ``claim``).

        The claim starts after the last item job this runner claimed, or at
        the head of the queue when :attr:`cursor` says one is due. Items that
        pass count as running (and get heartbeats) from here on;
        ``release_unstarted`` hands back those whose job never ran.
        """
        after = self.cursor.start(work_seconds())
        sent = self.clock.monotonic()
        claimed = await self.store.claim_items(queue, limit, now=now, after=after)
        self.cursor.moved(
            after,
            claimed.last,
            count=len(claimed.jobs),
            limit=limit,
            ended=work_seconds(),
            cost_s=claimed.cost_s,
        )
        for job, guarded in claimed.jobs:
            self._prepared[job.id] = guarded
            if guarded is not None:
                self._held[guarded.id] = Held(guarded.fence, sent)
        return [job for job, _ in claimed.jobs]

    async def release_unstarted(self) -> int:
        """Put items guarded for jobs that never ran (shutdown) back to pending.

        One statement for them all, and a new job for each in the same
        transaction: the one it was claimed with was a one-shot delivery.
        """
        unstarted = [(g.id, g.fence) for g in self._prepared.values() if g is not None]
        self._prepared.clear()
        for item_id, _ in unstarted:
            self._held.pop(item_id, None)
        if not unstarted:
            return 0
        return await self.recorder.hand_back_unstarted(unstarted)

    async def close(self) -> None:
        """Stop the guard's flusher task (a stopped worker's; the next guard starts another)."""
        await self._guard.close()

    def _forget(self, item_id: ItemId) -> None:
        """Hold ``item_id`` no longer (its result is written, or lost its fence)."""
        self._held.pop(item_id, None)

    async def _guard_many(self, ids: Sequence[ItemId]) -> list[GuardedItem | None]:
        passed = await self.store.guard_items(ids, now=self.clock.sql_now())
        return [passed.get(item_id) for item_id in ids]

    def _heard(
        self, asked: Sequence[tuple[ItemId, int]], still: Collection[ItemId], sent: float
    ) -> int:
        """Take a heartbeat's answer: confirm the items it names, drop the rest.

        Only entries whose fence is the one asked about are touched: an item
        recorded (or claimed again) while the heartbeat was in flight is not
        this answer's to change. Returns how many items were dropped.
        """
        dropped = 0
        for item_id, fence in asked:
            current = self._held.get(item_id)
            if current is None or current.fence != fence:
                continue
            if item_id in still:
                if current.at < sent:
                    self._held[item_id] = Held(fence, sent)
            else:
                del self._held[item_id]
                dropped += 1
        return dropped

    async def _still_held(self, guarded: GuardedItem) -> bool:
        """Whether this run may start: the item's fence is this process's, confirmed lately.

        No statement while the fence was confirmed less than half the zombie
        timeout ago (the aggregator reaps only past the whole of it);
        otherwise one fenced heartbeat answers, and refreshes the item when
        it is still held (needed only after the process stalled). A failed heartbeat is
        tried again until one answers: starting on an unconfirmed fence is
        what this check is for.
        """
        held = self._held.get(guarded.id)
        if held is None or held.fence != guarded.fence:
            return False
        if self.clock.monotonic() - held.at < self.kind.zombie_timeout.total_seconds() / 2:
            return True
        asked = [(guarded.id, guarded.fence)]
        errors = 0
        while True:
            sent = self.clock.monotonic()
            try:
                still = await self.store.heartbeat_items(asked, now=self.clock.sql_now())
            except TransientError as exc:
                delay = backoff_s(errors)
                errors += 1
                log.warning(
                    "item %s: confirming its claim before running it failed (%s); "
                    "retrying in %.1fs",
                    guarded.id,
                    exc,
                    delay,
                )
                await self.clock.sleep(delay)
                continue
            self._heard(asked, still, sent)
            return guarded.id in still

    @property
    def heartbeat_interval(self) -> timedelta:
        return self.kind.zombie_timeout / 4

    async def __call__(self, job: Job) -> Any:
        guarded = self._prepared.pop(job.id, _UNCLAIMED)
        buffered = guarded is not _UNCLAIMED
        if buffered and guarded is not None and guarded.id in self._cancelled_buffered:
            # Its task was cancelled while it waited here: skipped, as cancelled.
            self._cancelled_buffered.discard(guarded.id)
            self._held.pop(guarded.id, None)
            guarded = None
        if not buffered:  # a job this runner did not claim (no claim=self.claim)
            guarded = await self._guard.submit(ItemId(int(job.data["item"])))
        if guarded is None:
            item_id = ItemId(int(job.data["item"]))
            counted = await self.store.count_skip(
                item_id, phantom=PHANTOM_SKIPS, cancelled=CANCELLED_SKIPS
            )
            if counted == CANCELLED_SKIPS:
                log.debug("item %s: cancelled, its delivery skipped (job %s)", item_id, job.id)
                if self.hooks:
                    self.recorder.report(item_id, "skipped_cancelled")
                return {SKIPPED: "cancelled"}
            self.phantom_skips += 1
            log.info("item %s: phantom delivery skipped (job %s)", item_id, job.id)
            if self.hooks:
                self.recorder.report(item_id, "phantom")
            return {SKIPPED: "phantom"}
        if not buffered:
            # Guarded just now, for this run: confirmed by the guard itself.
            self._held[guarded.id] = Held(guarded.fence, self.clock.monotonic())
        elif not await self._still_held(guarded):
            # Taken from this process while it waited in the buffer (reaped,
            # or its task cancelled): its attempt is someone else's now.
            self.superseded_skips += 1
            log.warning(
                "item %s: its claim was superseded while it waited in this worker's buffer "
                "(no sign of life for %s); not run here (job %s)",
                guarded.id,
                self.kind.zombie_timeout,
                job.id,
            )
            await self.store.count_event(SUPERSEDED_SKIPS)
            if self.hooks:
                self.recorder.report(guarded.id, "superseded")
            return {SKIPPED: "superseded"}
        item = Item(guarded, job, self._heartbeat)
        if guarded.run > guarded.max_attempts:
            error = RuntimeError(f"no attempts left ({guarded.max_attempts} allowed)")
            await self.recorder.fail(item, ItemStatus.ERROR, error)
            if self.hooks:
                self.recorder.report(item.id, "error")
            return {"item": "error"}
        # A job claim() took is gone already (a one-shot delivery): a run
        # that ends without a result sends its item a new job. Any other job
        # is retried, or handed back, by the queue.
        taken = job.claim.lease_expires_at is None
        task = asyncio.current_task()
        assert task is not None
        self._in_handler[guarded.id] = (guarded.fence, self.clock.monotonic())
        self._running_items[guarded.id] = (item, task)
        try:
            result = await self.kind.handler(item)
            # A result that cannot be stored fails this run like an error of
            # the handler's, here, not the statement that records a batch.
            stored = encode_result(result, returned_by=self._returned_by)
        except asyncio.CancelledError as cancel:
            self._held.pop(guarded.id, None)
            if item.cancelled:
                take_cancel(task)
                return self._stopped(item)
            if is_shutdown(cancel):
                # Our own shutdown stopped it: no attempt spent, no error.
                await self.recorder.hand_back(item, resend=NO_DELAY if taken else None)
                outcome = "released"
            else:
                # The execution timeout (expire_in) cut it off: a failed run.
                await self.recorder.fail(
                    item,
                    ItemStatus.PENDING,
                    TimeoutError(f"run cut off by expire_in={self.kind.expire_in}"),
                    resend=NO_DELAY if taken else None,
                )
                outcome = "retried"
            if self.hooks:
                self.recorder.report(item.id, outcome)
            raise
        except Exception as exc:
            self._held.pop(guarded.id, None)
            if item.cancelled:
                take_cancel(task)
                return self._stopped(item)
            if isinstance(exc, Snooze):
                return await self._snoozed(item, exc, taken)
            last = guarded.run >= guarded.max_attempts
            if self.kind.is_permanent(exc) or last:
                await self.recorder.fail(item, ItemStatus.ERROR, exc)
                if self.hooks:
                    self.recorder.report(item.id, "error")
                return {"item": "error"}
            if self.hooks:
                self.recorder.report(item.id, "retried")
            if taken:
                # The backoff the queue would apply, counted in runs of the item.
                delay = retry_delay(guarded.run, job.claim.policy, self.jitter)
                await self.recorder.fail(item, ItemStatus.PENDING, exc, resend=delay)
                return {"item": "retry", "in_s": delay.total_seconds()}
            await self.recorder.fail(item, ItemStatus.PENDING, exc)
            raise
        finally:
            del self._in_handler[guarded.id]
            del self._running_items[guarded.id]
        if item.cancelled:
            # Cancelled as it ended: its result would be refused anyway.
            self._held.pop(guarded.id, None)
            take_cancel(task)
            return self._stopped(item)
        # Still held (heartbeats continue) until finalize records the result.
        return ItemDone(guarded.id, guarded.fence, guarded.task_id, stored)

    async def _snoozed(self, item: Item, snooze: Snooze, taken: bool) -> dict[str, Any]:
        """A handler that raised Snooze or RetryAfter: its item waits ``delay``, no attempt spent.

        A job taken without a lease (a kind without limits) is gone: the item
        gets a new job due after the delay. A leased job (a kind with limits)
        is the queue's to put back: the Snooze goes on up to the queue's
        worker, which releases the job for the delay and, for RetryAfter,
        holds back the job's partition as long (docs/limits.md).
        """
        pause = isinstance(snooze, RetryAfter)
        note_type = "RetryAfter" if pause else "Snoozed"
        message = f"{snooze}: back to pending without spending an attempt"
        await self.recorder.hand_back(
            item,
            resend=snooze.delay if taken else None,
            message=message,
            note_type=note_type,
        )
        if self.hooks:
            self.recorder.report(item.id, "snoozed")
        if not taken:
            raise snooze
        return {"item": "snoozed", "in_s": snooze.delay.total_seconds()}

    def _stopped(self, item: Item) -> dict[str, str]:
        """A run whose item was cancelled: nothing to write, the item is cancelled already."""
        log.info("item %s: its task was cancelled; its handler was stopped", item.id)
        if self.hooks:
            self.recorder.report(item.id, "cancelled")
        return {"item": "cancelled"}

    # -- cancels -----------------------------------------------------------

    def cancelled(self, note: CancelNote) -> None:
        """An item was cancelled (the notifier calls this): stop its run if held here."""
        if not note.item:
            return
        item_id = ItemId(note.id)
        running = self._running_items.get(item_id)
        if running is not None:
            if running[0].fence == note.attempt:
                self._stop_cancelled(*running)
            return
        held = self._held.get(item_id)
        if held is not None and held.fence == note.attempt:
            self._cancelled_buffered.add(item_id)

    def cancels_missed(self) -> None:
        """The listen connection was down: look up whether a running item was cancelled."""
        if self._running_items and (self._cancel_check is None or self._cancel_check.done()):
            runs = [(i, item.fence) for i, (item, _) in self._running_items.items()]
            self._cancel_check = asyncio.create_task(
                self._check_cancels(runs), name=f"shoal-cancels:{self.kind.name}"
            )

    async def _check_cancels(self, runs: Sequence[tuple[ItemId, int]]) -> None:
        try:
            await self._stop_if_cancelled(runs)
        except Exception:  # loop boundary: a missed cancel is still caught by heartbeats
            log.exception("looking up cancels of running %s items failed", self.kind.name)

    async def _stop_if_cancelled(self, runs: Sequence[tuple[ItemId, int]]) -> None:
        """Stop the handlers of these runs (item id, fence) whose item was cancelled."""
        cancelled = await self.store.cancelled_items(runs)
        for item_id, fence in runs:
            running = self._running_items.get(item_id)
            if item_id in cancelled and running is not None and running[0].fence == fence:
                self._stop_cancelled(*running)

    def _stop_cancelled(self, item: Item, task: asyncio.Task[Any]) -> None:
        """Flag a running item as cancelled and stop its handler's task (once)."""
        if item.cancelled:
            return
        item.mark_cancelled()
        log.info("item %s: its task was cancelled; stopping its handler", item.id)
        stop_run(task)

    async def _heartbeat(self, item: Item) -> bool:
        asked = [(item.id, item.fence)]
        sent = self.clock.monotonic()
        held = await self.store.heartbeat_items(asked, now=self.clock.sql_now())
        self._heard(asked, held, sent)
        if item.id not in held:
            # The backstop of a lost cancel notification: raises in the
            # handler's own task when the item was cancelled.
            await self._stop_if_cancelled(asked)
            return False
        await item.job.heartbeat()
        return True

    async def mark_handlers(self) -> int:
        """Mark items whose handler has run for ``MARK_AFTER``; unmark ended ones.

        One fenced statement. An item unmarked here had its handler end before
        its result was recorded; one whose result is recorded (or whose run
        failed) is no longer running, and needs no write. Because each
        statement marks only handlers running when it is built, and unmarks
        every earlier mark whose handler ended, no more items are marked than
        the kind's concurrency. Returns how many marks were written.
        """
        now = self.clock.monotonic()
        after = MARK_AFTER.total_seconds()
        marks = [
            (item_id, fence, True)
            for item_id, (fence, at) in self._in_handler.items()
            if item_id not in self._marked and now - at >= after
        ]
        for item_id, fence in list(self._marked.items()):
            running = self._in_handler.get(item_id)
            if running is not None and running[0] == fence:
                continue
            held = self._held.get(item_id)
            if held is not None and held.fence == fence:  # ended, result not yet recorded
                marks.append((item_id, fence, False))
            else:  # recorded or failed: no longer running
                del self._marked[item_id]
        if not marks:
            return 0
        await self.store.mark_handlers(marks)
        for item_id, fence, on in marks:
            if on:
                self._marked[item_id] = fence
            else:
                self._marked.pop(item_id, None)
        return len(marks)

    async def mark_loop(self) -> None:
        """Keep the in-handler marks of this process's items current."""
        while True:
            await self.clock.sleep(MARK_AFTER.total_seconds())
            try:
                await self.mark_handlers()
            except TransientError as exc:
                log.warning("marking running items failed: %s", exc)
            except Exception:  # loop boundary: marks must keep going
                log.exception("marking running items failed")

    async def heartbeat_once(self) -> int:
        """Refresh every item this process holds; drop those the answer no longer names.

        Returns how many were dropped: reaped (this process gave no sign of
        life for the zombie timeout) or cancelled. One that was still
        buffered will not run here (``__call__`` skips it).
        """
        if not self._held:
            return 0
        asked = [(item_id, held.fence) for item_id, held in self._held.items()]
        sent = self.clock.monotonic()
        still = await self.store.heartbeat_items(asked, now=self.clock.sql_now())
        dropped = self._heard(asked, still, sent)
        gone = [
            (item_id, fence)
            for item_id, fence in asked
            if item_id not in still
            and item_id in self._running_items
            and self._running_items[item_id][0].fence == fence
        ]
        if gone:
            # Handlers of items no longer running: stopped if cancelled (the
            # backstop of a lost notification); reaped ones run on, as before.
            await self._stop_if_cancelled(gone)
        if dropped:
            log.warning(
                "%d %s items were taken from this worker (no sign of life for %s, "
                "or cancelled); those not started yet will not run here",
                dropped,
                self.kind.name,
                self.kind.zombie_timeout,
            )
        return dropped

    async def heartbeat_loop(self) -> None:
        """Refresh the sign of life of every item held in this process."""
        while True:
            await self.clock.sleep(self.heartbeat_interval.total_seconds())
            try:
                await self.heartbeat_once()
            except TransientError as exc:
                log.warning("item heartbeat failed: %s", exc)
            except Exception:  # loop boundary: heartbeats must keep going
                log.exception("item heartbeat failed")
