"""What a handler receives, and what one run of it can end in."""

from __future__ import annotations

import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from shoal.errors import Cancel, InvalidInput, JobCancelled, PermanentError, RetryAfter, Snooze
from shoal.queue.rows import ClaimedJob
from shoal.queue.states import JobId
from shoal.tracing import TRACE_KEY


class Job:
    """One claimed job, as a handler sees it.

    ``attempt`` is 1 on the first run. Long handlers call ``await
    job.heartbeat()`` to extend their lease (and their local execution
    deadline) by another ``expire_in``; it returns False when the job is no
    longer theirs (cancelled, or expired and handed to another worker), in
    which case the handler should stop.

    When someone cancels the job while its handler runs, ``cancelled``
    becomes True and the worker stops an async handler (cancelling its task).
    A plain ``def`` handler runs in a thread, which cannot be interrupted: it
    checks ``job.cancelled``, or calls ``job.raise_if_cancelled()`` between
    steps::

        def handler(job):
            for page in pages(job.data):
                job.raise_if_cancelled()
                convert(page)
    """

    __slots__ = ("_cancelled", "_claim", "_data", "_heartbeat", "_trace", "reported_cost")

    def __init__(
        self, claim: ClaimedJob, heartbeat: Callable[[Job], Awaitable[bool]] | None = None
    ) -> None:
        self._claim = claim
        self._heartbeat = heartbeat
        self._data: Any = _UNREAD
        self._trace: dict[str, str] | None = None
        # Set by the handler (report_cost), read by the worker after the run.
        self.reported_cost: int | None = None
        # Set by the worker (a cancel notification, or a heartbeat that found
        # the job cancelled), read by the handler, maybe from its own thread:
        # a bool written once, False to True.
        self._cancelled = False

    @property
    def id(self) -> JobId:
        return self._claim.id

    @property
    def queue(self) -> str:
        return self._claim.queue

    @property
    def data(self) -> Any:
        """The payload, parsed from JSON on first read.

        A trace context the sender's tracing put in (``shoal.tracing``) is
        taken out: handlers see the payload they were sent.
        """
        if self._data is _UNREAD:
            data = self._claim.data
            if type(data) is dict and TRACE_KEY in data:
                trace = data.pop(TRACE_KEY)
                self._trace = trace if isinstance(trace, dict) else None
            self._data = data
        return self._data

    @property
    def trace_headers(self) -> dict[str, str] | None:
        """The sender's trace context (propagation headers), once ``data`` was read."""
        return self._trace

    @property
    def attempt(self) -> int:
        return self._claim.attempt

    @property
    def retry_limit(self) -> int:
        return self._claim.policy.retry_limit

    @property
    def is_last_attempt(self) -> bool:
        return self._claim.attempt > self._claim.policy.retry_limit

    @property
    def expire_in(self) -> timedelta:
        return self._claim.expire_in

    @property
    def started_at(self) -> datetime:
        return self._claim.started_at

    @property
    def claim(self) -> ClaimedJob:
        return self._claim

    def report_cost(self, cost: int) -> None:
        """Say what this run really cost against its queue's rate (docs/limits.md).

        The job's start took its ``cost`` (sent with it, 1 by default) from
        its partition's token bucket; when the run ends, the worker takes the
        difference too (or gives it back, for a run that cost less), so a
        tokens-per-minute budget holds to what was spent. On a queue without
        a rate it changes nothing.
        """
        if isinstance(cost, bool) or not isinstance(cost, int) or cost < 0:
            raise InvalidInput("cost", f"must be an integer >= 0, got {cost!r}")
        self.reported_cost = cost

    @property
    def cancelled(self) -> bool:
        """True once someone cancelled this job while its handler ran."""
        return self._cancelled

    def mark_cancelled(self) -> None:
        """Called by the worker when it learns the job was cancelled."""
        self._cancelled = True

    def raise_if_cancelled(self) -> None:
        """Raise :class:`~shoal.JobCancelled` once someone cancelled this job; else nothing.

        For handlers that cannot be interrupted (a plain ``def`` in its
        thread): the run then ends as cancelled at that point.
        """
        if self._cancelled:
            raise JobCancelled(f"job {self.id} was cancelled while its handler ran")

    async def heartbeat(self) -> bool:
        if self._heartbeat is None:
            return True
        return await self._heartbeat(self)

    def __repr__(self) -> str:
        return f"Job(id={self.id}, queue={self.queue!r}, attempt={self.attempt})"


# What the worker awaits for each job.
AsyncHandler = Callable[[Job], Awaitable[Any]]
# What an application registers: an ``async def``, or a plain ``def`` that
# runs in a thread pool of its own (shoal.queue.threaded).
Handler = Callable[[Job], Any]
_UNREAD = object()


# -- the failure history kept on a row ---------------------------------------

# A traceback is kept up to this many characters (its end, where the cause is).
MAX_TRACEBACK_CHARS = 8000


def error_entry(attempt: int, error: BaseException, at: str) -> dict[str, Any]:
    """One failed attempt, as appended to a job's or an item's ``errors``."""
    return {
        "attempt": attempt,
        "at": at,
        "type": type(error).__name__,
        "message": str(error) or type(error).__name__,
        "traceback": "".join(traceback.format_exception(error))[-MAX_TRACEBACK_CHARS:],
    }


def event_entry(attempt: int, kind: str, message: str, at: str) -> dict[str, Any]:
    """A failure with no exception behind it (a lease expired, a run handed back)."""
    return {"attempt": attempt, "at": at, "type": kind, "message": message, "traceback": None}


# -- outcomes of one run -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Completed:
    output: Any
    # The output as the JSON text its job stores, when it keeps one
    # (shoal.queue.results.encode_result; encoded as the run ends).
    stored: str | None = None


# The outcome of every run that returned None: one instance, since a frozen
# dataclass costs more to make (about 0.5 us, each field set through
# object.__setattr__) than a no-op handler takes to run.
COMPLETED = Completed(None)


@dataclass(frozen=True, slots=True)
class Failed:
    error: BaseException
    permanent: bool


@dataclass(frozen=True, slots=True)
class Cancelled:
    error: BaseException


@dataclass(frozen=True, slots=True)
class Snoozed:
    delay: timedelta
    # RetryAfter: the job's partition is held back for ``delay`` too.
    pause_partition: bool = False


@dataclass(frozen=True, slots=True)
class Interrupted:
    """Stopped by shutdown: handed back without costing an attempt."""


@dataclass(frozen=True, slots=True)
class Stopped:
    """Someone cancelled the job while this run held it: the job is ``cancelled`` already.

    ``started``: whether its handler had started (and was stopped), or the
    run was dropped before its handler began. The worker notes it on the
    job's history; whatever the handler returned is dropped.
    """

    started: bool


Outcome = Completed | Failed | Cancelled | Snoozed | Interrupted | Stopped


def outcome_of(error: Exception) -> Outcome:
    """What a handler meant by raising ``error`` (see ``shoal.errors``)."""
    if isinstance(error, Snooze):
        return Snoozed(error.delay, isinstance(error, RetryAfter))
    if isinstance(error, Cancel):
        return Cancelled(error)
    return Failed(error, isinstance(error, PermanentError))
