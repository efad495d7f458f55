"""The JSON shapes of the ``/v1/workflows`` routes, as documented in ``docs/api.md``.

Times are ISO 8601 strings. Inputs, results and payloads are any JSON value.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shoal.workflow.runtime import MAX_KEY_LENGTH
from shoal.workflow.service import MAX_RUN_ID_LENGTH

RunStatusName = Literal[
    "pending", "running", "sleeping", "waiting", "completed", "failed", "cancelled"
]
StepKindName = Literal["step", "sleep", "wait", "batch"]
StepStatusName = Literal["completed", "retrying", "waiting", "failed"]


class StartRun(BaseModel):
    """``POST /v1/workflows/runs``: a run of workflow ``name`` with ``input``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(min_length=1, max_length=200, description="A workflow the app declares.")
    input: Any = Field(default=None, description="Any JSON value handed to the workflow.")
    id: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_RUN_ID_LENGTH,
        description="The run's id: a second start with it starts nothing (200). "
        "Default: a new UUID.",
    )


class RunStarted(BaseModel):
    id: str
    created: bool = Field(description="False: a run of that id existed, and nothing was started.")


class SendEvent(BaseModel):
    """``POST /v1/workflows/events``: an event to the run that waits (or will wait) for ``key``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    key: str = Field(min_length=1, max_length=MAX_KEY_LENGTH)
    payload: Any = Field(default=None, description="Any JSON value: what wait_for returns.")


class EventSent(BaseModel):
    id: int = Field(description="The event's id.")
    key: str


class RunOut(BaseModel):
    id: str
    name: str
    status: RunStatusName
    input: Any = None
    result: Any = None
    error: str | None = Field(
        description="How a failed run failed (type, message and traceback); null otherwise."
    )
    created_at: str
    updated_at: str
    finished_at: str | None
    wait_key: str | None = Field(description="The event a waiting run waits for.")


class StepOut(BaseModel):
    seq: int = Field(description="The step's place in the run, from 1.")
    name: str
    kind: StepKindName
    status: StepStatusName
    attempts: int
    result: Any = None
    error: str | None = Field(description="The last attempt's error, with its traceback.")
    started_at: str
    finished_at: str | None
    until: str | None = Field(
        default=None,
        description="When a sleep ends, or a wait with a timeout gives up (its deadline).",
    )


class RunDetail(RunOut):
    steps: list[StepOut]


class RunPage(BaseModel):
    runs: list[RunOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null: last.")


class WorkflowList(BaseModel):
    workflows: list[str] = Field(description="The workflows this API's app declares.")


__all__ = [
    "EventSent",
    "RunDetail",
    "RunOut",
    "RunPage",
    "RunStarted",
    "RunStatusName",
    "SendEvent",
    "StartRun",
    "StepOut",
    "WorkflowList",
]
