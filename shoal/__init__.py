"""shoal: a Postgres-native engine for reliable background work."""

import typing as _typing

from shoal.app import App
from shoal.batch.item import Item
from shoal.batch.kinds import BatchKind
from shoal.batch.service import Batches
from shoal.batch.states import ItemStatus, TaskOutcome, TaskStatus
from shoal.batch.sync import SyncBatches
from shoal.batch.views import Created, ItemsPage, Progress, TaskView
from shoal.batch.watch import watch_task
from shoal.clock import Clock, FakeClock, SystemClock
from shoal.db.embedded import EmbeddedPostgres
from shoal.db.migrate import migrate
from shoal.db.pool import Database
from shoal.errors import (
    Cancel,
    CannotConnect,
    Conflict,
    DeadlineExceeded,
    ExpiredError,
    IdempotencyMismatch,
    InvalidInput,
    JobCancelled,
    MigrationChanged,
    MissingExtra,
    NotFound,
    PermanentError,
    RetryAfter,
    ShoalError,
    Snooze,
    StillCreating,
    TransientError,
    UnstorableResult,
)
from shoal.ingest.message import Message, Topic
from shoal.ingest.pipeline import Pipeline, PipelineClosed, Submitted
from shoal.ingest.transport import PublishError
from shoal.queue.client import Shoal
from shoal.queue.job import Job
from shoal.queue.limits import LimitState, Rate
from shoal.queue.options import JobOptions, QueueDefaults, SendOptions, SharedJobOptions
from shoal.queue.rows import JobError, JobRecord
from shoal.queue.states import JobId, JobState
from shoal.queue.sync import SyncClient
from shoal.queue.worker import Worker
from shoal.workflow import RunStatus, StepFailed, Workflow, WorkflowChanged, Workflows

if _typing.TYPE_CHECKING:
    from shoal.ingest.nats import UnsafeDurability

    __version__: str


def __getattr__(name: str) -> object:
    # The nats transport's error, imported on first use: importing nats-py
    # costs every process that never uses it a tenth of a second.
    if name == "UnsafeDurability":
        from shoal.ingest.nats import UnsafeDurability

        return UnsafeDurability
    if name == "__version__":  # read on first use: importlib.metadata costs 20-60 ms
        return _installed_version()
    raise AttributeError(f"module 'shoal' has no attribute {name!r}")


def _installed_version() -> str:
    """``shoal.__version__``: the installed distribution's version.

    pyproject.toml's ``version`` is the one source: ``shoal.__version__`` and
    ``shoal --version`` both read it from the metadata pip installed.
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("shoal")
    except PackageNotFoundError:  # imported from a source tree that was never installed
        return "unknown (not installed)"


def __dir__() -> list[str]:
    return sorted([*globals(), "UnsafeDurability"])


__all__ = [
    "App",
    "BatchKind",
    "Batches",
    "Cancel",
    "CannotConnect",
    "Clock",
    "Conflict",
    "Created",
    "Database",
    "DeadlineExceeded",
    "EmbeddedPostgres",
    "ExpiredError",
    "FakeClock",
    "IdempotencyMismatch",
    "InvalidInput",
    "Item",
    "ItemStatus",
    "ItemsPage",
    "Job",
    "JobCancelled",
    "JobError",
    "JobId",
    "JobOptions",
    "JobRecord",
    "JobState",
    "LimitState",
    "Message",
    "MigrationChanged",
    "MissingExtra",
    "NotFound",
    "PermanentError",
    "Pipeline",
    "PipelineClosed",
    "Progress",
    "PublishError",
    "QueueDefaults",
    "Rate",
    "RetryAfter",
    "RunStatus",
    "SendOptions",
    "SharedJobOptions",
    "Shoal",
    "ShoalError",
    "Snooze",
    "StepFailed",
    "StillCreating",
    "Submitted",
    "SyncBatches",
    "SyncClient",
    "SystemClock",
    "TaskOutcome",
    "TaskStatus",
    "TaskView",
    "Topic",
    "TransientError",
    "UnsafeDurability",
    "UnstorableResult",
    "Worker",
    "Workflow",
    "WorkflowChanged",
    "Workflows",
    "migrate",
    "watch_task",
]
