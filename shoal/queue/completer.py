"""The completer of a queue worker: writes the outcomes of finished runs in batches.

Runners hand each outcome to :meth:`Completer.record`; one task
(:meth:`Completer.run`) writes all that finished while its last write was in
flight in the next one, at most ``MAX_RECORD_BATCH`` at a time: one fenced
statement per kind of outcome (completed, failed or retried, released,
stopped, cancelled), each naming the attempt its runner was handed, so a
runner that lost its lease never overwrites the outcome of the job's next
attempt. Writes are retried on transient errors and finished at shutdown; an
outcome lost to a crash only means the job runs again when its lease expires
(at-least-once). River's ``jobcompleter`` plays the same part.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from shoal.clock import Clock
from shoal.db.leadership import this_process
from shoal.db.pool import AsyncConn
from shoal.errors import TransientError
from shoal.hooks import Hooks
from shoal.queue.job import (
    Completed,
    Failed,
    Interrupted,
    Outcome,
    Snoozed,
    Stopped,
    error_entry,
    event_entry,
)
from shoal.queue.retry import Jitter, after_failure
from shoal.queue.rows import ClaimedJob, Failure
from shoal.queue.states import JobId, JobState
from shoal.queue.store import JobStore

log = logging.getLogger("shoal.worker")

# Most outcomes recorded in one statement: bounds every write's cost and
# keeps it well inside the database deadline, however far behind it falls.
MAX_RECORD_BATCH = 500
# Backoff after a failed write.
ERROR_BACKOFF_S = (0.1, 0.5, 1.0, 2.0, 5.0)
STOPPED_NOTE = "handler stopped: the job was cancelled while it ran"
DROPPED_NOTE = "not started: the job was cancelled while it waited in a worker's buffer"

# Called by the completer with each batch of completed jobs, on its
# connection, in place of its own completion: a layer above writes its own
# rows for them (the batch layer: item results) and completes the jobs, fenced
# by attempt (JobStore.send_complete, or a statement of its own that calls
# complete_jobs(), so both commit at once). Returns the jobs it completed,
# each with the outcome it reports (``job_finished``; shoal.metrics counts it:
# an item job completes whatever its item's outcome, and reports that, so an
# item in error counts as a failed job); the others had lost their fence. A
# batch whose recording fails is retried, so its writes must be idempotent
# (fenced); a crash between its writes and the job writes only means the jobs
# run again, to find their work done.
Finalize = Callable[
    [AsyncConn, Sequence[tuple[ClaimedJob, "Outcome"]]], Awaitable[Mapping[JobId, str]]
]


def backoff_s(errors: int) -> float:
    """Seconds to wait after ``errors`` failed database calls in a row (0: the first)."""
    return ERROR_BACKOFF_S[min(errors, len(ERROR_BACKOFF_S) - 1)]


def handed_back_note(claim: ClaimedJob, at: str) -> dict[str, Any]:
    """The history note of a job handed back at shutdown: which process, and when its run began.

    Appended to the job's ``errors`` as type ``Interrupted``, which costs no
    attempt (the attempt counter is put back with the release).
    """
    return {
        "attempt": claim.attempt,
        "at": at,
        "type": "Interrupted",
        "message": (
            f"handed back at shutdown by worker process {this_process()} without spending "
            f"an attempt; its run had started at {claim.started_at.isoformat()}"
        ),
        "traceback": None,
    }


def _nothing() -> None:
    pass


class Completer:
    """Writes a worker's outcomes; counts what each write did."""

    def __init__(
        self,
        store: JobStore,
        queue: str,
        *,
        clock: Clock,
        jitter: Jitter,
        hooks: Hooks,
        finalize: Finalize | None = None,
        retry_due: Callable[[], None] = _nothing,
        written: Callable[[], None] = _nothing,
    ) -> None:
        self.store = store
        self.queue = queue
        self.clock = clock
        self.jitter = jitter
        self.hooks = hooks
        self.finalize = finalize
        # Called when a job failed into a retry that is due at once (its
        # worker claims again without waiting for a poll), and after each
        # write, successful or not (its worker has room again).
        self.retry_due = retry_due
        self.written = written
        # Costs handlers reported (Job.report_cost), by job: written by
        # runners, taken with the job's outcome.
        self.costs: dict[JobId, int] = {}
        self.completed = self.failed = self.retried = 0
        self.released = self.handed_back = 0
        self.lost = 0  # outcomes whose fence failed: the job was no longer ours
        # Set when everything handed over is written.
        self.idle = asyncio.Event()
        self._outcomes: list[tuple[ClaimedJob, Outcome]] = []
        self._ready = asyncio.Event()
        self._recording = 0  # outcomes in the current write
        self._exit = False

    @property
    def unrecorded(self) -> int:
        """Outcomes handed over and not written yet (the write in flight included)."""
        return len(self._outcomes) + self._recording

    def record(self, claim: ClaimedJob, outcome: Outcome) -> None:
        """Hand an outcome over; it is written with the next batch."""
        self._outcomes.append((claim, outcome))
        self.idle.clear()
        self._ready.set()

    def exit(self) -> None:
        """Let :meth:`run` return once everything handed over is written."""
        self._exit = True
        self._ready.set()

    async def run(self) -> None:
        """Write outcomes as they come, until :meth:`exit` and nothing is left."""
        errors = 0
        while True:
            if not self._outcomes:
                self.idle.set()
                if self._exit:
                    return
                self._ready.clear()
                await self._ready.wait()
                continue
            batch = self._outcomes[:MAX_RECORD_BATCH]
            del self._outcomes[:MAX_RECORD_BATCH]
            self._recording = len(batch)
            try:
                # Shielded: a cancelled caller must not lose the acknowledgement.
                await asyncio.shield(self.write(batch))
                errors = 0
            except TransientError as exc:
                self._outcomes[:0] = batch  # keep order; try again
                delay = backoff_s(errors)
                errors += 1
                log.warning(
                    "recording %d outcomes failed (%s); retrying",
                    len(batch),
                    exc,
                    extra={"queue": self.queue},
                )
                await self.clock.sleep(delay)
            except Exception:  # loop boundary: log every job id, keep the loop alive
                log.exception(
                    "recording outcomes of jobs %s failed; their leases will expire",
                    [c.id for c, _ in batch],
                    extra={"queue": self.queue},
                )
            finally:
                self._recording = 0
                self.written()

    async def write(self, batch: list[tuple[ClaimedJob, Outcome]]) -> None:
        """Record a batch of outcomes: one fenced statement per kind of outcome.

        Each statement commits on its own; the outcomes it recorded leave
        ``batch`` at once, so when a later statement fails (say the connection
        drops after an earlier one was answered) only the rest is retried, and
        nothing is written or counted twice.
        """
        now_sql = self.clock.sql_now()
        at = self.clock.now().isoformat()
        completed: list[tuple[ClaimedJob, Outcome]] = []
        failures: dict[JobId, Failure] = {}
        released: list[tuple[ClaimedJob, timedelta]] = []
        snoozed: set[JobId] = set()
        pauses: list[tuple[JobId, timedelta]] = []
        costs = [(c.id, self.costs[c.id]) for c, _ in batch if c.id in self.costs]
        cancels: list[tuple[ClaimedJob, BaseException]] = []
        stopped: list[tuple[JobId, int, dict[str, Any]]] = []
        for claim, outcome in batch:
            if isinstance(outcome, Completed):
                completed.append((claim, outcome))
            elif isinstance(outcome, Failed):
                step = after_failure(
                    claim.attempt,
                    claim.policy,
                    self.clock.now(),
                    self.jitter,
                    permanent=outcome.permanent,
                )
                retry_in = None
                if step.start_after is not None:
                    retry_in = step.start_after - self.clock.now()
                failures[claim.id] = Failure(
                    claim.id,
                    claim.attempt,
                    step.state,
                    retry_in,
                    error_entry(claim.attempt, outcome.error, at),
                )
            elif isinstance(outcome, Snoozed | Interrupted):
                if isinstance(outcome, Snoozed):
                    snoozed.add(claim.id)
                    released.append((claim, outcome.delay))
                    if outcome.pause_partition:
                        pauses.append((claim.id, outcome.delay))
                else:
                    released.append((claim, timedelta(0)))
            elif isinstance(outcome, Stopped):
                note = STOPPED_NOTE if outcome.started else DROPPED_NOTE
                stopped.append(
                    (claim.id, claim.attempt, event_entry(claim.attempt, "Stopped", note, at))
                )
            else:
                cancels.append((claim, outcome.error))

        def recorded(claims: set[JobId], outcomes: Mapping[JobId, str] | None = None) -> None:
            batch[:] = [(c, o) for c, o in batch if c.id not in claims]
            if self.hooks:
                for job_id in claims:
                    outcome = outcomes.get(job_id, "lost") if outcomes is not None else "cancelled"
                    self.hooks.emit("job_finished", self.queue, job_id=job_id, outcome=outcome)

        async def record(conn: AsyncConn) -> None:
            if costs:
                # First, and forgotten once written: a batch written again
                # after a later statement failed does not charge them twice
                # (only a lost answer to this statement itself can).
                await self.store.send_report_costs(conn, costs, now=now_sql)
                for job_id, _ in costs:
                    self.costs.pop(job_id, None)
            if completed:
                if self.finalize is not None:
                    reported = await self.finalize(conn, completed)
                    self.completed += len(reported)
                    self.lost += len(completed) - len(reported)
                    recorded({c.id for c, _ in completed}, reported)
                else:
                    done = [
                        (c.id, c.attempt, o.stored)
                        for c, o in completed
                        if isinstance(o, Completed)
                    ]
                    won = await (await self.store.send_complete(conn, done, now=now_sql)).result()
                    self.completed += len(won)
                    self.lost += len(completed) - len(won)
                    recorded({c.id for c, _ in completed}, dict.fromkeys(won, "completed"))
            if failures:
                states = await (
                    await self.store.send_fail(conn, list(failures.values()), now=now_sql)
                ).result()
                for job_id, state in states.items():
                    if state is JobState.FAILED:
                        self.failed += 1
                        log.warning(
                            "job %s (%s) failed for good: %s",
                            job_id,
                            self.queue,
                            failures[job_id].error["message"],
                            extra={"queue": self.queue, "job_id": job_id},
                        )
                    else:
                        self.retried += 1
                        if not failures[job_id].retry_in:
                            # Due now: claim it again without waiting for the
                            # poll (a retry sends no NOTIFY).
                            self.retry_due()
                self.lost += len(failures) - len(states)
                recorded(
                    set(failures),
                    {
                        job_id: "failed" if state is JobState.FAILED else "retried"
                        for job_id, state in states.items()
                    },
                )
            if pauses:
                # Before the release: a crash between the two leaves the job
                # to its lease, never the partition unpaused with the job
                # back in line. Written again if the batch is retried, which
                # only sets the same pause.
                await self.store.send_pause_partitions(conn, pauses, now=now_sql)
            if released:
                back = await (
                    await self.store.send_release(
                        conn,
                        [
                            (
                                c.id,
                                c.attempt,
                                d,
                                None if c.id in snoozed else handed_back_note(c, at),
                            )
                            for c, d in released
                        ],
                        now=now_sql,
                    )
                ).result()
                self.released += len(back)
                self.handed_back += len(back - snoozed)
                self.lost += len(released) - len(back)
                recorded(
                    {c.id for c, _ in released},
                    {i: "snoozed" if i in snoozed else "released" for i in back},
                )
            if stopped:
                # The job is cancelled already (by whoever cancelled it); its
                # history says what became of this run.
                noted = await self.store.note_stopped_runs(conn, stopped, now=now_sql)
                recorded({s[0] for s in stopped}, dict.fromkeys(noted, "cancelled"))
            for claim, error in cancels:
                await self.store.cancel_active(
                    claim.id,
                    claim.attempt,
                    error_entry(claim.attempt, error, at),
                    now=now_sql,
                    conn=conn,
                )
                recorded({claim.id})

        await self.store.db.run(record, transaction=False)
