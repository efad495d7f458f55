"""``work()``: runs a handler over a queue with bounded concurrency.

Three kinds of task cooperate, all in one process:

- the *fetcher* claims jobs in batches (``FOR UPDATE SKIP LOCKED``, one round
  trip for up to ``batch_size`` jobs) into a small local buffer, whenever the
  buffer has room for half a batch; when the queue is empty it waits for a
  NOTIFY or the poll interval;
- ``concurrency`` *runners* take jobs from the buffer and run the handler,
  each under the job's execution deadline (``expire_in``, pushed back by
  heartbeats);
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

A job's lease runs from its claim, not from the start of its handler: a job
that waited in the buffer has less of it left. So a runner never starts a
handler on trust. A job whose lease is half spent (by the worker's own clock,
from when its claim was sent) is first extended by one fenced statement; one
that is no longer this worker's (the lease ran out, maintenance gave it to
another worker) is dropped unrun and counted as lost. The buffer is also kept
to what the runners can start within a quarter of the shortest lease at the
current rate, and the execution deadline counts from the lease, not from the
handler's start.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
from collections import deque
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from shoal.clock import Clock, work_seconds
from shoal.errors import ExpiredError, InvalidInput, TransientError
from shoal.hooks import Hooks
from shoal.queue.completer import MAX_RECORD_BATCH, Completer, Finalize, backoff_s
from shoal.queue.cursor import ClaimCursor, job_order
from shoal.queue.job import (
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

log = logging.getLogger("shoal.worker")

DEFAULT_CONCURRENCY = 10
DEFAULT_POLL_INTERVAL = timedelta(seconds=2)
DEFAULT_SHUTDOWN_GRACE = timedelta(seconds=30)
# Most jobs claimed in one round trip. Reached only by fast jobs: the prefetch
# follows the measured job rate, so slow jobs are claimed about as runners
# free up (measured here: 100 drained no-op jobs at ~12k/s, 500 at ~20k/s).
DEFAULT_MAX_BATCH = 500
# The deadline watchdog looks at least this often.
WATCHDOG_MAX_SLEEP_S = 0.25
# A worker of a limited queue whose claim came back short (the limits held
# jobs back, or none were waiting) claims again when one of its own jobs
# finishes, on a NOTIFY, or after this long: a slot freed or a token refilled
# in the database wakes nobody.
LIMITED_POLL_INTERVAL = timedelta(milliseconds=100)
# How often a worker without limits of its own looks whether another process
# declared (or cleared) some for its queue.
LIMITS_RECHECK = timedelta(seconds=30)
# How long a worker's first claim waits for its process's registry row.
REGISTRY_WAIT_S = 5.0
# The message of the cancellation that stop() sends to handlers still running
# after the grace period. A handler (the batch layer's ItemRunner) tells by it a
# run stopped by our own shutdown, which costs no attempt, from one cut off by
# its execution timeout, which does.
SHUTDOWN = "shoal: worker shutdown"
# The message of the cancellation that stops a handler whose job someone
# cancelled. The job is cancelled already: the run costs nothing more.
CANCELLED_RUN = "shoal: job cancelled"


def smooth(average: float, sample: float) -> float:
    """An exponential moving average that starts at its first sample, not at 0.0."""
    return sample if average == 0.0 else 0.7 * average + 0.3 * sample


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


class Claim(Protocol):
    """Called by the fetcher in place of :meth:`JobStore.claim`.

    Lets a layer above claim jobs and do its per-job set-up for all of them in
    the same statement (the batch layer: the phantom guard of their items).
    """

    def __call__(
        self, queue: str, limit: int, *, now: datetime | None
    ) -> Awaitable[Sequence[ClaimedJob]]: ...


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
        # Declares this worker's limits, or learns whether its queue has some.
        self.limit_store = limit_store or LimitStore(store.db, store.sql)
        self.queue = queue
        self.handler = handler
        self.concurrency = concurrency
        self.batch_size = batch_size or DEFAULT_MAX_BATCH
        self.poll_interval = poll_interval
        self.clock = clock
        self.jitter = jitter
        self.notifier = notifier
        self.claim = claim or (store.claim_limited if limits else store.claim)
        # Declared before the first claim. A worker without limits of its own
        # still claims through the limited claim when another process declared
        # some for its queue (looked up before the first claim), in place of
        # its custom claim too: a custom claim knows nothing of limits, and
        # would start what they hold back. Set by _prepare, read by the fetcher.
        self.limits = limits
        self._limited = limits is not None
        self._own_claim = claim
        self._custom_claim = claim is not None
        # Whether the last claim of a limited queue came back short. Written
        # and read by the fetcher: while a limit binds, no jobs are
        # prefetched and each free runner claims at once; while it does not,
        # claims are batched as on any queue.
        self._held_back = False
        # When a worker without limits of its own looks again whether its
        # queue has some (set by _learn_limits; clock.monotonic() seconds).
        self._learn_at = 0.0
        self._prepared = False
        self.store_output = store_output
        # Prefixes the error of a run whose result cannot be stored.
        self._returned_by = returned_by(handler_name or callable_name(handler), f"queue {queue!r}")
        # Observers of fetches, outcomes and idleness (shoal.testing.Probe).
        self.hooks = hooks if hooks is not None else Hooks()

        # Claimed, not yet started, each with the clock's monotonic time at
        # which its claim was sent (its lease runs from no earlier). Written by
        # the fetcher, read by runners.
        self._buffer: deque[tuple[ClaimedJob, float]] = deque()
        # The most seconds of work the buffer may hold at the current rate: a
        # quarter of the shortest lease claimed lately, or ``max_hold`` (the
        # batch layer's: a quarter of the zombie timeout), whichever is less.
        # Fetcher only.
        self._max_hold_s = max_hold.total_seconds() if max_hold is not None else math.inf
        self._hold_s = self._max_hold_s
        self._has_jobs = asyncio.Event()  # set by the fetcher, awaited by idle runners
        self._room = asyncio.Event()  # set by runners as jobs finish, awaited by the fetcher
        self._running: dict[JobId, asyncio.Task[Any]] = {}
        # Jobs whose handler runs now. Written by runners, read by the cancel
        # listener and the reconnection check, which stop those cancelled.
        self._handling: dict[JobId, Job] = {}
        # Buffered jobs someone cancelled: dropped unrun when a runner takes
        # them. Written by the cancel listener, taken by runners.
        self._cancelled_in_buffer: set[JobId] = set()
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
        self._stop_requested = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._wake: asyncio.Event | None = None
        # Set by the fetcher while it waits on an empty queue; read when
        # reporting idleness.
        self._fetch_idle = False
        # Jobs claimed; runs finished; buffered jobs dropped unrun (their
        # lease was lost).
        self._claimed = self._finished = self._dropped = 0
        # Where the fetcher's next claim starts in the queue (fetcher only; a
        # limited claim always starts at the head). A custom claim that keeps
        # a position of its own passes its cursor (claim_cursor): it moves the
        # cursor itself, and the fetcher's idle wait reads when a claim from
        # the head is owed.
        self._cursor: ClaimCursor[Any] = claim_cursor or ClaimCursor(job_order)
        # Prefetch sizing (fetcher only): jobs/s finished, seconds per claim,
        # and seconds per handler run (0.0: not measured yet). The runners add
        # up the runs they finish in _ran and _ran_s; the fetcher folds them
        # into _run_s and starts the sums again.
        self._rate = 0.0
        self._claim_s = 0.0
        self._run_s = 0.0
        self._ran = 0
        self._ran_s = 0.0
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

    # -- lifecycle -------------------------------------------------------

    def start(self) -> None:
        # Set by a NOTIFY about this queue, or by this worker's own retries
        # that are due at once; with no notifier, only by the latter.
        self._wake = (
            self.notifier.subscribe(self.queue) if self.notifier is not None else asyncio.Event()
        )
        if self.notifier is not None:
            self.notifier.listen_cancels(self.queue, self)
        self._fetcher = asyncio.create_task(self._fetch_loop(), name=f"shoal-fetch:{self.queue}")
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
        # The fetcher is never cancelled mid-claim: a claim that committed but
        # whose rows were dropped would strand its jobs until their leases
        # expired. It notices _stopping between claims, or is woken from a wait.
        self._stop_requested.set()
        await self._fetcher
        # Jobs claimed but never started go straight back.
        while self._buffer:
            self.completer.record(self._buffer.popleft()[0], Interrupted())
        self._has_jobs.set()
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
        if self.notifier is not None and self._wake is not None:
            self.notifier.unsubscribe(self.queue, self._wake)
            self.notifier.unlisten_cancels(self.queue, self)
        if self._cancel_check is not None:
            self._cancel_check.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._cancel_check
        self._cancelled_in_buffer.clear()

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
            self._claimed,
            done.completed,
            done.failed,
            done.retried,
            done.released,
            done.lost + self._dropped,
            done.handed_back,
        )

    @property
    def idle(self) -> asyncio.Event:
        """Set when every outcome handed to the completer is written."""
        return self.completer.idle

    @property
    def in_flight(self) -> int:
        return len(self._buffer) + len(self._running)

    async def run_inline(self) -> int:
        """One round in the calling task, for tests: claim, run each handler, record.

        Claims up to ``batch_size`` available jobs, runs them one after the
        other through the same outcome logic as the runners, and writes their
        outcomes before returning how many it claimed (0: none available).
        Use it on a worker that was never started (``shoal.testing.drain``).
        """
        task = asyncio.current_task()
        assert task is not None
        if not self._prepared:
            await self._prepare()
        leased_at = self.clock.monotonic()
        claimed = await self.claim(self.queue, self.batch_size, now=self.clock.sql_now())
        self._claimed += len(claimed)
        if self.hooks:
            self.hooks.emit("fetched", self.queue, count=len(claimed))
        batch = []
        for claim in claimed:
            outcome = await self._run_one(claim, task, leased_at)
            if outcome is None:
                self._drop(claim)
            else:
                batch.append((claim, outcome))
        if batch:
            # Not retried here: a database error fails the caller (the test) at once.
            await self.completer.write(batch)
        return len(claimed)

    # -- fetcher ---------------------------------------------------------

    def _prefetch(self) -> int:
        """Jobs to hold beyond the running ones: about four claims' worth at the current rate.

        Slow jobs get no prefetch, so jobs are not hoarded away from other
        processes; no-op jobs get up to a full batch, so runners never wait
        for a claim round trip.

        The rate is the faster of the jobs finished per second and what the
        runners could finish (concurrency / seconds a run takes). The first
        is capped by the claims themselves: a worker that starts on a full
        queue finishes only what its small first claims gave it, so its
        claims grew a little each round trip (about ten of them, some 12 ms
        of a 10,000-job drain, before they reached a full batch of 500). The
        second is known as soon as the first jobs have run.
        """
        if self._held_back:
            # A claimed job holds a slot of a limit that binds: none are
            # hoarded away from runners in other processes.
            return 0
        if self._ran_s > 0:  # never on a clock that does not move (FakeClock)
            self._run_s = smooth(self._run_s, self._ran_s / self._ran)
            self._ran, self._ran_s = 0, 0.0
        rate = self._rate
        if self._run_s > 0:
            rate = max(rate, self.concurrency / self._run_s)
        target = min(self.batch_size, math.ceil(rate * self._claim_s * 4))
        if self._hold_s < math.inf:
            # No more than the runners start within the hold at this rate.
            target = min(target, int(rate * self._hold_s))
        return target

    async def _prepare(self) -> None:
        """Before the first claim: declare this worker's limits, or learn if the queue has any.

        And wait (a few seconds at most) for this process's registry row, so
        that the jobs it claims name their holder (shoal.queue.maintenance
        rescues them when the process dies; without a holder only their lease
        does).
        """
        known = self.store.holder_known
        if known is not None and not known.is_set():
            try:
                await asyncio.wait_for(known.wait(), REGISTRY_WAIT_S)
            except TimeoutError:
                log.warning(
                    "claiming before this process's registry row is written: jobs claimed "
                    "until it is are rescued by their lease only",
                    extra={"queue": self.queue},
                )
        if self.limits is not None:
            await self.limit_store.declare_limits(self.queue, self.limits, now=self.clock.sql_now())
        else:
            await self._learn_limits()
        self._prepared = True

    async def _learn_limits(self) -> None:
        """Claim through the limited claim while the queue has limits another process declared."""
        limited = await self.limit_store.is_limited(self.queue)
        self.claim = self.store.claim_limited if limited else (self._own_claim or self.store.claim)
        self._limited = limited
        self._custom_claim = self._own_claim is not None and not limited
        self._held_back = self._held_back and limited
        self._learn_at = self.clock.monotonic() + LIMITS_RECHECK.total_seconds()

    async def _wait_for(
        self,
        *events: asyncio.Event,
        seconds: float | None = None,
        real_seconds: float | None = None,
    ) -> None:
        """Wait for any of ``events``, ``seconds`` of the clock, or a stop request.

        Or ``real_seconds``, real time whatever the clock: a pause that paces
        the worker by what its work cost (see :func:`shoal.clock.work_seconds`).
        """
        waits: list[asyncio.Future[Any]] = [
            *(asyncio.ensure_future(event.wait()) for event in events),
            asyncio.ensure_future(self._stop_requested.wait()),
        ]
        if seconds is not None:
            waits.append(asyncio.ensure_future(self.clock.sleep(seconds)))
        if real_seconds is not None:
            waits.append(asyncio.ensure_future(asyncio.sleep(real_seconds)))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()

    async def _fetch_loop(self) -> None:
        errors = 0
        while not self._prepared and not self._stopping:
            try:
                await self._prepare()
            except TransientError as exc:
                delay = backoff_s(errors)
                errors += 1
                log.warning(
                    "declaring the limits of %s failed (%s); retrying in %.1fs",
                    self.queue,
                    exc,
                    delay,
                    extra={"queue": self.queue},
                )
                await self._wait_for(seconds=delay)
        errors = 0
        last_at, last_finished = self.clock.monotonic(), 0
        while not self._stopping:
            # Outcomes waiting beyond one full write mean the completer is
            # falling behind: they count as held, so claiming slows down
            # instead of piling up active jobs. The write in flight does not
            # count: it is usually big, and counting it would starve fast
            # queues.
            backlog = max(0, self.completer.unrecorded - MAX_RECORD_BATCH)
            held = len(self._buffer) + len(self._running) + backlog
            target = self.concurrency + self._prefetch()
            room = target - held
            # A runner about to go idle gets jobs at once. Otherwise the
            # fetcher waits until half the target is free: every claim has a
            # fixed cost (about 1 ms of server time, as much as 30 claimed
            # rows), so refilling each finished job as it goes would make
            # claims of a few dozen jobs back to back.
            starving = not self._buffer and len(self._running) < self.concurrency
            # While a limit binds, each free runner claims at once: claims are
            # small anyway, and a slot left idle is one the limit allows.
            if room < 1 or (room < target // 2 and not starving and not self._held_back):
                self._room.clear()
                await self._wait_for(self._room)
                continue
            # Cleared before the claim, never after: a NOTIFY that arrives
            # while the claim runs must still wake the idle wait below, since
            # its job may have committed after the claim's snapshot (cleared
            # after the claim, it would wait for the next poll, and forever
            # on a clock that never moves).
            if self._wake is not None:
                self._wake.clear()
            if self._limited:
                # Likewise a slot freed (a job of this worker finished, or its
                # completion was written) while the claim runs: the claim may
                # not have seen it, and the idle wait must not miss it.
                self._room.clear()
            started = self.clock.monotonic()
            work_started = work_seconds()
            try:
                if self.limits is None and started >= self._learn_at:
                    await self._learn_limits()
                limit = min(room, self.batch_size)
                if self._custom_claim or self._limited:
                    claimed = await self.claim(self.queue, limit, now=self.clock.sql_now())
                else:
                    after = self._cursor.start(work_started)
                    claim = await self.store.claim_with_cost(
                        self.queue, limit, now=self.clock.sql_now(), after=after
                    )
                    claimed = claim.jobs
                    self._cursor.advance(
                        after, claimed, limit=limit, ended=work_seconds(), cost_s=claim.cost_s
                    )
                errors = 0
            except TransientError as exc:
                delay = backoff_s(errors)
                errors += 1
                log.warning(
                    "claim from %s failed (%s); retrying in %.1fs",
                    self.queue,
                    exc,
                    delay,
                    extra={"queue": self.queue},
                )
                await self._wait_for(seconds=delay)
                continue
            self._claim_s = smooth(self._claim_s, work_seconds() - work_started)
            now = self.clock.monotonic()
            if now > last_at:
                rate = (self._finished - last_finished) / (now - last_at)
                self._rate = 0.7 * self._rate + 0.3 * rate
                last_at, last_finished = now, self._finished
            if self.hooks:
                self.hooks.emit("fetched", self.queue, count=len(claimed))
            if self._limited:
                # Short: the limits held jobs back (or none were waiting).
                self._held_back = len(claimed) < min(room, self.batch_size)
            if claimed:
                self._claimed += len(claimed)
                self._buffer.extend(zip(claimed, itertools.repeat(started)))
                leases = [c.expire_in_s for c in claimed if c.lease_expires_at is not None]
                if leases:
                    self._hold_s = min(self._max_hold_s, min(leases) / 4)
                self._has_jobs.set()
            if len(claimed) < min(room, self.batch_size):
                self._fetch_idle = True
                self._report_idle()
                try:
                    await self._idle_wait(started)
                finally:
                    self._fetch_idle = False

    def _report_idle(self) -> None:
        """Report ``worker_idle`` when the queue looked empty and nothing is left to do."""
        if (
            self.hooks
            and self._fetch_idle
            and not self._buffer
            and not self._running
            and not self.completer.unrecorded
        ):
            self.hooks.emit("worker_idle", self.queue)

    async def _idle_wait(self, claim_began: float) -> None:
        """Wait for a NOTIFY about this queue (since the last claim began), or the poll interval.

        The interval counts from when the empty claim began, not from now: a
        clock that moved while the claim ran (a test's ``advance``, a long
        stall) may already have passed it, and then the next claim is due.
        """
        now = self.clock.monotonic()
        elapsed = now - claim_began
        interval = self.poll_interval.total_seconds()
        # A job may wait behind the claim's position (shoal.queue.cursor): a
        # claim from the head is owed once its cost allows, in real time.
        head_due_in = self._cursor.head_due_in(work_seconds())
        events = [self._wake or asyncio.Event()]
        if self._limited:
            interval = min(interval, LIMITED_POLL_INTERVAL.total_seconds())
            # One of this worker's own jobs finishing frees a slot (cleared
            # before the claim, not here: see the fetch loop).
            events.append(self._room)
        await self._wait_for(
            *events, seconds=max(0.0, interval - elapsed), real_seconds=head_due_in
        )

    # -- runners ---------------------------------------------------------

    async def _run_loop(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        while True:
            while not self._buffer:
                if self._stopping:
                    return
                self._has_jobs.clear()
                await self._has_jobs.wait()
            claim, leased_at = self._buffer.popleft()
            self._running[claim.id] = task
            try:
                outcome = await self._run_one(claim, task, leased_at)
            except asyncio.CancelledError:
                # Shutdown cut the handler off: hand the job back, no attempt spent.
                self._finish(claim, Interrupted())
                raise
            if outcome is None:
                self._drop(claim)
            else:
                self._finish(claim, outcome)

    async def _run_one(
        self, claim: ClaimedJob, task: asyncio.Task[Any], leased_at: float
    ) -> Outcome | None:
        """Run the handler on a claimed job; None when the job is no longer ours to run."""
        if claim.id in self._cancelled_in_buffer:
            self._cancelled_in_buffer.discard(claim.id)
            return Stopped(started=False)
        started = self.clock.monotonic()
        if claim.lease_expires_at is None:
            # Taken without a lease: the execution deadline runs from the start.
            leased_at = started
        elif started - leased_at >= claim.expire_in_s / 2:
            # Half the lease spent in the buffer: confirm it is still ours.
            leased_at = await self._extend_before_start(claim)
            if leased_at < 0:
                return None
            started = self.clock.monotonic()
        job = Job(claim, self._heartbeat)
        # The lease, and so the execution deadline, runs from the claim (or
        # the extension just made).
        self._deadline_at[claim.id] = leased_at + claim.expire_in_s
        outcome: Outcome
        stored = None
        self._handling[claim.id] = job
        try:
            output = await self.handler(job)
            if self.store_output and output is not None:
                # Here, not in the completer: a value that cannot be stored
                # fails this run alone, at once, instead of the statement
                # recording a whole batch of outcomes.
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
            outcome = Completed(output, stored)
        finally:
            self._handling.pop(claim.id, None)
            self._deadline_at.pop(claim.id, None)
            self._expired.discard(claim.id)
            if job.reported_cost is not None:
                self.completer.costs[claim.id] = job.reported_cost
        if job.cancelled and not isinstance(outcome, Stopped):
            # Cancelled as it ended (or its handler caught the cancellation):
            # the job is cancelled whatever the handler made of it.
            take_cancel(task)
            outcome = Stopped(started=True)
        run_s = self.clock.monotonic() - started
        self._ran += 1
        self._ran_s += run_s
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

    async def _extend_before_start(self, claim: ClaimedJob) -> float:
        """Extend a buffered job's lease before its run; when the new lease began, -1.0 if lost.

        One fenced extension answers whether the job is still this worker's
        (a lease that ran out may have been expired, and the job claimed
        again elsewhere). Transient failures are retried: a handler is never
        started on a lease it could not confirm.
        """
        errors = 0
        while True:
            sent = self.clock.monotonic()
            try:
                leases = await self.store.extend_leases(
                    [(claim.id, claim.attempt)], now=self.clock.sql_now()
                )
            except TransientError as exc:
                delay = backoff_s(errors)
                errors += 1
                log.warning(
                    "job %s: extending its lease before running it failed (%s); retrying in %.1fs",
                    claim.id,
                    exc,
                    delay,
                    extra={"queue": self.queue, "job_id": claim.id},
                )
                await self.clock.sleep(delay)
                continue
            return sent if claim.id in leases else -1.0

    def _drop(self, claim: ClaimedJob) -> None:
        """Forget a buffered job whose lease was lost before it ran: it is not ours to record."""
        self._running.pop(claim.id, None)
        self._dropped += 1
        self._room.set()
        log.warning(
            "job %s (attempt %d): its lease ran out while it waited in this worker's buffer; "
            "not run here",
            claim.id,
            claim.attempt,
            extra={"queue": self.queue, "job_id": claim.id},
        )
        if self.hooks:
            self.hooks.emit("job_finished", self.queue, job_id=claim.id, outcome="lost")
        self._report_idle()

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
        if any(c.id == note.id and c.attempt == note.attempt for c, _ in self._buffer):
            self._cancelled_in_buffer.add(JobId(note.id))

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

    def _finish(self, claim: ClaimedJob, outcome: Outcome) -> None:
        self._running.pop(claim.id, None)
        self._finished += 1
        self._room.set()
        self.completer.record(claim, outcome)

    def _written(self) -> None:
        """After each write of the completer: room for more, and maybe nothing left to do."""
        self._room.set()
        self._report_idle()

    def _retry_due(self) -> None:
        """A job failed into a retry due now: claim again without waiting for a poll."""
        if self._wake is not None:
            self._wake.set()
