"""The errors shoal raises, named for what the caller should do.

::

    ShoalError
    ├── InvalidInput        fix the request: the message names the field and the bad value
    ├── NotFound            the thing asked for does not exist
    ├── Conflict            the request collides with the current state; nothing was written
    ├── TransientError      try again later: lost connection, deadline, serialization failure
    ├── PermanentError      a handler's way to say "failing again will not help"
    └── DeadlineExceeded    (a TransientError) a database call passed shoal's own deadline

Handlers may also raise :class:`Snooze` or :class:`Cancel`, which are not failures.
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


class NotFound(ShoalError, LookupError):
    """The job, queue, schedule or task does not exist."""


class Conflict(ShoalError):
    """The request collides with the current state; nothing was written."""


class TransientError(ShoalError):
    """A failure that may pass: retry later."""


class DeadlineExceeded(TransientError, TimeoutError):
    """A database call took longer than shoal's own deadline and was abandoned."""


class PermanentError(ShoalError):
    """Raised by a handler: this job will not succeed by retrying; fail it now."""


class Snooze(Exception):
    """Raised by a handler: put the job back, to run again after ``delay``.

    A snooze costs no attempt.
    """

    def __init__(self, delay: timedelta | float) -> None:
        self.delay = delay if isinstance(delay, timedelta) else timedelta(seconds=delay)
        super().__init__(f"snoozed for {self.delay}")


class Cancel(Exception):
    """Raised by a handler: stop this job for good, as cancelled, without retrying."""
