"""``work()``: runs a handler over a queue with bounded concurrency.

Three kinds of task cooperate, all in one process:

- the *fetcher* (:mod:`shoal.queue.fetcher`) claims jobs in batches into a
  small local buffer, and checks that a buffered job's lease still holds
  before it is started;
- ``concurrency`` *runners* (this module) take jobs from the buffer and run
  the handler, each under the job's execution deadline (``expire_in``, pushed
  back by heartbeats);
- the *completer* (:mod:`shoal.queue.completer`) writes outcomes in
  batches: all that finished while its last write was in flight go in the
  next one. Its writes are retried on transient errors and finished at
  shutdown; an outcome lost to a crash only means the job runs again when its
  lease expires (at-least-once).

Every final write names the attempt the runner was handed, so a runner that
lost its lease can never overwrite the outcome of the job's next attempt.

A job cancelled while this worker holds it is stopped here: the cancel's
NOTIFY (job id and attempt) reaches the worker through the process's
notifier, and the runner's task is cancelled (a buffered job is dropped
unrun). A heartbeat that finds the job cancelled does the same, for a
notification that never came; so does the notifier's reconnection, for all
running jobs at once. The job is ``cancelled`` already; the worker only notes
on its history that the handler was stopped.

A job's lease runs from its claim, not from the start of its handler: the
execution deadline counts from the lease the fetcher confirmed
(:meth:`Fetcher.lease_start <shoal.queue.fetcher.Fetcher.lease_start>`).

What is observed is observed at the seams, never inside the loops: the
fetcher reports each claim as it buffers it (``fetched``), the runner calls the
handler in one place (:meth:`Worker._call`: the span of :mod:`shoal.tracing`,
``job_ran``), and the completer reports each outcome it writes
(``job_finished``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from shoal.clock import Clock
from shoal.errors import ExpiredError, InvalidInput
from shoal.hooks import Hooks
from shoal.queue.completer import Completer, Finalize
from shoal.queue.cursor import ClaimCursor
from shoal.queue.fetcher import DEFAULT_MAX_BATCH, Claim, Fetcher
from shoal.queue.job import (
    COMPLETED,
    AsyncHandler,
    Completed,
    Failed,
    Interrupted,
    Job,
    Outcome,
    Stopped,
    outcome_of,
)
from shoal.queue.limit_store import LimitStore
from shoal.queue.limits import Limits
from shoal.queue.notifier import CancelNote, Notifier
from shoal.queue.results import callable_name, encode_result, returned_by
from shoal.queue.retry import Jitter
from shoal.queue.rows import ClaimedJob
from shoal.queue.states import JobId
from shoal.queue.store import JobStore
from shoal.tracing import traced_handler

log = logging.getLogger("shoal.worker")

DEFAULT_CONCURRENCY = 10
DEFAULT_POLL_INTERVAL = timedelta(seconds=2)
DEFAULT_SHUTDOWN_GRACE = timedelta(seconds=30)
# The deadline watchdog looks at least this often.
WATCHDOG_MAX_SLEEP_S = 0.25
# The message of the cancellation that stop() sends to handlers still running
# after the grace period. A handler (the batch layer's ItemRunner) tells by it a
# run stopped by our own shutdown, which costs no attempt, from one cut off by
# its execution timeout, which does.
SHUTDOWN = "shoal: worker shutdown"
# The message of the cancellation that stops a handler whose job someone
# cancelled. The job is cancelled already: the run costs nothing more.
CANCELLED_RUN = "shoal: job cancelled"


def is_shutdown(error: BaseException) -> bool:
    """Whether ``error`` is the cancellation of a run by the worker's shutdown."""
    return isinstance(error, asyncio.CancelledError) and SHUTDOWN in error.args


def stop_run(task: asyncio.Task[Any]) -> None:
    """Stop a run someone cancelled: cancel its task, unless it is the caller's own.

    A task that cancels itself would take the cancellation at its next await,
    wherever that is (after its handler returned, in the runner's loop); it
    raises it at once instead (see the heartbeats).
    """
    if task is asyncio.current_task():
        raise asyncio.CancelledError(CANCELLED_RUN)
    task.cancel(CANCELLED_RUN)


def take_cancel(task: asyncio.Task[Any]) -> None:
    """Withdraw the cancel request stop_run made on ``task``, once its run has ended."""
    if task.cancelling():
        task.uncancel()


@dataclass(frozen=True, slots=True)
class WorkerStats:
    claimed: int
    completed: int
    failed: int
    retried: int
    released: int
    lost: int  # outcomes whose fence failed: the job was no longer ours
    handed_back: int = 0  # of the released: jobs handed back at shutdown (no attempt spent)


class Worker:
    """A running ``work(queue, handler)`` loop. Use :meth:`Shoal.work` to start one."""

    def __init__(
        self,
        store: JobStore,
        queue: str,
        handler: AsyncHandler,
        *,
        concurrency: int,
        batch_size: int | None,
        poll_interval: timedelta,
        clock: Clock,
        jitter: Jitter,
        notifier: Notifier | None,
        claim: Claim | None = None,
        claim_cursor: ClaimCursor[Any] | None = None,
        finalize: Finalize | None = None,
        store_output: bool = True,
        hooks: Hooks | None = None,
        limits: Limits | None = None,
        max_hold: timedelta | None = None,
        handler_name: str | None = None,
        limit_store: LimitStore | None = None,
    ) -> None:
        if concurrency < 1:
            raise InvalidInput("concurrency", f"must be an integer >= 1, got {concurrency!r}")
        self.store = store
        self.queue = queue
        self.handler = handler
        # The one place a handler is called from: in a span per run while
        # tracing is on (shoal.tracing), the handler itself while it is off.
        self._traced = traced_handler(queue, handler)
        self.concurrency = concurrency
        self.batch_size = batch_size or DEFAULT_MAX_BATCH
        self.clock = clock
        self.jitter = jitter
        self.notifier = notifier
        self.store_output = store_output
        # Prefixes the error of a run whose result cannot be stored.
        self._returned_by = returned_by(handler_name or callable_name(handler), f"queue {queue!r}")
        # Observers of fetches, outcomes and idleness (shoal.testing.Probe).
        self.hooks = hooks if hooks is not None else Hooks()
        # Writes the outcomes runners hand it, in batches (shoal.queue.completer).
        self.completer = Completer(
            store,
            queue,
            clock=clock,
            jitter=jitter,
            hooks=self.hooks,
            finalize=finalize,
            retry_due=self._retry_due,
            written=self._written,
        )
        # Claims into the buffer the runners take from (shoal.queue.fetcher);
        # owns the buffer, its events and the job rate.
        self.fetcher = Fetcher(
            store,
            limit_store or LimitStore(store.db, store.sql),
            queue,
            concurrency=concurrency,
            batch_size=self.batch_size,
            poll_interval=poll_interval,
            clock=clock,
            completer=self.completer,
            hooks=self.hooks,
            idle=self._report_idle,
            claim=claim,
            claim_cursor=claim_cursor,
            limits=limits,
            max_hold=max_hold,
        )
        # The runners' task of each job taken from the buffer. Written by
        # runners, read by the watchdog and by cancels.
        self._running: dict[JobId, asyncio.Task[Any]] = {}
        # Jobs whose handler runs now. Written by runners, read by the cancel
        # listener and the reconnection check, which stop those cancelled.
        self._handling: dict[JobId, Job] = {}
        # The lookup of cancels missed while the listen connection was down.
        self._cancel_check: asyncio.Task[None] | None = None
        # Execution deadlines on the clock's monotonic time. Written by runners
        # (and heartbeats), read by the watchdog, which cancels overdue runners
        # after adding them to _expired.
        self._deadline_at: dict[JobId, float] = {}
        self._expired: set[JobId] = set()
        self._stopped: asyncio.Future[None] | None = None
        self._stopping = False
        # Set by hurry(): the grace ends now.
        self._hurry = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle -------------------------------------------------------

    def start(self) -> None:
        # Set by a NOTIFY about this queue, or by this worker's own retries
        # that are due at once; with no notifier, only by the latter.
        self.fetcher.wake = (
            self.notifier.subscribe(self.queue) if self.notifier is not None else asyncio.Event()
        )
        if self.notifier is not None:
            self.notifier.listen_cancels(self.queue, self)
        self._fetcher = asyncio.create_task(self.fetcher.run(), name=f"shoal-fetch:{self.queue}")
        self._watchdog = asyncio.create_task(self._watch_deadlines(), name="shoal-deadlines")
        self._tasks = [
            asyncio.create_task(self._run_loop(), name=f"shoal-run:{self.queue}:{i}")
            for i in range(self.concurrency)
        ]
        self._completer = asyncio.create_task(
            self.completer.run(), name=f"shoal-complete:{self.queue}"
        )

    async def stop(self, grace: timedelta = DEFAULT_SHUTDOWN_GRACE) -> None:
        """Stop claiming, let running jobs finish within ``grace``, hand back the rest.

        Handed-back jobs cost no attempt. Returns once every outcome is
        written; a second call waits for the first one's work.
        """
        if self._stopped is None:
            self._stopped = asyncio.ensure_future(self._stop(grace))
        await asyncio.shield(self._stopped)

    async def _stop(self, grace: timedelta) -> None:
        self._stopping = True
        # The fetcher is never cancelled mid-claim: it notices the stop
        # between claims, or is woken from a wait.
        self.fetcher.stop()
        await self._fetcher
        # Jobs claimed but never started go straight back.
        for claim in self.fetcher.hand_back():
            self.completer.record(claim, Interrupted())
        if self._tasks:
            finished = asyncio.ensure_future(asyncio.wait(self._tasks))
            hurried = asyncio.ensure_future(self._hurry.wait())
            await asyncio.wait(
                [finished, hurried],
                timeout=grace.total_seconds(),
                return_when=asyncio.FIRST_COMPLETED,
            )
            finished.cancel()
            hurried.cancel()
            for task in self._tasks:
                if not task.done():
                    task.cancel(SHUTDOWN)
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._watchdog.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._watchdog
        self.completer.exit()
        await self._completer
        if self.notifier is not None and self.fetcher.wake is not None:
            self.notifier.unsubscribe(self.queue, self.fetcher.wake)
            self.notifier.unlisten_cancels(self.queue, self)
        if self._cancel_check is not None:
            self._cancel_check.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._cancel_check

    def hurry(self) -> None:
        """End a stop's grace now: running handlers are cancelled and their jobs handed back.

        For a second Ctrl-C. Before :meth:`stop` it only makes the coming
        stop's grace zero.
        """
        self._hurry.set()

    @property
    def stats(self) -> WorkerStats:
        done = self.completer
        return WorkerStats(
            self.fetcher.claimed,
            done.completed,
            done.failed,
            done.retried,
            done.released,
            done.lost + self.fetcher.dropped,
            done.handed_back,
        )

    @property
    def idle(self) -> asyncio.Event:
        """Set when every outcome handed to the completer is written."""
        return self.completer.idle

    @property
    def in_flight(self) -> int:
        return self.fetcher.held

    async def run_inline(self) -> int:
        """One round in the calling task, for tests: claim, run each handler, record.

        Claims up to ``batch_size`` available jobs, runs them one after the
        other through the same outcome logic as the runners, and writes their
        outcomes before returning how many it claimed (0: none available).
        Use it on a worker that was never started (``shoal.testing.drain``).
        """
        task = asyncio.current_task()
        assert task is not None
        claimed = await self.fetcher.claim_once(self.batch_size)
        batch = []
        for _ in claimed:
            taken = self.fetcher.take()
            assert taken is not None  # claimed just now, so buffered
            claim, leased_at = taken
            outcome = await self._run_one(claim, task, leased_at)
            if outcome is None:
                self.fetcher.lost(claim)
            else:
                self.fetcher.done()
                batch.append((claim, outcome))
        if batch:
            # Not retried here: a database error fails the caller (the test) at once.
            await self.completer.write(batch)
        return len(claimed)

    def _report_idle(self) -> None:
        """Report ``worker_idle`` when the queue looked empty and nothing is left to do."""
        if (
            self.hooks
            and self.fetcher.waiting
            and self.fetcher.empty
            and not self.completer.unrecorded
        ):
            self.hooks.emit("worker_idle", self.queue)

    # -- runners ---------------------------------------------------------

    async def _run_loop(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        while True:
            taken = self.fetcher.take()
            if taken is None:
                if not await self.fetcher.wait_for_jobs():
                    return
                continue
            claim, leased_at = taken
            self._running[claim.id] = task
            try:
                outcome = await self._run_one(claim, task, leased_at)
            except asyncio.CancelledError:
                # Shutdown cut the handler off: hand the job back, no attempt spent.
                self._finish(claim, Interrupted())
                raise
            if outcome is None:
                self._running.pop(claim.id, None)
                self.fetcher.lost(claim)
            else:
                self._finish(claim, outcome)

    async def _run_one(
        self, claim: ClaimedJob, task: asyncio.Task[Any], leased_at: float
    ) -> Outcome | None:
        """Run the handler on a claimed job; None when the job is no longer ours to run."""
        if self.fetcher.take_cancelled(claim):
            return Stopped(started=False)
        # The lease, and so the execution deadline, runs from the claim (or
        # the extension the fetcher makes of a lease half spent in the buffer).
        now = self.clock.monotonic()
        lease_start = self.fetcher.lease_start(claim, leased_at, now)
        if lease_start is None:
            lease_start = await self.fetcher.confirm_lease(claim)
            if lease_start is None:
                return None
            now = self.clock.monotonic()
        job = Job(claim, self._heartbeat)
        self._deadline_at[claim.id] = lease_start + claim.expire_in_s
        self._handling[claim.id] = job
        try:
            outcome = await self._call(job, task, now)
        finally:
            self._handling.pop(claim.id, None)
            self._deadline_at.pop(claim.id, None)
            if self._expired:
                self._expired.discard(claim.id)
            if job.reported_cost is not None:
                self.completer.costs[claim.id] = job.reported_cost
        if job.cancelled and not isinstance(outcome, Stopped):
            # Cancelled as it ended (or its handler caught the cancellation):
            # the job is cancelled whatever the handler made of it.
            take_cancel(task)
            outcome = Stopped(started=True)
        return outcome

    async def _call(self, job: Job, task: asyncio.Task[Any], started: float) -> Outcome:
        """Call the handler on ``job`` and name its outcome: the one place a handler runs.

        The run is traced here (shoal.tracing), timed from ``started`` (the
        clock's monotonic time, read just before) for the fetcher's rate, and
        reported as ``job_ran`` when it ends, whatever it raised.
        """
        claim = job.claim
        outcome: Outcome
        try:
            output = await self._traced(job)
            # Here, not in the completer: a value that cannot be stored fails
            # this run alone, at once, instead of the statement recording a
            # whole batch of outcomes.
            stored = None
            if self.store_output and output is not None:
                stored = encode_result(output, returned_by=self._returned_by)
        except asyncio.CancelledError:
            if job.cancelled:
                take_cancel(task)
                outcome = Stopped(started=True)
            elif claim.id in self._expired and not self._stopping:
                task.uncancel()
                outcome = Failed(
                    ExpiredError(f"handler ran past expire_in={claim.expire_in}"), False
                )
            else:
                raise
        except Exception as exc:
            outcome = outcome_of(exc)
        else:
            outcome = COMPLETED if output is None else Completed(output, stored)
        run_s = self.clock.monotonic() - started
        self.fetcher.ran(run_s)
        if self.hooks:
            self.hooks.emit(
                "job_ran",
                self.queue,
                job_id=claim.id,
                attempt=claim.attempt,
                run_s=run_s,
                created_at=claim.created_at,
                started_at=claim.started_at,
            )
        return outcome

    def _finish(self, claim: ClaimedJob, outcome: Outcome) -> None:
        self._running.pop(claim.id, None)
        self.fetcher.done()
        self.completer.record(claim, outcome)

    async def _watch_deadlines(self) -> None:
        """Cancel handlers that ran past their execution deadline."""
        while True:
            now = self.clock.monotonic()
            nearest = WATCHDOG_MAX_SLEEP_S
            for job_id, at in list(self._deadline_at.items()):
                if at <= now:
                    task = self._running.get(job_id)
                    if task is not None and job_id not in self._expired:
                        log.warning(
                            "job %s ran past its expire_in; cancelling it",
                            job_id,
                            extra={"queue": self.queue, "job_id": job_id},
                        )
                        self._expired.add(job_id)
                        task.cancel()
                else:
                    nearest = min(nearest, at - now)
            await self.clock.sleep(nearest)

    async def _heartbeat(self, job: Job) -> bool:
        if job.claim.lease_expires_at is None:
            held = True  # taken without a lease: there is none to extend
        else:
            leases = await self.store.extend_leases(
                [(job.id, job.attempt)], now=self.clock.sql_now()
            )
            held = job.id in leases
        if held and job.id in self._deadline_at:
            self._deadline_at[job.id] = self.clock.monotonic() + job.claim.expire_in_s
        if not held and await self.store.cancelled_runs([(job.id, job.attempt)]):
            # Cancelled, and its notification never came (or not yet): the
            # heartbeat is the backstop.
            self._stop_cancelled(job)
        return held

    # -- cancels -----------------------------------------------------------

    def cancelled(self, note: CancelNote) -> None:
        """A job was cancelled (the notifier calls this): stop its run if this worker holds it.

        A job of this queue held elsewhere costs two dictionary lookups; a
        buffered one (rare: the buffer holds what runners start soon) a pass
        over the buffer.
        """
        if note.item:
            return
        job = self._handling.get(JobId(note.id))
        if job is not None:
            if job.attempt == note.attempt:
                self._stop_cancelled(job)
            return
        self.fetcher.cancelled(note)

    def cancels_missed(self) -> None:
        """The listen connection was down: look up whether a running job was cancelled."""
        if self._handling and (self._cancel_check is None or self._cancel_check.done()):
            self._cancel_check = asyncio.create_task(
                self._check_cancels(), name=f"shoal-cancels:{self.queue}"
            )

    async def _check_cancels(self) -> None:
        """Stop every running job found cancelled, in one statement."""
        runs = [(job.id, job.attempt) for job in self._handling.values()]
        try:
            cancelled = await self.store.cancelled_runs(runs)
        except Exception:  # loop boundary: a missed cancel is still caught by heartbeats
            log.exception("looking up cancels of running jobs failed", extra={"queue": self.queue})
            return
        for job_id in cancelled:
            job = self._handling.get(job_id)
            if job is not None and (job.id, job.attempt) in runs:
                self._stop_cancelled(job)

    def _stop_cancelled(self, job: Job) -> None:
        """Flag a running job as cancelled and stop its handler's task (once)."""
        if job.cancelled:
            return
        job.mark_cancelled()
        task = self._running.get(job.id)
        log.info(
            "job %s (attempt %d) was cancelled; stopping its handler",
            job.id,
            job.attempt,
            extra={"queue": self.queue, "job_id": job.id},
        )
        if task is not None:
            stop_run(task)

    # -- the completer's callbacks ---------------------------------------------

    def _written(self) -> None:
        """After each write of the completer: room for more, and maybe nothing left to do."""
        self.fetcher.room.set()
        self._report_idle()

    def _retry_due(self) -> None:
        """A job failed into a retry due now: claim again without waiting for a poll."""
        if self.fetcher.wake is not None:
            self.fetcher.wake.set()
