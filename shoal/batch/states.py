"""The item and task state machines.

Item::

    pending ──guard──> running ──> completed
       ^  │               ├──transient error (attempts left) / shutdown──> pending
       │  │               ├──permanent error / last attempt / reaped, none left──> error
       │  │               └──reaped (no sign of life, attempts left)──> pending
       │  └──cancel / deadline──> cancelled
       └──retry-failed── error, cancelled (of a task cancelled, not timed out)

Task::

    processing ──close (nothing pending/running)──> completed (completed | completed_with_errors)
               └──close after cancel / deadline──> cancelled (cancelled | timed_out)
    completed ──retry-failed──> processing
    cancelled (outcome cancelled) ──retry-failed──> processing
"""

from __future__ import annotations

from enum import StrEnum
from typing import NewType

TaskId = NewType("TaskId", str)
ItemId = NewType("ItemId", int)


class ItemStatus(StrEnum):
    PENDING = "pending"
    """Created with its task, or put back (transient error, shutdown, reaper, retry-failed)."""
    RUNNING = "running"
    """A worker passed the phantom guard; left by its fenced final write or the reaper."""
    COMPLETED = "completed"
    """The handler returned; its result is kept. Terminal."""
    ERROR = "error"
    """Permanent error, attempts exhausted, or reaped with none left. Left by retry-failed."""
    CANCELLED = "cancelled"
    """Pending or running when its task was cancelled or timed out. Left by retry-failed
    (of a cancelled task; a timed-out task's stay)."""


class TaskStatus(StrEnum):
    PROCESSING = "processing"
    """Created; left only when the aggregator finds nothing pending or running."""
    COMPLETED = "completed"
    """Every item ended (outcome completed | completed_with_errors). Reopened by retry-failed."""
    CANCELLED = "cancelled"
    """Closed after a cancel or a passed deadline (outcome cancelled | timed_out).
    Reopened by retry-failed when cancelled (not when timed out)."""


class TaskOutcome(StrEnum):
    COMPLETED = "completed"
    COMPLETED_WITH_ERRORS = "completed_with_errors"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"


ITEM_TRANSITIONS: dict[ItemStatus, frozenset[ItemStatus]] = {
    ItemStatus.PENDING: frozenset({ItemStatus.RUNNING, ItemStatus.CANCELLED}),
    ItemStatus.RUNNING: frozenset({ItemStatus.COMPLETED, ItemStatus.ERROR, ItemStatus.PENDING}),
    ItemStatus.COMPLETED: frozenset(),
    ItemStatus.ERROR: frozenset({ItemStatus.PENDING}),
    ItemStatus.CANCELLED: frozenset({ItemStatus.PENDING}),
}

TASK_TRANSITIONS: dict[TaskStatus, frozenset[TaskStatus]] = {
    TaskStatus.PROCESSING: frozenset({TaskStatus.COMPLETED, TaskStatus.CANCELLED}),
    TaskStatus.COMPLETED: frozenset({TaskStatus.PROCESSING}),
    TaskStatus.CANCELLED: frozenset({TaskStatus.PROCESSING}),
}
