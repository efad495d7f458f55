"""``SyncBatches``: create, read and cancel batch tasks from synchronous code.

For scripts, Django views and Flask handlers, over a
:class:`~shoal.queue.sync.SyncClient`. A create is checked and written as
:meth:`Batches.create <shoal.batch.service.Batches.create>` does it (one
:class:`~shoal.batch.plans.CreatePlan`, the same statements of
``queries.sql``); given ``conn=``, a psycopg 3 connection, it joins the
caller's open transaction: the task, its items and their jobs commit with
the caller's own writes, and vanish if the caller rolls back.

The kinds' code lives in the worker. What a create needs of a kind (its
item queue, job options, attempts, zombie timeout, hook queue, partition
field or the name of its partition function) is stored in
the database when a worker of the App that declares it starts
(:meth:`Batches.store_kinds <shoal.batch.service.Batches.store_kinds>`), and
read here in the create's transaction.

>>> with SyncClient.connect("postgresql://localhost/app") as client:  # doctest: +SKIP
...     created = SyncBatches(client).create("extract", ["doc-1", "doc-2"])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from shoal.batch.kinds import BatchKind
from shoal.batch.plans import (
    DEFAULT_MAX_ITEMS,
    IDEMPOTENCY_WAIT,
    CreatePlan,
    check_cancellable,
    create_deadline,
    find_kind,
    still_creating,
    task_id_of,
)
from shoal.batch.rows import ItemKeys, TaskRow
from shoal.batch.states import TaskOutcome
from shoal.batch.sync_store import SyncBatchStore
from shoal.batch.views import Created, TaskView, task_view
from shoal.db.pool import statement_timeout_for
from shoal.db.sync import SyncConn, SyncCursor
from shoal.errors import NotFound, TransientError
from shoal.queue.sync import SyncClient


class SyncBatches:
    """Batch tasks from synchronous code, over ``client``'s pool (or the caller's ``conn``).

    Thread-safe as its client is. ``max_items`` caps a task's items, as
    :class:`~shoal.batch.service.Batches` does; the payload cap and the
    item jobs' default options are the client's.
    """

    def __init__(self, client: SyncClient, *, max_items: int = DEFAULT_MAX_ITEMS) -> None:
        self.client = client
        self.max_items = max_items
        self.store = SyncBatchStore(client.db)

    def store_kinds(self, kinds: Iterable[BatchKind], *, conn: SyncConn | None = None) -> None:
        """Store what creating tasks of ``kinds`` needs, as a worker's start does.

        For a deployment step or a test that creates tasks before any worker
        of the App has started (``store_kinds(app.kinds.values())``).
        """
        settings = sorted((k.settings for k in kinds), key=lambda k: k.name)
        now = self.client.clock.sql_now()
        self.store.run(conn, lambda cur: self.store.put_kinds(cur, settings, now=now))

    def create(
        self,
        kind: str,
        items: Sequence[str | Mapping[str, Any]],
        *,
        idempotency_key: str | None = None,
        params: Any = None,
        deadline: timedelta | float | None = None,
        conn: SyncConn | None = None,
    ) -> Created:
        """Create a task of a stored kind with its items and their jobs, in one transaction.

        As :meth:`Batches.create <shoal.batch.service.Batches.create>`: the
        same checks and errors (:class:`~shoal.InvalidInput` naming the
        field, nothing written), the same idempotency (:class:`IdempotencyMismatch`,
        :class:`StillCreating`). ``kind`` must have been stored by a worker's
        start. With ``conn``, the task exists only if the caller commits; a
        :class:`StillCreating` leaves the caller's transaction aborted.
        """
        now = self.client.clock.sql_now()

        # The steps of shoal.batch.plans, as Batches.create runs them.
        def create(cur: SyncCursor) -> Created:
            plan = CreatePlan.of(
                find_kind(kind, self.store.kinds(cur)),
                items,
                idempotency_key=idempotency_key,
                params=params,
                deadline=deadline,
                max_items=self.max_items,
                max_payload_bytes=self.client.builder.max_payload_bytes,
                defaults=self.client.builder.defaults,
            )
            before = self.store.set_lock_timeout(cur, IDEMPOTENCY_WAIT)
            task_id = self.store.insert_task(cur, plan.task, now=now)
            self.store.set_lock_timeout(cur, before)
            if task_id is None:
                assert idempotency_key is not None
                return plan.existing(self.store.task_by_key(cur, idempotency_key))
            # As Batches.create: a big task's statement is given as long as it needs.
            within = create_deadline(self.client.db.deadline, len(plan.items))
            big = within > self.client.db.deadline
            if big:
                before = self.store.raise_statement_timeout(cur, statement_timeout_for(within))
            self.store.insert_items(
                cur,
                task_id,
                plan.items.refs,
                plan.items.data,
                jobs=plan.item_jobs,
                keys=ItemKeys(plan.partition_keys, plan.partition_field),
                now=now,
            )
            if big:
                self.store.set_statement_timeout(cur, before)
            self.client.store.notify(cur.connection, [plan.task.item_queue])
            return Created(task_id, created=True)

        try:
            return self.store.run(conn, create)
        except TransientError as exc:
            raise still_creating(exc, idempotency_key) from exc

    def get(self, task_id: str, *, conn: SyncConn | None = None) -> TaskView:
        """As ``Batches.get``: progress, elapsed time, estimate, pause; :class:`~shoal.NotFound`
        when there is no such task."""

        def get(cur: SyncCursor) -> TaskView:
            return self._view(cur, task_id)

        return self.store.run(conn, get)

    def cancel(self, task_id: str, *, conn: SyncConn | None = None) -> TaskView:
        """Stop a task: pending items never start, running ones are stopped, then it closes.

        :class:`~shoal.Conflict` when the task has closed already.
        """
        now = self.client.clock.sql_now()

        def cancel(cur: SyncCursor) -> TaskView:
            row = self._row(cur, task_id)
            check_cancellable(row.id, self.store.lock_task(cur, row.id))
            if self.store.request_cancel(cur, row.id, TaskOutcome.CANCELLED, now=now):
                self.store.cancel_pending_items(cur, [row.id], now=now)
                self.store.cancel_running_items(cur, [row.id], now=now)
            return self._view(cur, task_id)

        return self.store.run(conn, cancel)

    def _view(self, cur: SyncCursor, task_id: str) -> TaskView:
        """What ``Batches.get`` answers: progress, elapsed time, estimate and pause."""
        row = self._row(cur, task_id)
        return task_view(
            row,
            self.store.progress(cur, row.id),
            now=self.client.clock.now(),
            paused_queues=self.client.store.paused_queues(cur),
        )

    def _row(self, cur: SyncCursor, task_id: str) -> TaskRow:
        row = self.store.get_task(cur, task_id_of(task_id))
        if row is None:
            raise NotFound(f"task {task_id!r} does not exist")
        return row


__all__ = ["SyncBatches"]
