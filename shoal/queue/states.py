"""The job state machine.

::

    created ──claim──> active ──complete──> completed
       ^                 │ ├──fail (attempts left)──> retry ──claim──> active
       │                 │ ├──fail (none left) / PermanentError──> failed ──retry()──> retry
       │                 │ └──lease expired──> retry | failed
       │                 └──snooze / hand back──> created
       └──resume()── cancelled <──cancel()── created | retry | active

    created ──redrive──> completed
    created | retry ──take (one-shot delivery)──> deleted

A take deletes a waiting job in the step that delivers it, without a lease:
the batch layer's claim of item jobs (take_item_jobs_v2), whose item rows
record the run and its outcome instead (0.1.0's take_jobs completed
the job instead, the edge retry -> completed,
which this release's code no longer makes). ``redrive()`` completes the
waiting copies in a dead-letter queue it sends back as new jobs. An ingest message's
job leaves ``active`` by being deleted when its consumer acknowledges it
(delete_jobs_v2): the topic's done-marker, not a finished row, records it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NewType

JobId = NewType("JobId", int)


class JobState(StrEnum):
    CREATED = "created"
    """Inserted by send/insert, resume, snooze or hand-back; left by claim, take or cancel."""
    RETRY = "retry"
    """A failed attempt with attempts left (or a manual retry); left by claim, take or cancel."""
    ACTIVE = "active"
    """Claimed under a lease; left by complete, fail, cancel, snooze or lease expiry."""
    COMPLETED = "completed"
    """Done with, by the queue's account. Terminal. Reached from active when the handler
    returned, or straight from created | retry when the job was taken (a one-shot delivery
    whose run another layer records: a batch item job's outcome is its item's) or redriven
    (a dead-letter copy sent back as a new job); ``output`` says which."""
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
    JobState.CREATED: frozenset({JobState.ACTIVE, JobState.COMPLETED, JobState.CANCELLED}),
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
