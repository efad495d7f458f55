"""Handlers run in the test's own task: one job or item in memory, or a queue drained."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from shoal._deprecation import warn_renamed
from shoal.batch.item import Item
from shoal.batch.kinds import BatchKind
from shoal.batch.rows import GuardedItem
from shoal.batch.states import ItemId, ItemStatus, TaskId
from shoal.clock import SYSTEM_CLOCK, Clock
from shoal.errors import InvalidInput
from shoal.queue.client import Shoal
from shoal.queue.job import Cancelled, Failed, Handler, Job, Snoozed, outcome_of
from shoal.queue.options import JobOptions
from shoal.queue.results import callable_name, encode_result, returned_by
from shoal.queue.retry import SYSTEM_JITTER, Jitter, RetryPolicy, after_failure, retry_delay
from shoal.queue.rows import ClaimedJob
from shoal.queue.states import JobId, JobState
from shoal.queue.threaded import as_async
from shoal.queue.worker import DEFAULT_POLL_INTERVAL, Worker

# drain() gives up past this many jobs: a handler that snoozes with no delay
# (or re-enqueues itself) would otherwise loop forever.
DEFAULT_DRAIN_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class JobRun:
    """What a worker would make of one run of a handler (see :func:`run_job`).

    ``outcome`` is ``completed``, ``retried``, ``failed``, ``snoozed`` or
    ``cancelled``; ``state`` the job's next state; ``retry_in`` the wait
    before the next attempt (retried and snoozed runs).
    """

    outcome: Literal["completed", "retried", "failed", "snoozed", "cancelled"]
    state: JobState
    output: Any = None
    error: BaseException | None = None
    retry_in: timedelta | None = None


async def run_job(
    handler: Handler,
    data: Any = None,
    *,
    queue: str = "test",
    attempt: int = 1,
    clock: Clock = SYSTEM_CLOCK,
    jitter: Jitter = SYSTEM_JITTER,
    **options: Any,
) -> JobRun:
    """Call ``handler`` with a job built from ``data`` and ``options``, in this task.

    No database is involved: the job has id 0 and no lease, and
    ``job.heartbeat()`` returns True. The handler's return or exception goes
    through the worker's own outcome logic (``PermanentError`` fails at once,
    ``Snooze`` and ``Cancel`` as documented, any other exception retries while
    ``retry_limit`` allows).

    >>> run = await run_job(send_email, {"to": "a@example.com"}, retry_limit=0)  # doctest: +SKIP
    >>> run.outcome                                                             # doctest: +SKIP
    'completed'
    """
    if attempt < 1:
        raise InvalidInput("attempt", f"must be >= 1, got {attempt!r}")
    settings = JobOptions().merged(options)
    now = clock.now()
    claim = ClaimedJob(
        id=JobId(0),
        queue=queue,
        data_json=json.dumps(data),
        priority=settings.priority,
        attempt=attempt,
        policy=RetryPolicy(
            settings.retry_limit,
            settings.retry_delay,
            settings.retry_backoff,
            settings.retry_delay_max,
        ),
        expire_in_s=settings.expire_in.total_seconds(),
        singleton_key=None,
        dead_letter=settings.dead_letter,
        created_at=now,
        started_at=now,
        lease_expires_at=None,
    )
    try:
        output = await as_async(handler, threads=1, name=queue)(Job(claim))
        # As a worker does: a result it cannot store fails the run.
        encode_result(output, returned_by=returned_by(callable_name(handler), f"queue {queue!r}"))
    except Exception as exc:
        outcome = outcome_of(exc)
    else:
        return JobRun("completed", JobState.COMPLETED, output=output)
    if isinstance(outcome, Snoozed):
        return JobRun("snoozed", JobState.CREATED, retry_in=outcome.delay)
    if isinstance(outcome, Failed):
        step = after_failure(attempt, claim.policy, now, jitter, permanent=outcome.permanent)
        if step.state is JobState.FAILED:
            return JobRun("failed", JobState.FAILED, error=outcome.error)
        retry_in = None if step.start_after is None else step.start_after - now
        return JobRun("retried", JobState.RETRY, error=outcome.error, retry_in=retry_in)
    assert isinstance(outcome, Cancelled)  # outcome_of makes no other kind
    return JobRun("cancelled", JobState.CANCELLED, error=outcome.error)


# What each outcome of an item's run leaves as the item's status (ItemRun.status).
_ITEM_STATUS_AFTER: dict[str, ItemStatus] = {
    "completed": ItemStatus.COMPLETED,
    "retried": ItemStatus.PENDING,
    "error": ItemStatus.ERROR,
}


@dataclass(frozen=True, slots=True)
class ItemRun:
    """What the batch worker would make of one run of an item handler (see :func:`run_item`).

    ``outcome`` is ``completed`` (with ``result``), ``retried`` (the item goes
    back to ``pending``, to run again after ``retry_in``) or ``error`` (the
    item failed for good), the words of :class:`JobRun` and of the
    ``item_finished`` event. ``status`` is its deprecated spelling, the
    item's next status (``pending`` for a retried run).
    """

    outcome: Literal["completed", "retried", "error"]
    result: Any = None
    error: BaseException | None = None
    retry_in: timedelta | None = None

    @property
    def status(self) -> ItemStatus:
        """Deprecated: the item's next status; read ``outcome`` instead."""
        warn_renamed("ItemRun.status", "ItemRun.outcome ('retried' where it said 'pending')")
        return _ITEM_STATUS_AFTER[self.outcome]


async def run_item(
    kind: BatchKind,
    data: Any = None,
    *,
    params: Any = None,
    ref: str = "item-1",
    attempt: int = 1,
    clock: Clock = SYSTEM_CLOCK,
    jitter: Jitter = SYSTEM_JITTER,
) -> ItemRun:
    """Call a batch kind's handler with an item built from ``data``, in this task.

    ``kind`` is a declared kind (``app.kinds["extract_paper"]``). No database
    is involved (item, task and job ids are 0; ``item.heartbeat()`` returns
    True). The outcome follows the kind's rules: a permanent error (the
    kind's ``permanent`` types, its ``classify``, ``PermanentError``) or a
    failure of the last attempt is the outcome ``error``; another failure is
    ``retried``: the item goes back to ``pending`` with the kind's backoff.
    """
    last_attempt = kind.retry_limit + 1
    if not 1 <= attempt <= last_attempt:
        raise InvalidInput("attempt", f"must be within 1..{last_attempt}, got {attempt!r}")
    guarded = GuardedItem(
        id=ItemId(0),
        fence=attempt,
        run=attempt,
        ref=ref,
        data_json=json.dumps(data),
        task_id=TaskId("test"),
        kind=kind.name,
        params_json=json.dumps(params),
        max_attempts=last_attempt,
    )
    policy = RetryPolicy(
        kind.retry_limit, kind.retry_delay, kind.retry_backoff, JobOptions().retry_delay_max
    )
    now = clock.now()
    claim = ClaimedJob(
        id=JobId(0),
        queue=kind.name,
        data_json=json.dumps({"item": 0}),
        priority=0,
        attempt=attempt,
        policy=policy,
        expire_in_s=kind.expire_in.total_seconds(),
        singleton_key=None,
        dead_letter=None,
        created_at=now,
        started_at=now,
        lease_expires_at=None,
    )

    async def heartbeat(item: Item) -> bool:
        return True

    item = Item(guarded, Job(claim), heartbeat)
    try:
        result = await kind.handler(item)
        # As the item runner does: a result it cannot store fails the run.
        encode_result(
            result,
            returned_by=returned_by(callable_name(kind.handler), f"batch kind {kind.name!r}"),
        )
    except Exception as exc:
        if kind.is_permanent(exc) or attempt >= last_attempt:
            return ItemRun("error", error=exc)
        return ItemRun("retried", error=exc, retry_in=retry_delay(attempt, policy, jitter))
    return ItemRun("completed", result=result)


@dataclass(frozen=True, slots=True)
class DrainResult:
    """How the jobs :func:`drain` ran ended (a job retried and run again counts twice)."""

    completed: int = 0
    failed: int = 0
    retried: int = 0
    released: int = 0  # snoozed, or handed back
    lost: int = 0  # its fence had moved on (cancelled meanwhile)
    ran: int = 0  # handler runs, retries included


async def drain(
    client: Shoal,
    queue: str,
    handler: Handler,
    *,
    limit: int = DEFAULT_DRAIN_LIMIT,
) -> DrainResult:
    """Run the available jobs of ``queue`` through ``handler`` in this task, until none is left.

    Jobs are claimed, run one after the other and recorded exactly as a
    worker does (leases, fencing, retries per policy, the client's clock and
    hooks), so a retry that is due at once runs again in the same drain; one
    due later (``retry_delay``, ``start_after``, a snooze) waits until the
    test advances its clock and drains again. Raises AssertionError past
    ``limit`` jobs.

    >>> result = await drain(boss, "email", send_email)  # doctest: +SKIP
    >>> result.completed, result.failed                  # doctest: +SKIP
    (3, 0)
    """
    worker = Worker(
        client.store,
        queue,
        as_async(handler, threads=1, name=queue),
        handler_name=callable_name(handler),
        concurrency=1,
        batch_size=None,
        poll_interval=DEFAULT_POLL_INTERVAL,
        clock=client.clock,
        jitter=client.jitter,
        notifier=None,
        hooks=client.hooks,
    )
    ran = 0
    while claimed := await worker.run_inline():
        ran += claimed
        if ran > limit:
            raise AssertionError(f"drain({queue!r}) ran more than {limit} jobs; is one looping?")
    stats = worker.stats
    return DrainResult(
        completed=stats.completed,
        failed=stats.failed,
        retried=stats.retried,
        released=stats.released,
        lost=stats.lost,
        ran=ran,
    )
