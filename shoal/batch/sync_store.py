"""The batch statements synchronous code runs (:mod:`shoal.batch.sync`).

The same ``queries.sql`` as :class:`shoal.batch.store.BatchStore`, on a
synchronous connection.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from psycopg.pq import TransactionStatus

from shoal.batch.kinds import KindSettings
from shoal.batch.rows import (
    NO_KEYS,
    ItemKeys,
    NewTask,
    TaskRow,
    items_params,
    kind_settings,
    kinds_params,
    ms_params,
    status_counts,
    task_params,
    task_row,
    timeout_params,
)
from shoal.batch.states import ItemStatus, TaskId, TaskOutcome
from shoal.db.pool import translated
from shoal.db.queries import load_queries
from shoal.db.sync import SyncConn, SyncCursor, SyncDatabase
from shoal.queue.rows import JobSettings
from shoal.queue.store import cancel_channel

T = TypeVar("T")


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
        return {row[0]: kind_settings(row) for row in self._rows(cur, "get_kinds", {})}

    def put_kinds(
        self, cur: SyncCursor, kinds: Sequence[KindSettings], *, now: datetime | None
    ) -> None:
        """As :meth:`BatchStore.put_kinds`."""
        if kinds:
            self._rows(cur, "put_kinds", kinds_params(kinds, now))

    def set_lock_timeout(self, cur: SyncCursor, wait: timedelta | str) -> str:
        return str(self._rows(cur, "set_lock_timeout", timeout_params(wait))[0][0])

    def raise_statement_timeout(self, cur: SyncCursor, wait: timedelta) -> str:
        return str(self._rows(cur, "raise_statement_timeout", ms_params(wait))[0][0])

    def set_statement_timeout(self, cur: SyncCursor, setting: str) -> None:
        self._rows(cur, "set_statement_timeout", {"timeout": setting})

    def insert_task(self, cur: SyncCursor, task: NewTask, *, now: datetime | None) -> TaskId | None:
        rows = self._rows(cur, "insert_task", task_params(task, now))
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
        params = items_params(task_id, refs, data, jobs, keys, now)
        rows = self._rows(cur, "insert_items", params)
        return int(rows[0][0])

    def get_task(self, cur: SyncCursor, task_id: TaskId) -> TaskRow | None:
        rows = self._rows(cur, "get_task", {"task_id": task_id})
        return task_row(rows[0]) if rows else None

    def progress(self, cur: SyncCursor, task_id: TaskId) -> dict[ItemStatus, int]:
        """As :meth:`BatchStore.progress`."""
        return status_counts(
            (r[0], r[1]) for r in self._rows(cur, "progress", {"task_id": task_id})
        )

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
