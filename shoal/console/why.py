"""Why a job is where it is: the one fact the job's page states first.

A job delayed an hour, one waiting out its retry delay, one whose queue is
paused and one no worker claims all show as "created" or "retry"; an active
job whose lease passed looks like a running one. :func:`job_reason` tells
them apart from the job's row, the time and the queue's pause.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from shoal.queue.rows import JobRecord
from shoal.queue.states import JobState


class JobReason(StrEnum):
    SCHEDULED = "scheduled"  # created, start_after still to come
    RETRY_WAIT = "retry_wait"  # retry, its retry delay still running (start_after)
    QUEUE_PAUSED = "queue_paused"  # due, but its queue is paused: no process claims it
    DUE = "due"  # due and claimable: waiting for a worker of its queue
    RUNNING = "running"  # active, its lease not passed
    LEASE_PASSED = "lease_passed"  # active past its lease: maintenance hands it back
    FINISHED = "finished"  # completed, cancelled or failed


def job_reason(job: JobRecord, *, now: datetime, queue_paused: bool) -> JobReason:
    """Why ``job`` is in its state at ``now`` (a pure function of its row)."""
    if job.state in (JobState.COMPLETED, JobState.CANCELLED, JobState.FAILED):
        return JobReason.FINISHED
    if job.state is JobState.ACTIVE:
        lease = job.lease_expires_at
        return JobReason.LEASE_PASSED if lease is not None and lease <= now else JobReason.RUNNING
    if job.start_after > now:
        return JobReason.RETRY_WAIT if job.state is JobState.RETRY else JobReason.SCHEDULED
    return JobReason.QUEUE_PAUSED if queue_paused else JobReason.DUE


__all__ = ["JobReason", "job_reason"]
