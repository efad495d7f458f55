"""The errors shoal raises, named for what the caller should do.

Every exception shoal raises to its callers derives from :class:`ShoalError`
and is importable from ``shoal``::

    ShoalError
    ├── InvalidInput          fix the request: the message names the field and the bad value
    │                         (also a ValueError)
    ├── CannotConnect         the first connection to the database failed; fix the URL or server
    ├── NotFound              the thing asked for does not exist (also a LookupError)
    ├── Conflict              the request collides with the current state; nothing was written
    │   ├── IdempotencyMismatch   the idempotency key was used for a different request
    │   └── StillCreating         an identical request with this key is still being created
    ├── TransientError        try again later: lost connection, deadline, serialization failure
    │   ├── DeadlineExceeded      a database call passed shoal's own deadline (also a TimeoutError)
    │   └── PublishError          an ingest publish was not confirmed (shoal.ingest.transport)
    ├── PermanentError        a handler's way to say "failing again will not help"
    ├── ExpiredError          a handler ran past its ``expire_in`` (recorded on the job;
    │                         also a TimeoutError)
    ├── MigrationChanged      an applied migration's text differs from the code's
    ├── MissingExtra          a feature needs an optional extra that is not installed
    │                         (also an ImportError); the message names the pip command
    ├── PipelineClosed        a held submit met its pipeline's close (shoal.ingest.pipeline)
    ├── UnsafeDurability      the NATS server may lose acknowledged messages (shoal.ingest.nats)
    ├── StepFailed            a workflow's step spent its attempts; raised in the workflow at the
    │                         step (shoal.workflow)
    ├── WorkflowChanged       a run's checkpoints no longer match its workflow's code; the run
    │                         fails naming the step (shoal.workflow)
    └── UnstorableResult      a handler returned a value that cannot be stored as JSON (recorded
                              as its run's error; also a ValueError)

Handlers may also raise :class:`Snooze` (or its :class:`RetryAfter`) or
:class:`Cancel` (or its :class:`JobCancelled`, which ``job.raise_if_cancelled()``
raises once someone cancelled the job): signals to the worker, not failures,
so they derive from ``Exception`` only.

The classes live here except those defined next to the ingest and workflow
code that raises them (named in brackets above); ``shoal`` exports them all.
"""

from __future__ import annotations

from datetime import timedelta


class ShoalError(Exception):
    """Root of every error shoal raises."""


class InvalidInput(ShoalError, ValueError):
    """Bad input; nothing was written. ``field`` names what was wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class CannotConnect(ShoalError):
    """The first connection to the database failed: no such database, credentials refused,
    host unreachable. The message names the cause and the URL, never its password."""


class NotFound(ShoalError, LookupError):
    """The job, queue, schedule, topic or task does not exist. ``field`` names the
    request field that named it, when there is one."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class Conflict(ShoalError):
    """The request collides with the current state; nothing was written. ``field``
    names the request field at fault, when there is one."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class TransientError(ShoalError):
    """A failure that may pass: retry later."""


class DeadlineExceeded(TransientError, TimeoutError):
    """A database call took longer than shoal's own deadline and was abandoned."""


class PermanentError(ShoalError):
    """Raised by a handler: this job will not succeed by retrying; fail it now."""


class IdempotencyMismatch(Conflict):
    """The idempotency key was used before for a different request (HTTP 422)."""


class StillCreating(Conflict):
    """A request with this idempotency key is still being created (HTTP 409)."""


class UnstorableResult(ShoalError, ValueError):
    """A handler returned a value that cannot be stored as JSON.

    The run fails like any other failed attempt (retried by the job's
    policy); the message names the handler, its queue, and the path and type
    of the first bad value (shoal.queue.results).
    """


class ExpiredError(ShoalError, TimeoutError):
    """The handler ran past its job's ``expire_in`` without a heartbeat.

    The worker records it as the run's error (``type`` ``ExpiredError``) and
    retries the job like any other failure.
    """


class MigrationChanged(ShoalError):
    """A migration's text differs from the one applied: the schema is not what the code expects."""


class MissingExtra(ShoalError, ImportError):
    """A feature needs an optional part of shoal that is not installed.

    ``extra`` names it; the message is one line with the command that installs it::

        shoal api needs the api extra: pip install 'shoal[api]'
    """

    def __init__(self, feature: str, extra: str) -> None:
        super().__init__(f"{feature} needs the {extra} extra: pip install 'shoal[{extra}]'")
        self.feature = feature
        self.extra = extra


class Snooze(Exception):
    """Raised by a handler: put the job back, to run again after ``delay``.

    A snooze costs no attempt.
    """

    def __init__(self, delay: timedelta | float) -> None:
        self.delay = delay if isinstance(delay, timedelta) else timedelta(seconds=delay)
        super().__init__(f"snoozed for {self.delay}")


class RetryAfter(Snooze):
    """Raised by a handler: the service behind this job said to wait (an HTTP 429 with
    Retry-After), so hold back the job's whole partition for ``delay``.

    The job goes back to wait for ``delay`` without spending an attempt, like a
    :class:`Snooze`; and on a queue with limits (docs/limits.md) no other job of
    its partition starts, in any process, until ``delay`` has passed. The
    queue's other partitions go on.
    """

    def __init__(self, delay: timedelta | float) -> None:
        super().__init__(delay)
        self.args = (f"retry after {self.delay}",)


class Cancel(Exception):
    """Raised by a handler: stop this job for good, as cancelled, without retrying."""


class JobCancelled(Cancel):
    """Raised by ``job.raise_if_cancelled()`` (and ``item.raise_if_cancelled()``): someone
    cancelled this run while its handler ran. The run ends as cancelled; a handler that
    lets it propagate stops at that point."""
