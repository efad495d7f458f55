"""A workflow run's and a step's states, and the errors a workflow's code meets."""

from __future__ import annotations

from enum import StrEnum

from shoal.errors import ShoalError


class RunStatus(StrEnum):
    """Where a run is. The last three are final (``retry`` reopens failed and cancelled runs)."""

    PENDING = "pending"
    RUNNING = "running"
    SLEEPING = "sleeping"  # a durable timer, or a failed step's retry delay
    WAITING = "waiting"  # an event (wait_for)
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINAL = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})


class StepStatus(StrEnum):
    COMPLETED = "completed"
    RETRYING = "retrying"
    WAITING = "waiting"
    FAILED = "failed"


class StepKind(StrEnum):
    STEP = "step"
    SLEEP = "sleep"
    WAIT = "wait"
    BATCH = "batch"


class StepFailed(ShoalError):
    """A step spent its attempts; raised into the workflow's code at the step.

    A workflow may catch it and go on (compensate, take another path); one
    that does not fails its run with this error. ``error`` is the last
    attempt's error as recorded (type, message and traceback).
    """

    def __init__(self, run_id: str, step: str, seq: int, attempts: int, error: str) -> None:
        first = error.strip().splitlines()[-1] if error.strip() else "no message"
        super().__init__(
            f"step {seq} ({step!r}) of run {run_id!r} failed after {attempts} attempt"
            f"{'s' if attempts != 1 else ''}: {first}"
        )
        self.run_id = run_id
        self.step = step
        self.seq = seq
        self.attempts = attempts
        self.error = error


class WorkflowChanged(ShoalError):
    """The workflow's code no longer matches a run's checkpoints.

    A run resumes by running its workflow's code again, each step taking its
    checkpoint in turn; if the code now calls a different step where the run
    recorded one, resuming would mix two definitions, so the run fails with
    this error naming the step (docs/workflows.md, "Changing a workflow").
    """
