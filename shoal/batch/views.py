"""What the batch layer answers with: a task's view and progress, a page of items."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shoal.batch.states import ItemStatus, TaskId, TaskOutcome, TaskStatus
from shoal.batch.store import ItemRow, TaskRow


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
class TaskView:
    """A task with its live progress (one GROUP BY status; completed items are the rest)."""

    task_id: TaskId
    kind: str
    status: TaskStatus
    outcome: TaskOutcome | None
    progress: Progress
    params: Any
    created_at: datetime
    completed_at: datetime | None
    deadline_at: datetime | None

    def as_dict(self) -> dict[str, Any]:
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
        }


@dataclass(frozen=True, slots=True)
class Created:
    task_id: TaskId
    created: bool


@dataclass(frozen=True, slots=True)
class ItemsPage:
    items: tuple[ItemRow, ...]
    next_cursor: int | None


def task_view(row: TaskRow, counts: Mapping[ItemStatus, int]) -> TaskView:
    return TaskView(
        task_id=row.id,
        kind=row.kind,
        status=row.status,
        outcome=row.outcome,
        progress=Progress.of(row.total, counts),
        params=row.params,
        created_at=row.created_at,
        completed_at=row.completed_at,
        deadline_at=row.deadline_at,
    )


__all__ = ["Created", "ItemsPage", "Progress", "TaskView", "task_view"]
