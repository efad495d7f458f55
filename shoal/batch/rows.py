"""The batch layer's rows as Python sees them: what its stores' statements take and return.

Plain values, and the readers and parameter builders both stores share. No
SQL runs here: the stores (:mod:`shoal.batch.store`,
:mod:`shoal.batch.sync_store`) run it.
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from shoal.batch.kinds import KindSettings
from shoal.batch.states import ItemId, ItemStatus, TaskId, TaskOutcome, TaskStatus
from shoal.db.queries import positions
from shoal.queue.cursor import ItemPosition
from shoal.queue.rows import ClaimedJob, JobSettings
from shoal.queue.states import JobId


@dataclass(frozen=True, slots=True)
class NewTask:
    kind: str
    idempotency_key: str | None
    request_hash: str
    params: str  # JSON text
    total: int
    max_attempts: int
    zombie_timeout_s: float
    deadline_s: float | None
    item_queue: str
    job_options: Mapping[str, Any]
    on_complete_queue: str | None


class GuardedItem(NamedTuple):
    """An item that passed the phantom guard: now running under ``fence``.

    A NamedTuple, as ClaimedJob is: one is made for every item run, where a
    tuple is several times cheaper to make than a frozen dataclass. Its data
    and its task's params stay JSON text until someone reads them.
    """

    id: ItemId
    fence: int  # the fencing token: the item row's attempt column (monotonic)
    run: int  # runs since the item was (re)opened; bounded by max_attempts
    ref: str
    data_json: str
    task_id: TaskId
    kind: str
    params_json: str
    max_attempts: int

    @property
    def data(self) -> Any:
        return json.loads(self.data_json)

    @property
    def params(self) -> Any:
        return json.loads(self.params_json)


# The guard columns, by name, in GuardedItem's order: the rows of guard_items
# and the item half of each claim_items row (queries.sql).
GUARD_COLUMNS = (
    "item_id",
    "fence",
    "run",
    "ref",
    "item_data",
    "task_id",
    "kind",
    "params",
    "max_attempts",
)


@functools.lru_cache(maxsize=16)
def guard_reader(columns: tuple[str, ...]) -> Callable[[Sequence[Any]], GuardedItem]:
    """Reads a GuardedItem from a row of a statement with these column names."""
    pick = operator.itemgetter(*positions(columns, GUARD_COLUMNS, what="a guard"))
    return lambda row: GuardedItem._make(pick(row))


@dataclass(frozen=True, slots=True)
class ClaimedItems:
    """What one ``claim_items`` statement took."""

    # Each job taken, with its item as the guard left it (None: a phantom).
    jobs: list[tuple[ClaimedJob, GuardedItem | None]]
    # The position of the last job with a turn taken, in job_item_turn's
    # order (None: none had a turn).
    last: ItemPosition | None
    # Seconds the statement took on its connection, without the wait for one
    # from the pool (shoal.db.queries.fetch_named_timed).
    cost_s: float


@dataclass(frozen=True, slots=True)
class CompletedItems:
    """What one ``complete_items`` statement recorded."""

    items: set[ItemId]  # items whose result is recorded (now, or by this run before)
    jobs: set[JobId]  # jobs completed now (not those completed before)
    finished_tasks: list[TaskId]  # tasks left with nothing pending or running
    # Tasks with nothing pending whose only items left were running in
    # another statement: asked again once this write has committed.
    tail_tasks: list[TaskId] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Dispatch:
    """An item that needs a job: its queue, options, current fence and partition key."""

    id: ItemId
    fence: int  # the item row's attempt column; its jobs' singleton key names it
    status: ItemStatus
    queue: str
    job_options: Mapping[str, Any]
    # The item's key (item.partition_key), which each of its jobs carries;
    # None when its kind was not partitioned and it named none.
    partition_key: str | None = None


@dataclass(frozen=True, slots=True)
class FailedRun:
    """A failed run recorded (``fail_item``): what a new job of its item needs."""

    partition_key: str | None


@dataclass(frozen=True, slots=True)
class ClosedTask:
    id: TaskId
    kind: str
    outcome: TaskOutcome
    on_complete_queue: str | None
    params: Any
    created_at: datetime
    completed_at: datetime
    last_item_at: datetime | None


@dataclass(frozen=True, slots=True)
class TaskRow:
    id: TaskId
    kind: str
    status: TaskStatus
    outcome: TaskOutcome | None
    params: Any
    total: int
    created_at: datetime
    completed_at: datetime | None
    deadline_at: datetime | None
    cancel_reason: TaskOutcome | None
    last_item_at: datetime | None
    item_queue: str


@dataclass(frozen=True, slots=True)
class ItemRow:
    id: ItemId
    ref: str
    status: ItemStatus
    attempts: int
    data: Any
    result: Any
    error: str | None
    errors: tuple[Mapping[str, Any], ...]
    started_at: datetime | None
    updated_at: datetime
    finished_at: datetime | None


def by_item(entry: tuple[ItemId, int, Any]) -> ItemId:
    """The key that orders the rows of a statement that updates many items.

    A worker's result writes, heartbeats and in-handler marks update the same
    running items from different connections at once; each takes its rows'
    locks in the order it is given them (one primary-key probe per entry).
    Given in claim or completion order, two of them could take two items in
    opposite orders and deadlock (seen: "recording 500 outcomes failed
    (DeadlockDetected)" in a soak). In item id order, they never do.
    """
    return entry[0]


def task_row(row: Sequence[Any]) -> TaskRow:
    return TaskRow(
        id=TaskId(row[0]),
        kind=row[1],
        status=TaskStatus(row[2]),
        outcome=None if row[3] is None else TaskOutcome(row[3]),
        params=row[4],
        total=row[5],
        created_at=row[6],
        completed_at=row[7],
        deadline_at=row[8],
        cancel_reason=None if row[9] is None else TaskOutcome(row[9]),
        last_item_at=row[10],
        item_queue=row[11],
    )


def status_counts(rows: Iterable[tuple[str, int]]) -> dict[ItemStatus, int]:
    """Counts by status from progress rows; 'waiting' (running, no handler yet) is pending."""
    counts: dict[ItemStatus, int] = {}
    waiting = 0
    for status, count in rows:
        if status == "waiting":
            waiting = count
        else:
            counts[ItemStatus(status)] = count
    if waiting:
        counts[ItemStatus.RUNNING] = counts.get(ItemStatus.RUNNING, 0) - waiting
        counts[ItemStatus.PENDING] = counts.get(ItemStatus.PENDING, 0) + waiting
    return counts


def dispatch_row(row: Sequence[Any]) -> Dispatch:
    return Dispatch(ItemId(row[0]), row[1], ItemStatus(row[2]), row[3], row[4], row[5])


def task_params(task: NewTask, now: datetime | None) -> dict[str, Any]:
    """The parameters of ``insert_task``."""
    return {
        "kind": task.kind,
        "idempotency_key": task.idempotency_key,
        "request_hash": task.request_hash,
        "params": task.params,
        "total": task.total,
        "max_attempts": task.max_attempts,
        "zombie_timeout_s": task.zombie_timeout_s,
        "deadline_s": task.deadline_s,
        "item_queue": task.item_queue,
        "job_options": json.dumps(dict(task.job_options)),
        "on_complete_queue": task.on_complete_queue,
        "now": now,
    }


@dataclass(frozen=True, slots=True)
class ItemKeys:
    """How ``insert_items`` keys a task's items (see ``CreatePlan``).

    ``named``: each item's key as the creator knows it (empty: none);
    ``field``: the field of each item's data that keys the others (None: none).
    """

    named: Sequence[str | None] = ()
    field: str | None = None


NO_KEYS = ItemKeys()


def items_params(
    task_id: TaskId,
    refs: Sequence[str],
    data: Sequence[str | None],
    jobs: JobSettings,
    keys: ItemKeys,
    now: datetime | None,
) -> dict[str, Any]:
    """The parameters of ``insert_items``."""
    params: dict[str, Any] = jobs.params()
    params.update(
        task_id=task_id,
        refs=refs,
        data=data,
        partition_keys=list(keys.named),
        partition_field=keys.field,
        keyed=bool(keys.named) or keys.field is not None,
        now=now,
    )
    return params


def timeout_params(timeout: timedelta | str) -> dict[str, Any]:
    """The parameters of ``set_lock_timeout``: a duration, or a setting's text as read."""
    text = timeout if isinstance(timeout, str) else f"{int(timeout.total_seconds() * 1000)}ms"
    return {"timeout": text}


def ms_params(wait: timedelta) -> dict[str, Any]:
    """The parameters of ``raise_statement_timeout``."""
    return {"ms": int(wait.total_seconds() * 1000)}


def kinds_params(kinds: Sequence[KindSettings], now: datetime | None) -> dict[str, Any]:
    """The parameters of ``put_kinds``."""
    return {
        "kinds": [k.name for k in kinds],
        "max_attempts": [k.max_attempts for k in kinds],
        "zombie_timeout_s": [k.zombie_timeout_s for k in kinds],
        "item_queues": [k.item_queue for k in kinds],
        "job_options": [json.dumps(dict(k.job_options)) for k in kinds],
        "on_complete_queues": [k.on_complete_queue for k in kinds],
        "partition_fields": [k.partition_field for k in kinds],
        "partition_functions": [k.partition_function for k in kinds],
        "now": now,
    }


def kind_settings(row: Sequence[Any]) -> KindSettings:
    return KindSettings(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7])
