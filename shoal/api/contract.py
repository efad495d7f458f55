"""The JSON shapes of the ``/v1`` routes, as documented in ``docs/api.md``.

Requests are validated strictly (no "5" for 5, no unknown fields). The item
list is checked by :func:`shoal.batch.inputs.parse_items`, the one place that
knows the rules for refs, duplicates and payload sizes, so its messages name
the exact entry (``items[3].ref``); the schema below only describes it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from shoal.batch.inputs import MAX_KEY_LENGTH, MAX_REF_LENGTH

# Ten years: the same bound the batch layer applies.
MAX_DEADLINE_S = 10 * 365 * 86400

ITEM_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "minLength": 1, "maxLength": MAX_REF_LENGTH},
        {
            "type": "object",
            "properties": {
                "ref": {"type": "string", "minLength": 1, "maxLength": MAX_REF_LENGTH},
                "data": {"description": "Any JSON value handed to the item's handler."},
                "partition_key": {
                    "type": ["string", "integer"],
                    "description": "The item's partition of its kind's limits "
                    "(docs/limits.md); by default its kind's partition_by gives it.",
                },
            },
            "required": ["ref"],
            "additionalProperties": False,
        },
    ]
}

TaskStatusName = Literal["processing", "completed", "cancelled"]
TaskOutcomeName = Literal["completed", "completed_with_errors", "cancelled", "timed_out"]
ItemStatusName = Literal["pending", "running", "completed", "error", "cancelled"]


class CreateTask(BaseModel):
    """``POST /v1/tasks``: one task of ``kind`` with one item per entry of ``items``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    kind: str = Field(min_length=1, max_length=128, description="A batch kind the app declares.")
    items: Annotated[
        list[Any],
        WithJsonSchema({"type": "array", "minItems": 1, "items": ITEM_SCHEMA}),
    ] = Field(
        description='Refs ("doc-1") or {"ref", "data", "partition_key"} objects; refs are unique.'
    )
    idempotency_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_KEY_LENGTH,
        description="Repeat-safe creation; also accepted as an Idempotency-Key header.",
    )
    params: Any = Field(default=None, description="Any JSON value handed to every item.")
    deadline_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_DEADLINE_S,
        description="Seconds until unfinished items are cancelled (outcome timed_out).",
    )


class Created(BaseModel):
    task_id: str
    created: bool


class ProgressOut(BaseModel):
    total: int
    pending: int
    running: int
    completed: int
    error: int
    cancelled: int
    percent: float


class TaskOut(BaseModel):
    task_id: str
    kind: str
    status: TaskStatusName
    outcome: TaskOutcomeName | None
    progress: ProgressOut
    params: Any = None
    created_at: str
    completed_at: str | None
    deadline_at: str | None = None
    queue: str = Field(default="", description="The queue of the task's items.")
    paused: bool = Field(
        default=False, description="The items' queue is paused: nothing of the task starts."
    )
    elapsed_s: float | None = Field(
        default=None, description="Seconds since created (until completed, once closed)."
    )
    rate_per_s: float | None = Field(
        default=None, description="Items finished per second since created, while processing."
    )
    eta_s: float | None = Field(
        default=None,
        description=(
            "Seconds left at that rate; null when unknown (nothing finished yet, paused, "
            "closed or being stopped)."
        ),
    )


class TaskList(BaseModel):
    tasks: list[TaskOut]


class ItemErrorOut(BaseModel):
    """One run of an item that did not complete, as its history keeps it."""

    attempt: int = Field(
        description="Which run of the item this was, counted over its whole life "
        "(retry-failed does not start it again from 1)."
    )
    run: int | None = Field(
        default=None, description="The run since the item was last (re)opened (1 = first)."
    )
    started_at: str | None = Field(default=None, description="When the run started.")
    at: str | None = Field(default=None, description="When the run ended.")
    type: str | None = None
    message: str | None = None
    traceback: str | None = None


class ItemOut(BaseModel):
    id: int
    ref: str
    status: ItemStatusName
    attempts: int
    data: Any = None
    result: Any = None
    error: str | None
    errors: list[ItemErrorOut]
    started_at: str | None
    updated_at: str
    finished_at: str | None


class ItemPage(BaseModel):
    items: list[ItemOut]
    next_cursor: int | None


class Retried(BaseModel):
    task_id: str
    retried: int = Field(description="Items put back to pending.")
    task: TaskOut


class Health(BaseModel):
    status: str


__all__ = [
    "CreateTask",
    "Created",
    "Health",
    "ItemErrorOut",
    "ItemOut",
    "ItemPage",
    "ProgressOut",
    "Retried",
    "TaskList",
    "TaskOut",
]
