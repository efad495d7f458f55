"""The job state machine.

::

    created ──claim──> active ──complete──> completed
       ^                 │ ├──fail (attempts left)──> retry ──claim──> active
       │                 │ ├──fail (none left) / PermanentError──> failed ──retry()──> retry
       │                 │ └──lease expired──> retry | failed
       │                 └──snooze / hand back──> created
       └──resume()── cancelled <──cancel()── created | retry | active
"""

from __future__ import annotations

from enum import StrEnum
from typing import NewType

JobId = NewType("JobId", int)


class JobState(StrEnum):
    CREATED = "created"
    """Inserted by send/insert, resume, snooze or shutdown hand-back; left by claim or cancel."""
    RETRY = "retry"
    """A failed attempt with attempts left (or a manual retry); left by a claim or cancel."""
    ACTIVE = "active"
    """Claimed under a lease; left by complete, fail, cancel, snooze or lease expiry."""
    COMPLETED = "completed"
    """The handler returned. Terminal."""
    CANCELLED = "cancelled"
    """cancel(), or a handler raised Cancel. Left only by resume()."""
    FAILED = "failed"
    """The last attempt failed, or a PermanentError. Left only by retry()."""

    @property
    def is_waiting(self) -> bool:
        return self in WAITING_STATES

    @property
    def is_finished(self) -> bool:
        return self in FINISHED_STATES


WAITING_STATES = frozenset({JobState.CREATED, JobState.RETRY})
FINISHED_STATES = frozenset({JobState.COMPLETED, JobState.CANCELLED, JobState.FAILED})

# Every edge a job may take; docs/queue.md draws its diagram from this mapping.
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.CREATED: frozenset({JobState.ACTIVE, JobState.CANCELLED}),
    JobState.RETRY: frozenset({JobState.ACTIVE, JobState.CANCELLED}),
    JobState.ACTIVE: frozenset(
        {
            JobState.COMPLETED,
            JobState.RETRY,
            JobState.FAILED,
            JobState.CANCELLED,
            JobState.CREATED,
        }
    ),
    JobState.COMPLETED: frozenset(),
    JobState.CANCELLED: frozenset({JobState.CREATED}),
    JobState.FAILED: frozenset({JobState.RETRY}),
}
