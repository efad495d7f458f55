"""The fetcher of a queue worker: claims jobs into a small buffer the runners take from.

It claims in batches (``FOR UPDATE SKIP LOCKED``, one round trip for up to
``batch_size`` jobs) whenever the buffer has room for half a batch; when the
queue is empty it waits for a NOTIFY or the poll interval. How much it holds
beyond the running jobs follows the measured job rate (:meth:`Fetcher._prefetch`),
and never more than the runners can start within a quarter of the shortest
lease claimed lately: a job's lease runs from its claim, not from the start of
its handler.

So a runner never starts a handler on trust: :meth:`Fetcher.confirm_lease`
first extends, by one fenced statement, the lease of a job that waited half
of it in the buffer (:meth:`Fetcher.lease_start` tells which), and a job
that is no longer this worker's (the lease ran out, maintenance gave it to
another worker) is dropped unrun (:meth:`Fetcher.lost`). A buffered job
someone cancelled is taken out the same way, without running.

The fetcher owns the buffer, the two events that pace it (``has_jobs`` for the
runners, ``room`` for itself) and the counts the rate is measured from; the
runners (:class:`shoal.queue.worker.Worker`) tell it what they took and
finished. River's producer plays the same part.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from shoal.clock import Clock, work_seconds
from shoal.errors import TransientError
from shoal.hooks import Hooks
from shoal.queue.completer import MAX_RECORD_BATCH, Completer, backoff_s
from shoal.queue.cursor import ClaimCursor, job_order
from shoal.queue.limit_store import LimitStore
from shoal.queue.limits import Limits
from shoal.queue.notifier import CancelNote
from shoal.queue.rows import ClaimedJob
from shoal.queue.states import JobId
from shoal.queue.store import JobStore

log = logging.getLogger("shoal.worker")

# Most jobs claimed in one round trip. Reached only by fast jobs: the prefetch
# follows the measured job rate, so slow jobs are claimed about as runners
# free up (measured here: 100 drained no-op jobs at ~12k/s, 500 at ~20k/s).
DEFAULT_MAX_BATCH = 500
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


def smooth(average: float, sample: float) -> float:
    """An exponential moving average that starts at its first sample, not at 0.0."""
    return sample if average == 0.0 else 0.7 * average + 0.3 * sample


class Claim(Protocol):
    """Called by the fetcher in place of :meth:`JobStore.claim`.

    Lets a layer above claim jobs and do its per-job set-up for all of them in
    the same statement (the batch layer: the phantom guard of their items).
    """

    def __call__(
        self, queue: str, limit: int, *, now: datetime | None
    ) -> Awaitable[Sequence[ClaimedJob]]: ...


class Fetcher:
    """Claims a worker's jobs into its buffer, and hands them to its runners."""

    def __init__(
        self,
        store: JobStore,
        limit_store: LimitStore,
        queue: str,
        *,
        concurrency: int,
        batch_size: int,
        poll_interval: timedelta,
        clock: Clock,
        completer: Completer,
        hooks: Hooks,
        idle: Callable[[], None],
        claim: Claim | None = None,
        claim_cursor: ClaimCursor[Any] | None = None,
        limits: Limits | None = None,
        max_hold: timedelta | None = None,
    ) -> None:
        self.store = store
        # Declares this worker's limits, or learns whether its queue has some.
        self.limit_store = limit_store
        self.queue = queue
        self.concurrency = concurrency
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.clock = clock
        # Read for its backlog of unwritten outcomes, which slows claiming.
        self.completer = completer
        self.hooks = hooks
        # Called when the queue looked empty, and when a buffered job was
        # dropped: the worker reports ``worker_idle`` if nothing is left to do.
        self._idle = idle
        self.claim = claim or (store.claim_limited if limits else store.claim)
        # Declared before the first claim. A worker without limits of its own
        # still claims through the limited claim when another process declared
        # some for its queue (looked up before the first claim), in place of
        # its custom claim too: a custom claim knows nothing of limits, and
        # would start what they hold back. Set by prepare.
        self.limits = limits
        self._limited = limits is not None
        self._own_claim = claim
        self._custom_claim = claim is not None
        # Whether the last claim of a limited queue came back short. While a
        # limit binds, no jobs are prefetched and each free runner claims at
        # once; while it does not, claims are batched as on any queue.
        self._held_back = False
        # When a worker without limits of its own looks again whether its
        # queue has some (set by _learn_limits; clock.monotonic() seconds).
        self._learn_at = 0.0
        self.prepared = False
        # Set by a NOTIFY about this queue, or by the worker's own retries
        # that are due at once (the worker sets it when it starts).
        self.wake: asyncio.Event | None = None

        # Claimed, not yet started, each with the clock's monotonic time at
        # which its claim was sent (its lease runs from no earlier).
        self._buffer: deque[tuple[ClaimedJob, float]] = deque()
        # The most seconds of work the buffer may hold at the current rate: a
        # quarter of the shortest lease claimed lately, or ``max_hold`` (the
        # batch layer's: a quarter of the zombie timeout), whichever is less.
        self._max_hold_s = max_hold.total_seconds() if max_hold is not None else math.inf
        self._hold_s = self._max_hold_s
        self.has_jobs = asyncio.Event()  # set here, awaited by idle runners
        self.room = asyncio.Event()  # set as jobs finish or are written, awaited here
        # Buffered jobs someone cancelled: dropped unrun when a runner takes them.
        self._cancelled_in_buffer: set[JobId] = set()
        self._stopping = False
        self._stop_requested = asyncio.Event()
        # Set while the fetcher waits on an empty queue; read when reporting idleness.
        self.waiting = False
        # Jobs taken by runners and not finished yet.
        self.active = 0
        # Jobs claimed; runs finished; buffered jobs dropped unrun (their
        # lease was lost).
        self.claimed = self.finished = self.dropped = 0
        # Where the next claim starts in the queue (a limited claim always
        # starts at the head). A custom claim that keeps a position of its own
        # passes its cursor (claim_cursor): it moves the cursor itself, and
        # the idle wait reads when a claim from the head is owed.
        self._cursor: ClaimCursor[Any] = claim_cursor or ClaimCursor(job_order)
        # Prefetch sizing: jobs/s finished, seconds per claim, and seconds per
        # handler run (0.0: not measured yet). Runners add up the runs they
        # finish in _ran and _ran_s (ran()); _prefetch folds them into _run_s.
        self._rate = 0.0
        self._claim_s = 0.0
        self._run_s = 0.0
        self._ran = 0
        self._ran_s = 0.0

    # -- what runners and the worker see -----------------------------------

    @property
    def held(self) -> int:
        """Jobs claimed and not finished: buffered or running."""
        return len(self._buffer) + self.active

    @property
    def empty(self) -> bool:
        """Nothing buffered and nothing running."""
        return not self._buffer and not self.active

    def take(self) -> tuple[ClaimedJob, float] | None:
        """The next buffered job and when its claim was sent; None when the buffer is empty."""
        if not self._buffer:
            return None
        self.active += 1
        return self._buffer.popleft()

    async def wait_for_jobs(self) -> bool:
        """Wait until a job is buffered; False once stopping with none left."""
        while not self._buffer:
            if self._stopping:
                return False
            self.has_jobs.clear()
            await self.has_jobs.wait()
        return True

    def take_cancelled(self, claim: ClaimedJob) -> bool:
        """Whether ``claim`` was cancelled while it waited in the buffer (asked once)."""
        if claim.id in self._cancelled_in_buffer:
            self._cancelled_in_buffer.discard(claim.id)
            return True
        return False

    def cancelled(self, note: CancelNote) -> None:
        """Mark a buffered job someone cancelled: it is taken out unrun (a pass over the buffer)."""
        if any(c.id == note.id and c.attempt == note.attempt for c, _ in self._buffer):
            self._cancelled_in_buffer.add(JobId(note.id))

    def lease_start(self, claim: ClaimedJob, leased_at: float, now: float) -> float | None:
        """When the lease a run of ``claim`` starting ``now`` counts from began; None: confirm it.

        A job taken without a lease counts from now. One whose lease is half
        spent (by the clock, from when its claim was sent) must be extended
        by :meth:`confirm_lease` before it runs, and counts from the extension.
        (Two calls, so that the common case costs no await; ``now`` is the
        clock's monotonic time, which the runner reads once for both.)
        """
        if claim.lease_expires_at is None:
            return now
        if now - leased_at < claim.expire_in_s / 2:
            return leased_at
        return None

    async def confirm_lease(self, claim: ClaimedJob) -> float | None:
        """Extend a lease half spent in the buffer; when the new lease began, None if lost."""
        extended = await self._extend_before_start(claim)
        return None if extended < 0 else extended

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

    def ran(self, run_s: float) -> None:
        """A handler ran for ``run_s`` seconds (sizes the prefetch)."""
        self._ran += 1
        self._ran_s += run_s

    def done(self) -> None:
        """A taken job's run ended and its outcome went to the completer: room for another."""
        self.active -= 1
        self.finished += 1
        self.room.set()

    def lost(self, claim: ClaimedJob) -> None:
        """Forget a taken job whose lease was lost before it ran: it is not ours to record."""
        self.active -= 1
        self.dropped += 1
        self.room.set()
        log.warning(
            "job %s (attempt %d): its lease ran out while it waited in this worker's buffer; "
            "not run here",
            claim.id,
            claim.attempt,
            extra={"queue": self.queue, "job_id": claim.id},
        )
        if self.hooks:
            self.hooks.emit("job_finished", self.queue, job_id=claim.id, outcome="lost")
        self._idle()

    # -- stopping ------------------------------------------------------------

    def stop(self) -> None:
        """Claim no more: the loop ends between claims, or is woken from a wait."""
        self._stopping = True
        self._stop_requested.set()

    def hand_back(self) -> list[ClaimedJob]:
        """Empty the buffer (after the loop ended): the jobs claimed and never started."""
        jobs = [claim for claim, _ in self._buffer]
        self._buffer.clear()
        self._cancelled_in_buffer.clear()
        self.has_jobs.set()
        return jobs

    # -- claiming --------------------------------------------------------------

    async def claim_once(self, limit: int) -> list[ClaimedJob]:
        """One claim from the head of the queue into the buffer (a worker never started)."""
        if not self.prepared:
            await self.prepare()
        started = self.clock.monotonic()
        claimed = list(await self.claim(self.queue, limit, now=self.clock.sql_now()))
        self._deliver(claimed, started)
        return claimed

    def _deliver(self, claimed: Sequence[ClaimedJob], started: float) -> None:
        """Buffer what a claim sent at ``started`` returned: the one way claims reach runners."""
        if self.hooks:
            self.hooks.emit("fetched", self.queue, count=len(claimed))
        if claimed:
            self.claimed += len(claimed)
            self._buffer.extend(zip(claimed, itertools.repeat(started)))
            leases = [c.expire_in_s for c in claimed if c.lease_expires_at is not None]
            if leases:
                self._hold_s = min(self._max_hold_s, min(leases) / 4)
            self.has_jobs.set()

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

    async def prepare(self) -> None:
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
        self.prepared = True

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

    async def run(self) -> None:
        """Claim into the buffer until :meth:`stop`; never cancelled mid-claim.

        A claim that committed but whose rows were dropped would strand its
        jobs until their leases expired.
        """
        errors = 0
        while not self.prepared and not self._stopping:
            try:
                await self.prepare()
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
            held = self.held + backlog
            target = self.concurrency + self._prefetch()
            room = target - held
            # A runner about to go idle gets jobs at once. Otherwise the
            # fetcher waits until half the target is free: every claim has a
            # fixed cost (about 1 ms of server time, as much as 30 claimed
            # rows), so refilling each finished job as it goes would make
            # claims of a few dozen jobs back to back.
            starving = not self._buffer and self.active < self.concurrency
            # While a limit binds, each free runner claims at once: claims are
            # small anyway, and a slot left idle is one the limit allows.
            if room < 1 or (room < target // 2 and not starving and not self._held_back):
                self.room.clear()
                await self._wait_for(self.room)
                continue
            # Cleared before the claim, never after: a NOTIFY that arrives
            # while the claim runs must still wake the idle wait below, since
            # its job may have committed after the claim's snapshot (cleared
            # after the claim, it would wait for the next poll, and forever
            # on a clock that never moves).
            if self.wake is not None:
                self.wake.clear()
            if self._limited:
                # Likewise a slot freed (a job of this worker finished, or its
                # completion was written) while the claim runs: the claim may
                # not have seen it, and the idle wait must not miss it.
                self.room.clear()
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
                rate = (self.finished - last_finished) / (now - last_at)
                self._rate = 0.7 * self._rate + 0.3 * rate
                last_at, last_finished = now, self.finished
            if self._limited:
                # Short: the limits held jobs back (or none were waiting).
                self._held_back = len(claimed) < min(room, self.batch_size)
            self._deliver(claimed, started)
            if len(claimed) < min(room, self.batch_size):
                self.waiting = True
                self._idle()
                try:
                    await self._idle_wait(started)
                finally:
                    self.waiting = False

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
        events = [self.wake or asyncio.Event()]
        if self._limited:
            interval = min(interval, LIMITED_POLL_INTERVAL.total_seconds())
            # One of this worker's own jobs finishing frees a slot (cleared
            # before the claim, not here: see the fetch loop).
            events.append(self.room)
        await self._wait_for(
            *events, seconds=max(0.0, interval - elapsed), real_seconds=head_due_in
        )
