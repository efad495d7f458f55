"""The only code that runs the batch layer's SQL from async code: one typed function per query.

The rows its statements take and return are in :mod:`shoal.batch.rows`; the
statements synchronous code runs, in :mod:`shoal.batch.sync_store`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from shoal.batch.kinds import KindSettings
from shoal.batch.rows import (
    NO_KEYS,
    ClaimedItems,
    ClosedTask,
    CompletedItems,
    Dispatch,
    FailedRun,
    GuardedItem,
    ItemKeys,
    ItemRow,
    NewTask,
    TaskRow,
    by_item,
    dispatch_row,
    guard_reader,
    items_params,
    kind_settings,
    kinds_params,
    ms_params,
    status_counts,
    task_params,
    task_row,
    timeout_params,
)
from shoal.batch.states import ItemId, ItemStatus, TaskId, TaskOutcome, TaskStatus
from shoal.db.pool import AsyncConn, Database, translated
from shoal.db.queries import fetch_named, fetch_named_timed, int_array, load_queries
from shoal.queue.cursor import ItemPosition, item_order
from shoal.queue.results import encode_result
from shoal.queue.rows import JobSettings, claim_reader
from shoal.queue.states import JobId
from shoal.queue.store import cancel_channel


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
        rows = await self._rows("insert_task", task_params(task, now), conn)
        return TaskId(rows[0][0]) if rows else None

    async def set_lock_timeout(self, conn: AsyncConn, wait: timedelta | str) -> str:
        """Set this transaction's lock_timeout; returns the one before (to set it back)."""
        rows = await self._rows("set_lock_timeout", timeout_params(wait), conn)
        return str(rows[0][0])

    async def raise_statement_timeout(self, conn: AsyncConn, wait: timedelta) -> str:
        """Raise this transaction's statement_timeout to ``wait`` (never lower it);
        returns the one before, for :meth:`set_statement_timeout`."""
        rows = await self._rows("raise_statement_timeout", ms_params(wait), conn)
        return str(rows[0][0])

    async def set_statement_timeout(self, conn: AsyncConn, setting: str) -> None:
        await self._rows("set_statement_timeout", {"timeout": setting}, conn)

    async def analyze_items(self) -> None:
        """ANALYZE the item table (its own statement, outside any transaction of a create)."""
        await self._rows("analyze_items", {})

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
        params = items_params(task_id, refs, data, jobs, keys, now)
        rows = await self._rows("insert_items", params, conn)
        return int(rows[0][0])

    async def kinds(self) -> dict[str, KindSettings]:
        """The kinds workers stored, by name (as :meth:`SyncBatchStore.kinds`)."""
        return {row[0]: kind_settings(row) for row in await self._rows("get_kinds", {})}

    async def put_kinds(self, kinds: Sequence[KindSettings], *, now: datetime | None) -> None:
        """Store these kinds' settings for creators without their code (a worker's start)."""
        if not kinds:
            return
        await self._rows("put_kinds", kinds_params(kinds, now))

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
        read = guard_reader(columns)
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
        job, item = claim_reader(columns), guard_reader(columns)
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
        items, job_ids, tasks, tails = set(), set(), [], []
        for what, id_, task_id in rows:
            if what == "item":
                items.add(ItemId(id_))
            elif what == "job":
                job_ids.add(JobId(id_))
            elif what == "tail":
                tails.append(TaskId(task_id))
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
        return CompletedItems(items, job_ids, tasks, tails)

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
        note_type: str = "Interrupted",
    ) -> list[Dispatch]:
        """running -> pending for (id, fence), no attempt spent; the items handed back."""
        rows = await self._rows(
            "hand_back_items",
            {
                "ids": [h[0] for h in held],
                "attempts": [h[1] for h in held],
                "message": message,
                "type": note_type,
                "now": now,
            },
            conn,
        )
        return [dispatch_row(r) for r in rows]

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
        return [dispatch_row(r) for r in rows]

    async def sweep_orphans(
        self, conn: AsyncConn, *, limit: int, now: datetime | None
    ) -> list[Dispatch]:
        rows = await self._rows("sweep_orphans", {"limit": limit, "now": now}, conn)
        return [dispatch_row(r) for r in rows]

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
        return [dispatch_row(r) for r in rows]

    async def reopen_task(self, conn: AsyncConn, task_id: TaskId) -> bool:
        return await self._count("reopen_task", {"task_id": task_id}, conn) > 0

    # -- reading ---------------------------------------------------------------

    async def get_task(self, task_id: TaskId, conn: AsyncConn | None = None) -> TaskRow | None:
        rows = await self._rows("get_task", {"task_id": task_id}, conn)
        return task_row(rows[0]) if rows else None

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
        return [task_row(r) for r in rows]

    async def progress(self, task_id: TaskId) -> dict[ItemStatus, int]:
        """The task's items by status, but for completed ones: they are the rest of its total.

        Running means a handler is running it: items claimed by a worker and
        still waiting for a handler are counted as pending.
        """
        rows = await self._rows("progress", {"task_id": task_id})
        return status_counts((r[0], r[1]) for r in rows)

    async def progress_many(
        self, task_ids: Sequence[TaskId]
    ) -> dict[TaskId, dict[ItemStatus, int]]:
        rows = await self._rows("progress_many", {"task_ids": list(task_ids)})
        found: dict[TaskId, list[tuple[str, int]]] = {}
        for task_id, status, count in rows:
            found.setdefault(TaskId(task_id), []).append((status, count))
        return {task_id: status_counts(counts) for task_id, counts in found.items()}

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
