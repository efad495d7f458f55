"""What the batch layer answers with: a task's view and progress, a page of items."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shoal.batch.rows import ItemRow, TaskRow
from shoal.batch.states import ItemStatus, TaskId, TaskOutcome, TaskStatus


@dataclass(frozen=True, slots=True)
class Progress:
    total: int
    pending: int
    running: int
    completed: int
    error: int
    cancelled: int

    @property
    def finished(self) -> int:
        return self.completed + self.error + self.cancelled

    @property
    def percent(self) -> float:
        return round(100.0 * self.finished / self.total, 1) if self.total else 100.0

    def as_dict(self) -> dict[str, float | int]:
        return {
            "total": self.total,
            "pending": self.pending,
            "running": self.running,
            "completed": self.completed,
            "error": self.error,
            "cancelled": self.cancelled,
            "percent": self.percent,
        }

    @classmethod
    def of(cls, total: int, counts: Mapping[ItemStatus, int]) -> Progress:
        """From counts by status; without a count of completed items, they are the rest."""
        pending = counts.get(ItemStatus.PENDING, 0)
        running = counts.get(ItemStatus.RUNNING, 0)
        error = counts.get(ItemStatus.ERROR, 0)
        cancelled = counts.get(ItemStatus.CANCELLED, 0)
        completed = counts.get(ItemStatus.COMPLETED, total - pending - running - error - cancelled)
        return cls(total, pending, running, completed, error, cancelled)


@dataclass(frozen=True, slots=True)
class Estimate:
    """How long a task has run and, while it runs, how long it may take yet.

    ``rate_per_s`` is items finished (completed or error) per second since the
    task was created; ``eta_s`` is its unfinished items at that rate. Both are
    None when there is nothing to go by or nothing to wait for: no item has
    finished yet, the task is closed or being stopped, or its queue is paused
    (no item starts until it is resumed, so no rate says when it ends).
    """

    elapsed_s: float
    rate_per_s: float | None
    eta_s: float | None


def estimate(
    progress: Progress,
    *,
    created_at: datetime,
    completed_at: datetime | None,
    now: datetime,
    running: bool,
    paused: bool,
) -> Estimate:
    """The pure arithmetic of :class:`Estimate`; ``running`` is "processing, not being stopped"."""
    end = completed_at if completed_at is not None else now
    elapsed = max(0.0, (end - created_at).total_seconds())
    done = progress.completed + progress.error
    if not running or paused or done == 0 or elapsed <= 0:
        return Estimate(elapsed, None, None)
    rate = done / elapsed
    return Estimate(elapsed, rate, (progress.pending + progress.running) / rate)


@dataclass(frozen=True, slots=True)
class TaskView:
    """A task with its live progress (the sums of its item_tally rows)."""

    task_id: TaskId
    kind: str
    status: TaskStatus
    outcome: TaskOutcome | None
    progress: Progress
    params: Any
    created_at: datetime
    completed_at: datetime | None
    deadline_at: datetime | None
    # The queue of the task's items, and whether it is paused (nothing of the
    # task starts until it is resumed).
    queue: str = ""
    paused: bool = False
    estimate: Estimate | None = None

    def as_dict(self) -> dict[str, Any]:
        est = self.estimate
        return {
            "task_id": self.task_id,
            "kind": self.kind,
            "status": self.status.value,
            "outcome": None if self.outcome is None else self.outcome.value,
            "progress": self.progress.as_dict(),
            "params": self.params,
            "created_at": self.created_at.isoformat(),
            "completed_at": None if self.completed_at is None else self.completed_at.isoformat(),
            "deadline_at": None if self.deadline_at is None else self.deadline_at.isoformat(),
            "queue": self.queue,
            "paused": self.paused,
            "elapsed_s": None if est is None else round(est.elapsed_s, 3),
            "rate_per_s": (
                None if est is None or est.rate_per_s is None else round(est.rate_per_s, 3)
            ),
            "eta_s": None if est is None or est.eta_s is None else round(est.eta_s, 3),
        }


@dataclass(frozen=True, slots=True)
class Created:
    task_id: TaskId
    created: bool


@dataclass(frozen=True, slots=True)
class ItemsPage:
    items: tuple[ItemRow, ...]
    next_cursor: int | None


def task_view(
    row: TaskRow,
    counts: Mapping[ItemStatus, int],
    *,
    now: datetime | None = None,
    paused_queues: Collection[str] = (),
) -> TaskView:
    """The view of ``row``; with ``now``, its elapsed time and estimate too."""
    progress = Progress.of(row.total, counts)
    paused = row.item_queue in paused_queues
    return TaskView(
        task_id=row.id,
        kind=row.kind,
        status=row.status,
        outcome=row.outcome,
        progress=progress,
        params=row.params,
        created_at=row.created_at,
        completed_at=row.completed_at,
        deadline_at=row.deadline_at,
        queue=row.item_queue,
        paused=paused,
        estimate=(
            None
            if now is None
            else estimate(
                progress,
                created_at=row.created_at,
                completed_at=row.completed_at,
                now=now,
                running=row.status is TaskStatus.PROCESSING and row.cancel_reason is None,
                paused=paused,
            )
        ),
    )


__all__ = ["Created", "Estimate", "ItemsPage", "Progress", "TaskView", "estimate", "task_view"]
