"""shoal: a Postgres-native engine for reliable background work."""

from shoal.app import App
from shoal.clock import Clock, FakeClock, SystemClock
from shoal.db.embedded import EmbeddedPostgres
from shoal.db.pool import Database
from shoal.errors import (
    Cancel,
    Conflict,
    DeadlineExceeded,
    InvalidInput,
    NotFound,
    PermanentError,
    ShoalError,
    Snooze,
    TransientError,
)
from shoal.ingest.message import Message, Topic
from shoal.ingest.pipeline import Pipeline, Submitted
from shoal.ingest.transport import PublishError
from shoal.queue.client import Shoal
from shoal.queue.job import Job
from shoal.queue.options import JobOptions
from shoal.queue.states import JobId, JobState
from shoal.queue.store import JobError, JobRecord
from shoal.queue.worker import Worker

__all__ = [
    "App",
    "Cancel",
    "Clock",
    "Conflict",
    "Database",
    "DeadlineExceeded",
    "EmbeddedPostgres",
    "FakeClock",
    "InvalidInput",
    "Job",
    "JobError",
    "JobId",
    "JobOptions",
    "JobRecord",
    "JobState",
    "Message",
    "NotFound",
    "PermanentError",
    "Pipeline",
    "PublishError",
    "Shoal",
    "ShoalError",
    "Snooze",
    "Submitted",
    "SystemClock",
    "Topic",
    "TransientError",
    "Worker",
]
