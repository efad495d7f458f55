"""The decisions of creating and cancelling a task, shared by both batch clients.

:class:`~shoal.batch.service.Batches` (async) and
:class:`~shoal.batch.sync.SyncBatches` (sync) differ only in how they run
the statements of ``queries.sql``: what a request may be, what is written,
and what an answer found in the database means are decided here, once.

A create runs, in one transaction::

    set_lock_timeout(IDEMPOTENCY_WAIT)   -> the value before
    insert_task(plan.task)               -> a task id, or none when the key is taken
    set_lock_timeout(the value before)   (the caller's transaction keeps its own)
    none: task_by_key(key)               -> plan.existing(found): the task, or an error
    else: insert_items(plan.items, plan.item_jobs), notify(plan.task.item_queue)

and a lock timeout on the way is :func:`still_creating`. A task of more
than ``ITEMS_PER_DEADLINE`` items has its ``insert_items`` between
``raise_statement_timeout(create_deadline)`` and setting it back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from shoal.batch.inputs import (
    ParsedItems,
    canonical_uuid,
    check_idempotency_key,
    parse_items,
    positive_seconds,
    request_hash,
)
from shoal.batch.kinds import KindSettings
from shoal.batch.rows import NewTask, TaskRow
from shoal.batch.states import TaskId, TaskStatus
from shoal.batch.views import Created
from shoal.errors import (
    Conflict,
    IdempotencyMismatch,
    InvalidInput,
    NotFound,
    StillCreating,
    TransientError,
)
from shoal.queue.limits import Partitioner, partition_key_of
from shoal.queue.options import JobOptions, encode_payload
from shoal.queue.rows import JobSettings

T = TypeVar("T")

DEFAULT_MAX_ITEMS = 100_000
# How long a create waits for a concurrent identical create holding the same
# idempotency key before answering "still being created" (HTTP 409). The SQL
# function create_task_v3 waits as long (its SET lock_timeout).
IDEMPOTENCY_WAIT = timedelta(seconds=5)
LOCK_NOT_AVAILABLE = "55P03"


def find_kind(name: object, kinds: Mapping[str, T]) -> T:
    """The kind called ``name``; InvalidInput naming the known ones otherwise."""
    if not isinstance(name, str) or name not in kinds:
        known = ", ".join(sorted(kinds)) or "none registered"
        raise InvalidInput("kind", f"unknown batch kind {name!r}; known: {known}")
    return kinds[name]


def task_id_of(task_id: object) -> TaskId:
    """``task_id`` as the database spells it; NotFound when it cannot name a task."""
    canonical = canonical_uuid(task_id)
    if canonical is None:
        raise NotFound(f"task {task_id!r} does not exist")
    return TaskId(canonical)


@dataclass(frozen=True, slots=True)
class CreatePlan:
    """A validated create request: the task row, its items and their jobs' options.

    ``partition_keys`` holds each item's key as this process knows it (the
    one it named, or its kind's ``partition_by`` function's; empty when no
    item has one); ``partition_field`` is the field of each item's data the
    database reads the others' keys from (None: the kind has none).
    """

    task: NewTask
    items: ParsedItems
    item_jobs: JobSettings
    partition_keys: list[str | None]
    partition_field: str | None

    @classmethod
    def of(
        cls,
        kind: KindSettings,
        items: Sequence[str | Mapping[str, Any]],
        *,
        idempotency_key: str | None,
        params: Any,
        deadline: timedelta | float | None,
        max_items: int,
        max_payload_bytes: int,
        defaults: JobOptions,
        partitioner: Partitioner | None = None,
    ) -> CreatePlan:
        """Check a request (InvalidInput names the first bad field) and plan its writes.

        The checks run in this order, and ``create_task_v3`` in SQL checks in
        the same order: kind (the caller's :func:`find_kind`), idempotency
        key, deadline, items (their partition keys last), params.
        ``partitioner`` is the kind's ``partition_by`` function, given by a
        process that has the kind's code.
        """
        check_idempotency_key(idempotency_key)
        deadline_s = positive_seconds("deadline_s", deadline)
        parsed = parse_items(items, max_items=max_items, max_payload_bytes=max_payload_bytes)
        keys = item_partition_keys(kind, items, parsed, partitioner)
        params_text = encode_payload(params, max_bytes=max_payload_bytes, field="params")
        task = NewTask(
            kind=kind.name,
            idempotency_key=idempotency_key,
            request_hash=request_hash(kind.name, parsed, params_text, deadline_s),
            params=params_text,
            total=len(parsed),
            max_attempts=kind.max_attempts,
            zombie_timeout_s=kind.zombie_timeout_s,
            deadline_s=deadline_s,
            item_queue=kind.item_queue,
            job_options=kind.job_options,
            on_complete_queue=kind.on_complete_queue,
        )
        # Options of the item jobs, as dispatch_items sends them.
        item_jobs = JobSettings.of(kind.item_queue, defaults.merged(kind.job_options))
        field = None if kind.partition_function is not None else kind.partition_field
        return cls(task, parsed, item_jobs, keys, field)

    def existing(self, found: tuple[TaskId, str] | None) -> Created:
        """The answer when the idempotency key was taken: ``found`` is its (task, fingerprint)."""
        key = self.task.idempotency_key
        if found is None:  # pragma: no cover - the conflicting row was deleted
            raise StillCreating("idempotency_key: the task was removed; try again")
        if found[1] != self.task.request_hash:
            raise IdempotencyMismatch(
                f"idempotency_key {key!r} was used for a different request (task {found[0]})"
            )
        return Created(found[0], created=False)


def item_partition_keys(
    kind: KindSettings,
    items: Sequence[str | Mapping[str, Any]],
    parsed: ParsedItems,
    partitioner: Partitioner | None,
) -> list[str | None]:
    """Each item's partition key as this process can tell it (empty: none has one).

    The key an item named wins. Else, for a kind partitioned by a function,
    the function of the item's data (None for an item without): only a
    process with the kind's code has it, so elsewhere an item must name its
    key, and InvalidInput names the first that does not. A kind partitioned
    by a field leaves the others to the insert, which reads the field.
    """
    named = parsed.partition_keys
    if kind.partition_function is None:
        return named
    keys: list[str | None] = list(named) if named else [None] * len(parsed)
    for i, key in enumerate(keys):
        if key is not None:
            continue
        if partitioner is None:
            raise InvalidInput(
                f"items[{i}].partition_key",
                f"batch kind {kind.name!r} is partitioned by {kind.partition_function}, which "
                "runs only in a process with the kind's code (Batches of its App); give each "
                "item a partition_key",
            )
        entry = items[i]
        data = entry.get("data") if isinstance(entry, Mapping) else None
        try:
            found = partitioner(data)
        except Exception as exc:
            raise InvalidInput(
                f"items[{i}].data",
                f"the partition_by function of batch kind {kind.name!r} failed: {exc!r}",
            ) from exc
        keys[i] = partition_key_of(found, field=f"items[{i}].partition_key")
    return keys


# Items (with their jobs) one deadline covers in a create: 100,000, the
# default cap, take 1-4 s here, and up to 10 s on a machine busy with other
# work. A bigger task gets one deadline (and statement timeout) per 100,000:
# its items and jobs are still written by one statement, in one transaction.
ITEMS_PER_DEADLINE = 100_000


def create_deadline(base: timedelta, n_items: int) -> timedelta:
    """The deadline of a create of ``n_items``: ``base`` for each ``ITEMS_PER_DEADLINE``."""
    return base * max(1, -(-n_items // ITEMS_PER_DEADLINE))


def still_creating(
    exc: TransientError, idempotency_key: str | None
) -> StillCreating | TransientError:
    """``exc`` as the create's answer: a lock timeout on the key is StillCreating."""
    cause = exc.__cause__
    if getattr(cause, "sqlstate", None) == LOCK_NOT_AVAILABLE:
        return StillCreating(
            f"idempotency_key {idempotency_key!r}: an identical request is still being "
            "created; retry shortly"
        )
    return exc


def check_cancellable(task_id: TaskId, locked: TaskRow | None) -> TaskRow:
    """The locked task when it can be cancelled; Conflict when it has closed."""
    if locked is None:  # pragma: no cover - tasks are never deleted
        raise NotFound(f"task {task_id!r} does not exist")
    if locked.status is not TaskStatus.PROCESSING:
        raise Conflict(f"task {task_id} is already {locked.status}; nothing to cancel")
    return locked


__all__ = [
    "DEFAULT_MAX_ITEMS",
    "IDEMPOTENCY_WAIT",
    "CreatePlan",
    "check_cancellable",
    "create_deadline",
    "find_kind",
    "item_partition_keys",
    "still_creating",
    "task_id_of",
]
