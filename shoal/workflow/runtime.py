"""What a run's code runs on: the runtime a workflow's jobs share, step options, and the
signals that unwind a run (a wait, a lost run, a database failure under a step).

Kept apart from :class:`~shoal.workflow.context.Workflow`, the face a workflow's
code sees, so that the runner and the service reach these without it.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from shoal.batch.service import Batches
from shoal.clock import Clock
from shoal.db.pool import AsyncConn, Database
from shoal.errors import InvalidInput
from shoal.queue.client import Shoal
from shoal.queue.options import DEFAULT_RETRY_DELAY_MAX, MAX_DURATION
from shoal.queue.retry import RetryPolicy
from shoal.queue.threaded import is_async_callable
from shoal.workflow.store import WorkflowStore

if TYPE_CHECKING:
    from shoal.workflow.context import Workflow

T = TypeVar("T")

# A wait for an event with no timeout: its resume job is due this far ahead
# (the longest duration a job takes), and an event makes it due at once.
NO_TIMEOUT = MAX_DURATION - timedelta(days=1)
MAX_KEY_LENGTH = 512

_current: contextvars.ContextVar[Workflow | None] = contextvars.ContextVar(
    "shoal_workflow", default=None
)


def current_workflow() -> Workflow | None:
    """The run whose code is running in this task, if any (what ``@app.step`` functions use).

    None inside a step: a step called from a step is a plain call, checkpointed
    as part of the outer one.
    """
    return _current.get()


class Suspended(BaseException):
    """The run waits (a sleep, an event, a retry delay): its resume job is sent.

    A ``BaseException``, so a workflow's ``except Exception`` does not stop it.
    """


class Superseded(BaseException):
    """Another job holds the run now (this one's lease ran out, or the run was cancelled)."""


class MachineryFailed(BaseException):
    """The database failed under a step's bookkeeping: the job fails and is retried.

    Carried as a ``BaseException`` through the workflow's code, so that its
    ``except Exception`` cannot take a lost connection for a failed step.
    """

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass(frozen=True, slots=True)
class StepOptions:
    """How a step is named, retried and committed (see :meth:`Workflow.step`)."""

    name: str | None
    policy: RetryPolicy
    transaction: bool

    @classmethod
    def of(
        cls,
        name: str | None,
        retry_limit: int,
        retry_delay: timedelta,
        retry_backoff: bool,
        transaction: bool,
    ) -> StepOptions:
        """Checked options: a bad one raises :class:`InvalidInput` naming it."""
        if name is not None and (not isinstance(name, str) or not name):
            raise InvalidInput("name", f"a step's name is a non-empty string, got {name!r}")
        if isinstance(retry_limit, bool) or not isinstance(retry_limit, int) or retry_limit < 0:
            raise InvalidInput(
                "retry_limit", f"must be an integer of 0 or more, got {retry_limit!r}"
            )
        if not isinstance(retry_delay, timedelta) or retry_delay < timedelta(0):
            raise InvalidInput(
                "retry_delay", f"must be a timedelta of 0 or more, got {retry_delay!r}"
            )
        policy = RetryPolicy(retry_limit, retry_delay, bool(retry_backoff), DEFAULT_RETRY_DELAY_MAX)
        return cls(name, policy, bool(transaction))


# Starts a child run: (workflow name, input, run id, done key) -> created.
StartChild = Callable[[str, Any, str, str, AsyncConn], Awaitable[bool]]


@dataclass(frozen=True, slots=True)
class Runtime:
    """What every run of one workflow needs: the database, the queue, the workflow's job options."""

    store: WorkflowStore
    boss: Shoal
    queue: str
    job_options: dict[str, Any] = field(default_factory=dict)
    batches: Batches | None = None
    start_child: StartChild | None = None

    @property
    def db(self) -> Database:
        return self.store.db

    @property
    def clock(self) -> Clock:
        return self.boss.clock


def caller_of(fn: Callable[..., Any], transaction: bool) -> Callable[..., Awaitable[Any]]:
    """``fn`` as a coroutine function that runs outside any workflow (steps do not nest)."""
    if not callable(fn):
        raise InvalidInput("fn", f"a step must be a function, got {fn!r}")
    if is_async_callable(fn):

        async def outside(*args: Any, **kwargs: Any) -> Any:
            token = _current.set(None)
            try:
                return await fn(*args, **kwargs)
            finally:
                _current.reset(token)

        return outside
    if transaction:
        raise InvalidInput(
            "fn", f"a step with transaction=True must be an async def function, got {fn!r}"
        )

    def plain(*args: Any, **kwargs: Any) -> Any:
        _current.set(None)  # in the thread's own copy of the context
        return fn(*args, **kwargs)

    async def in_thread(*args: Any, **kwargs: Any) -> Any:
        context = contextvars.copy_context()
        return await asyncio.to_thread(context.run, plain, *args, **kwargs)

    return in_thread


def task_key(task_id: str) -> str:
    """The wait key of a run waiting for a batch task to close."""
    return f"shoal.batch:{task_id}"


def child_key(child_id: str) -> str:
    """The event a child run's end sends to its parent."""
    return f"shoal.workflow.done:{child_id}"


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def returned_by(label: str, seq: int) -> str:
    return f"step {seq} ({label!r}) returned a result that cannot be stored: "


def to_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def parse_time(text: str) -> datetime:
    at = datetime.fromisoformat(text)
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def enter(wf: Workflow) -> contextvars.Token[Workflow | None]:
    return _current.set(wf)


def leave(token: contextvars.Token[Workflow | None]) -> None:
    _current.reset(token)
