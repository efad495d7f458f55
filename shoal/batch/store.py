"""The only code that runs the batch layer's SQL: one typed function per query."""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple, TypeVar

from psycopg.pq import TransactionStatus

from shoal.batch.kinds import KindSettings
from shoal.batch.states import ItemId, ItemStatus, TaskId, TaskOutcome, TaskStatus
from shoal.db.pool import AsyncConn, Database, translated
from shoal.db.queries import fetch_named, fetch_named_timed, int_array, load_queries, positions
from shoal.db.sync import SyncConn, SyncCursor, SyncDatabase
from shoal.queue.cursor import ItemPosition, item_order
from shoal.queue.results import encode_result
from shoal.queue.rows import ClaimedJob, JobSettings, claim_reader
from shoal.queue.states import JobId
from shoal.queue.store import cancel_channel

T = TypeVar("T")


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
def _guard_reader(columns: tuple[str, ...]) -> Callable[[Sequence[Any]], GuardedItem]:
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


def _task(row: Sequence[Any]) -> TaskRow:
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


def _counts(rows: Iterable[tuple[str, int]]) -> dict[ItemStatus, int]:
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


def _dispatch(row: Sequence[Any]) -> Dispatch:
    return Dispatch(ItemId(row[0]), row[1], ItemStatus(row[2]), row[3], row[4], row[5])


def _task_params(task: NewTask, now: datetime | None) -> dict[str, Any]:
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


def _items_params(
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


def _timeout_params(timeout: timedelta | str) -> dict[str, Any]:
    """The parameters of ``set_lock_timeout``: a duration, or a setting's text as read."""
    text = timeout if isinstance(timeout, str) else f"{int(timeout.total_seconds() * 1000)}ms"
    return {"timeout": text}


def _ms_params(wait: timedelta) -> dict[str, Any]:
    """The parameters of ``raise_statement_timeout``."""
    return {"ms": int(wait.total_seconds() * 1000)}


def _kinds_params(kinds: Sequence[KindSettings], now: datetime | None) -> dict[str, Any]:
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


def _kind_settings(row: Sequence[Any]) -> KindSettings:
    return KindSettings(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7])


class BatchStore:
    """Typed access to the batch tables of one schema."""

    def __init__(self, db: Database, *, holder: Callable[[], int | None] = lambda: None) -> None:
        self.db = db
        self.sql = load_queries("shoal.batch", db.schema)
        self.cancel_channel = cancel_channel(db.schema)
        # This process's registry number, recorded on each item it guards (the
        # reaper names the process); None before the row is written, or with
        # no registry row. Read at each guard and claim.
        self.holder = holder

    async def _rows(
        self, name: str, params: Mapping[str, Any], conn: AsyncConn | None = None
    ) -> list[tuple[Any, ...]]:
        return await self.db.fetch(self.sql[name], params, conn)

    async def _count(self, name: str, params: Mapping[str, Any], conn: AsyncConn) -> int:
        with translated():
            cur = await conn.execute(self.sql[name], params)
            return cur.rowcount

    # -- creation (inside the caller's transaction) -------------------------

    async def insert_task(
        self, conn: AsyncConn, task: NewTask, *, now: datetime | None
    ) -> TaskId | None:
        rows = await self._rows("insert_task", _task_params(task, now), conn)
        return TaskId(rows[0][0]) if rows else None

    async def set_lock_timeout(self, conn: AsyncConn, wait: timedelta | str) -> str:
        """Set this transaction's lock_timeout; returns the one before (to set it back)."""
        rows = await self._rows("set_lock_timeout", _timeout_params(wait), conn)
        return str(rows[0][0])

    async def raise_statement_timeout(self, conn: AsyncConn, wait: timedelta) -> str:
        """Raise this transaction's statement_timeout to ``wait`` (never lower it);
        returns the one before, for :meth:`set_statement_timeout`."""
        rows = await self._rows("raise_statement_timeout", _ms_params(wait), conn)
        return str(rows[0][0])

    async def set_statement_timeout(self, conn: AsyncConn, setting: str) -> None:
        await self._rows("set_statement_timeout", {"timeout": setting}, conn)

    async def task_by_key(self, conn: AsyncConn, key: str) -> tuple[TaskId, str] | None:
        rows = await self._rows("task_by_key", {"idempotency_key": key}, conn)
        return (TaskId(rows[0][0]), rows[0][1]) if rows else None

    async def insert_items(
        self,
        conn: AsyncConn,
        task_id: TaskId,
        refs: Sequence[str],
        data: Sequence[str | None],
        *,
        jobs: JobSettings,
        keys: ItemKeys = NO_KEYS,
        now: datetime | None,
    ) -> int:
        """Insert the task's items, in input order, and one job per item; returns how many.

        ``data`` holds each item's JSON text, None for null; it may be empty
        when every item's data is null. Each item is keyed by ``keys``, and
        its job carries its key.
        """
        params = _items_params(task_id, refs, data, jobs, keys, now)
        rows = await self._rows("insert_items", params, conn)
        return int(rows[0][0])

    async def kinds(self) -> dict[str, KindSettings]:
        """The kinds workers stored, by name (as :meth:`SyncBatchStore.kinds`)."""
        return {row[0]: _kind_settings(row) for row in await self._rows("get_kinds", {})}

    async def put_kinds(self, kinds: Sequence[KindSettings], *, now: datetime | None) -> None:
        """Store these kinds' settings for creators without their code (a worker's start)."""
        if not kinds:
            return
        await self._rows("put_kinds", _kinds_params(kinds, now))

    # -- the worker's edges --------------------------------------------------

    async def guard_items(
        self, ids: Sequence[ItemId], *, now: datetime | None
    ) -> dict[ItemId, GuardedItem]:
        """pending -> running for each id; the ones that passed (absent = phantom)."""
        query = self.sql["guard_items"]
        params = {"ids": list(ids), "now": now, "holder": self.holder()}
        columns, rows = await self.db.run(
            lambda c: fetch_named(c, query, params), transaction=False
        )
        read = _guard_reader(columns)
        return {item.id: item for item in map(read, rows)}

    async def claim_items(
        self, queue: str, limit: int, *, now: datetime | None, after: ItemPosition | None = None
    ) -> ClaimedItems:
        """Claim up to ``limit`` item jobs of ``queue`` and guard their items, in one statement.

        From the head of the queue's item jobs, or with ``after`` (a
        ``(priority, turn, id)`` position, shoal.queue.cursor) only those the
        queue's ``lock_item_jobs_v2`` finds after it. Each claimed job comes
        with its item as the guard left it running, or None for a phantom
        (already running, finished or cancelled). Committed without waiting
        for its WAL flush, like a plain claim.
        """
        query = self.sql["claim_items"]
        after_priority, after_turn, after_id = after if after is not None else (None, None, None)
        params = {
            "queue": queue,
            "limit": limit,
            "now": now,
            "after_priority": after_priority,
            "after_turn": after_turn,
            "after_id": after_id,
            "holder": self.holder(),
        }
        columns, rows, cost_s = await self.db.run(
            lambda c: fetch_named_timed(c, query, params), transaction=False
        )
        job, item = claim_reader(columns), _guard_reader(columns)
        # A phantom's guard columns are all NULL.
        passed = columns.index("item_id")
        turn = columns.index("turn")
        claimed = [(job(r), None if r[passed] is None else item(r)) for r in rows]
        turned = [
            (j.priority, r[turn], j.id)
            for (j, _), r in zip(claimed, rows, strict=True)
            if r[turn] is not None
        ]
        return ClaimedItems(claimed, max(turned, key=item_order) if turned else None, cost_s)

    async def record_items(
        self,
        conn: AsyncConn,
        done: Sequence[tuple[ItemId, int, str | None]],
        jobs: Sequence[tuple[JobId, int]] = (),
        *,
        now: datetime | None,
    ) -> CompletedItems:
        """running -> completed for (id, fence, result), and complete (job id, attempt).

        Each result is JSON text (:func:`~shoal.queue.results.encode_result`) or None.

        One statement: the items' results and their jobs commit together.
        ``items`` of the result also holds items this same run had recorded
        before (a write retried after a lost acknowledgement), found by a
        second statement only when some item lost its fence.
        """
        done = sorted(done, key=by_item)
        rows = await self._rows(
            "complete_items",
            {
                "ids": int_array(d[0] for d in done),
                "attempts": int_array(d[1] for d in done),
                # Mostly None (no-op handlers, or results kept elsewhere):
                # an empty array leaves every result NULL, i.e. JSON null.
                "results": ([d[2] for d in done] if any(d[2] is not None for d in done) else []),
                "job_ids": int_array(j[0] for j in jobs),
                "job_attempts": int_array(j[1] for j in jobs),
                "now": now,
            },
            conn,
        )
        items, job_ids, tasks = set(), set(), []
        for what, id_, task_id in rows:
            if what == "item":
                items.add(ItemId(id_))
            elif what == "job":
                job_ids.add(JobId(id_))
            else:
                tasks.append(TaskId(task_id))
        if len(items) < len(done):
            lost = [d for d in done if d[0] not in items]
            before = await self._rows(
                "completed_items",
                {"ids": [d[0] for d in lost], "attempts": [d[1] for d in lost]},
                conn,
            )
            items.update(ItemId(r[0]) for r in before)
        return CompletedItems(items, job_ids, tasks)

    async def complete_items(
        self, done: Sequence[tuple[ItemId, int, Any]], *, now: datetime | None
    ) -> set[ItemId]:
        """running -> completed for (id, fence, result); the ids that won their fence.

        Raises :class:`~shoal.queue.results.UnstorableResult` for a result
        that cannot be stored, before anything is written.
        """
        encoded = [(item_id, fence, encode_result(result)) for item_id, fence, result in done]

        async def run(c: AsyncConn) -> set[ItemId]:
            return (await self.record_items(c, encoded, now=now)).items

        return await self.db.run(run, transaction=False)

    async def finished_tasks(self, conn: AsyncConn, task_ids: Sequence[TaskId]) -> list[TaskId]:
        rows = await self._rows("finished_tasks", {"task_ids": list(task_ids)}, conn)
        return [TaskId(r[0]) for r in rows]

    async def fail_item(
        self,
        item_id: ItemId,
        fence: int,
        *,
        status: ItemStatus,
        message: str,
        entry: Mapping[str, Any],
        now: datetime | None,
        conn: AsyncConn | None = None,
    ) -> FailedRun | None:
        """running -> ``status`` (error or pending), fenced; None when the fence failed."""
        rows = await self._rows(
            "fail_item",
            {
                "item_id": item_id,
                "attempt": fence,
                "status": status.value,
                "message": message,
                "entry": json.dumps(dict(entry)),
                "now": now,
            },
            conn,
        )
        return FailedRun(rows[0][1]) if rows else None

    async def hand_back_items(
        self,
        conn: AsyncConn,
        held: Sequence[tuple[ItemId, int]],
        *,
        message: str,
        now: datetime | None,
    ) -> list[Dispatch]:
        """running -> pending for (id, fence) never started; the items handed back."""
        rows = await self._rows(
            "hand_back_items",
            {
                "ids": [h[0] for h in held],
                "attempts": [h[1] for h in held],
                "message": message,
                "now": now,
            },
            conn,
        )
        return [_dispatch(r) for r in rows]

    async def heartbeat_items(
        self, held: Sequence[tuple[ItemId, int]], *, now: datetime | None
    ) -> set[ItemId]:
        if not held:
            return set()
        held = sorted(held)  # lock order: see by_item
        rows = await self._rows(
            "heartbeat_items",
            {"ids": [h[0] for h in held], "attempts": [h[1] for h in held], "now": now},
        )
        return {ItemId(r[0]) for r in rows}

    async def count_event(self, name: str, n: int = 1, conn: AsyncConn | None = None) -> None:
        await self._rows("count_event", {"name": name, "n": n}, conn)

    async def count_skip(self, item_id: ItemId, *, phantom: str, cancelled: str) -> str:
        """Count a delivery the guard turned away under ``cancelled`` when its item
        is cancelled, else under ``phantom``; returns the name counted."""
        rows = await self._rows(
            "count_skip", {"item": item_id, "phantom": phantom, "cancelled": cancelled}
        )
        return str(rows[0][0])

    # -- the aggregator (inside its transactions) ----------------------------

    async def expire_deadlines(self, conn: AsyncConn, *, now: datetime | None) -> list[TaskId]:
        return [TaskId(r[0]) for r in await self._rows("expire_deadlines", {"now": now}, conn)]

    async def cancel_pending_items(
        self, conn: AsyncConn, task_ids: Sequence[TaskId], *, now: datetime | None
    ) -> int:
        return await self._count(
            "cancel_pending_items", {"task_ids": list(task_ids), "now": now}, conn
        )

    async def cancel_running_items(
        self, conn: AsyncConn, task_ids: Sequence[TaskId], *, now: datetime | None
    ) -> int:
        """Cancel the running items of stopped tasks; their processes are told on commit."""
        params = {"task_ids": list(task_ids), "channel": self.cancel_channel, "now": now}
        rows = await self._rows("cancel_running_items", params, conn)
        return int(rows[0][0])

    async def cancelled_items(self, runs: Sequence[tuple[ItemId, int]]) -> set[ItemId]:
        """Which of these runs (item id, fence) had their item cancelled."""
        if not runs:
            return set()
        params = {"ids": [r[0] for r in runs], "attempts": [r[1] for r in runs]}
        return {ItemId(r[0]) for r in await self._rows("cancelled_items", params)}

    async def reap_zombies(
        self, conn: AsyncConn, *, limit: int, now: datetime | None
    ) -> list[Dispatch]:
        rows = await self._rows("reap_zombies", {"limit": limit, "now": now}, conn)
        return [_dispatch(r) for r in rows]

    async def sweep_orphans(
        self, conn: AsyncConn, *, limit: int, now: datetime | None
    ) -> list[Dispatch]:
        rows = await self._rows("sweep_orphans", {"limit": limit, "now": now}, conn)
        return [_dispatch(r) for r in rows]

    async def close_tasks(
        self, conn: AsyncConn, *, limit: int, now: datetime | None
    ) -> list[ClosedTask]:
        rows = await self._rows("close_tasks", {"limit": limit, "now": now}, conn)
        return [
            ClosedTask(TaskId(r[0]), r[1], TaskOutcome(r[2]), r[3], r[4], r[5], r[6], r[7])
            for r in rows
        ]

    # -- control (inside the caller's transaction) ---------------------------

    async def lock_task(self, conn: AsyncConn, task_id: TaskId) -> TaskRow | None:
        rows = await self._rows("lock_task", {"task_id": task_id}, conn)
        if not rows:
            return None
        return await self.get_task(task_id, conn)

    async def request_cancel(
        self, conn: AsyncConn, task_id: TaskId, reason: TaskOutcome, *, now: datetime | None
    ) -> bool:
        rows = await self._rows(
            "request_cancel", {"task_id": task_id, "reason": reason.value, "now": now}, conn
        )
        return bool(rows)

    async def reopen_failed_items(
        self, conn: AsyncConn, task_id: TaskId, *, now: datetime | None
    ) -> list[Dispatch]:
        rows = await self._rows("reopen_failed_items", {"task_id": task_id, "now": now}, conn)
        return [_dispatch(r) for r in rows]

    async def reopen_task(self, conn: AsyncConn, task_id: TaskId) -> bool:
        return await self._count("reopen_task", {"task_id": task_id}, conn) > 0

    # -- reading ---------------------------------------------------------------

    async def get_task(self, task_id: TaskId, conn: AsyncConn | None = None) -> TaskRow | None:
        rows = await self._rows("get_task", {"task_id": task_id}, conn)
        return _task(rows[0]) if rows else None

    async def list_tasks(
        self,
        *,
        status: TaskStatus | None,
        before: tuple[datetime, TaskId] | None,
        limit: int,
        kind: str | None = None,
    ) -> list[TaskRow]:
        rows = await self._rows(
            "list_tasks",
            {
                "status": None if status is None else status.value,
                "kind": kind,
                "before_created": None if before is None else before[0],
                "before_id": None if before is None else before[1],
                "limit": limit,
            },
        )
        return [_task(r) for r in rows]

    async def progress(self, task_id: TaskId) -> dict[ItemStatus, int]:
        """The task's items by status, but for completed ones: they are the rest of its total.

        Running means a handler is running it: items claimed by a worker and
        still waiting for a handler are counted as pending.
        """
        rows = await self._rows("progress", {"task_id": task_id})
        return _counts((r[0], r[1]) for r in rows)

    async def progress_many(
        self, task_ids: Sequence[TaskId]
    ) -> dict[TaskId, dict[ItemStatus, int]]:
        rows = await self._rows("progress_many", {"task_ids": list(task_ids)})
        found: dict[TaskId, list[tuple[str, int]]] = {}
        for task_id, status, count in rows:
            found.setdefault(TaskId(task_id), []).append((status, count))
        return {task_id: _counts(counts) for task_id, counts in found.items()}

    async def mark_handlers(
        self, marks: Sequence[tuple[ItemId, int, bool]], *, conn: AsyncConn | None = None
    ) -> set[ItemId]:
        """Set (True) or clear (False) running items' in-handler mark, fenced by attempt."""
        marks = sorted(marks)  # lock order: see by_item
        rows = await self._rows(
            "mark_handlers",
            {
                "ids": [m[0] for m in marks],
                "attempts": [m[1] for m in marks],
                "on": [m[2] for m in marks],
            },
            conn,
        )
        return {ItemId(r[0]) for r in rows}

    async def list_items(
        self,
        task_id: TaskId,
        *,
        status: ItemStatus | None,
        after_id: int,
        limit: int,
        ref: str | None = None,
    ) -> list[ItemRow]:
        rows = await self._rows(
            "list_items" if ref is None else "search_items",
            {
                "task_id": task_id,
                "status": None if status is None else status.value,
                "ref": ref,
                "after_id": after_id,
                "limit": limit,
            },
        )
        return [
            ItemRow(
                ItemId(r[0]),
                r[1],
                ItemStatus(r[2]),
                r[3],
                r[4],
                r[5],
                r[6],
                tuple(r[7]),
                r[8],
                r[9],
                r[10],
            )
            for r in rows
        ]

    async def counters(self) -> dict[str, int]:
        return {r[0]: r[1] for r in await self._rows("counters", {})}

    async def items_by_status(self) -> list[tuple[str, ItemStatus, int]]:
        rows = await self._rows("items_by_status", {})
        return [(r[0], ItemStatus(r[1]), r[2]) for r in rows]

    async def completion_latencies(self, *, limit: int) -> list[tuple[str, float]]:
        rows = await self._rows("completion_latencies", {"limit": limit})
        return [(r[0], r[1]) for r in rows]


class SyncBatchStore:
    """The statements :class:`~shoal.batch.sync.SyncBatches` runs, from the same ``queries.sql``.

    Its methods run on a cursor of :meth:`run`'s transaction: the caller's
    (``conn``), or a pooled connection's committed when ``work`` returns.
    """

    def __init__(self, db: SyncDatabase) -> None:
        self.db = db
        self.sql = load_queries("shoal.batch", db.schema)
        self.cancel_channel = cancel_channel(db.schema)

    def run(self, conn: SyncConn | None, work: Callable[[SyncCursor], T]) -> T:
        """``work`` in one transaction: the caller's when ``conn`` is in one, as a
        savepoint (an error undoes only ``work``, and the caller's transaction
        goes on); a transaction of its own on an autocommit ``conn``, or on a
        pooled connection when there is none, committed when ``work`` returns.

        A ``conn`` that is neither (not autocommit, idle: Django's inside
        ``atomic()`` before its first query) starts its transaction with
        ``work``'s first statement and keeps it open for the caller to commit.
        """
        if conn is None:
            return self.db.on(None, work)
        idle = conn.info.transaction_status == TransactionStatus.IDLE
        if idle and not conn.autocommit:
            return self.db.on(conn, work)
        with translated(), conn.transaction():
            return self.db.on(conn, work)

    def _rows(self, cur: SyncCursor, name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        cur.execute(self.sql[name], params)
        return cur.fetchall() if cur.description is not None else []

    def kinds(self, cur: SyncCursor) -> dict[str, KindSettings]:
        """The kinds workers stored, by name."""
        return {row[0]: _kind_settings(row) for row in self._rows(cur, "get_kinds", {})}

    def put_kinds(
        self, cur: SyncCursor, kinds: Sequence[KindSettings], *, now: datetime | None
    ) -> None:
        """As :meth:`BatchStore.put_kinds`."""
        if kinds:
            self._rows(cur, "put_kinds", _kinds_params(kinds, now))

    def set_lock_timeout(self, cur: SyncCursor, wait: timedelta | str) -> str:
        return str(self._rows(cur, "set_lock_timeout", _timeout_params(wait))[0][0])

    def raise_statement_timeout(self, cur: SyncCursor, wait: timedelta) -> str:
        return str(self._rows(cur, "raise_statement_timeout", _ms_params(wait))[0][0])

    def set_statement_timeout(self, cur: SyncCursor, setting: str) -> None:
        self._rows(cur, "set_statement_timeout", {"timeout": setting})

    def insert_task(self, cur: SyncCursor, task: NewTask, *, now: datetime | None) -> TaskId | None:
        rows = self._rows(cur, "insert_task", _task_params(task, now))
        return TaskId(rows[0][0]) if rows else None

    def task_by_key(self, cur: SyncCursor, key: str) -> tuple[TaskId, str] | None:
        rows = self._rows(cur, "task_by_key", {"idempotency_key": key})
        return (TaskId(rows[0][0]), rows[0][1]) if rows else None

    def insert_items(
        self,
        cur: SyncCursor,
        task_id: TaskId,
        refs: Sequence[str],
        data: Sequence[str | None],
        *,
        jobs: JobSettings,
        keys: ItemKeys = NO_KEYS,
        now: datetime | None,
    ) -> int:
        """As :meth:`BatchStore.insert_items`."""
        params = _items_params(task_id, refs, data, jobs, keys, now)
        rows = self._rows(cur, "insert_items", params)
        return int(rows[0][0])

    def get_task(self, cur: SyncCursor, task_id: TaskId) -> TaskRow | None:
        rows = self._rows(cur, "get_task", {"task_id": task_id})
        return _task(rows[0]) if rows else None

    def progress(self, cur: SyncCursor, task_id: TaskId) -> dict[ItemStatus, int]:
        """As :meth:`BatchStore.progress`."""
        return _counts((r[0], r[1]) for r in self._rows(cur, "progress", {"task_id": task_id}))

    def lock_task(self, cur: SyncCursor, task_id: TaskId) -> TaskRow | None:
        if not self._rows(cur, "lock_task", {"task_id": task_id}):
            return None
        return self.get_task(cur, task_id)

    def request_cancel(
        self, cur: SyncCursor, task_id: TaskId, reason: TaskOutcome, *, now: datetime | None
    ) -> bool:
        params = {"task_id": task_id, "reason": reason.value, "now": now}
        return bool(self._rows(cur, "request_cancel", params))

    def cancel_pending_items(
        self, cur: SyncCursor, task_ids: Sequence[TaskId], *, now: datetime | None
    ) -> int:
        cur.execute(self.sql["cancel_pending_items"], {"task_ids": list(task_ids), "now": now})
        return cur.rowcount

    def cancel_running_items(
        self, cur: SyncCursor, task_ids: Sequence[TaskId], *, now: datetime | None
    ) -> int:
        """As :meth:`BatchStore.cancel_running_items`."""
        params = {"task_ids": list(task_ids), "channel": self.cancel_channel, "now": now}
        return int(self._rows(cur, "cancel_running_items", params)[0][0])
