"""``Batches``: create tasks, read progress, page items, cancel, retry failed items.

>>> batches = Batches(boss, {"extract": kind})                    # doctest: +SKIP
>>> created = await batches.create("extract", ["doc-1", "doc-2"])  # doctest: +SKIP
>>> (await batches.get(created.task_id)).progress.percent          # doctest: +SKIP

The front door only: a request's inputs are checked in
:mod:`shoal.batch.inputs`, answers are the read models of
:mod:`shoal.batch.views`, a kind's running worker is
:class:`~shoal.batch.kind_worker.KindWorker`. Those names are importable
from here too.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

from shoal.batch.aggregator import Aggregator, dispatch_items
from shoal.batch.inputs import (
    MAX_KEY_LENGTH,
    MAX_REF_LENGTH,
    ParsedItems,
    parse_items,
    request_hash,
)
from shoal.batch.item_runner import PHANTOM_SKIPS, ItemRunner
from shoal.batch.kind_worker import KindWorker
from shoal.batch.kinds import BatchKind, KindSettings
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
from shoal.batch.rows import ItemKeys, ItemRow, TaskRow
from shoal.batch.states import ItemId, ItemStatus, TaskOutcome, TaskStatus
from shoal.batch.store import BatchStore
from shoal.batch.views import Created, ItemsPage, Progress, TaskView, task_view
from shoal.db.pool import AsyncConn, statement_timeout_for
from shoal.errors import (
    Conflict,
    IdempotencyMismatch,
    InvalidInput,
    NotFound,
    StillCreating,
    TransientError,
)
from shoal.queue.client import Shoal
from shoal.queue.options import check_queue_name
from shoal.queue.worker import DEFAULT_POLL_INTERVAL, Worker

# Most item jobs one claim takes (the queue's default is 500). Reached only by
# fast items (the worker's prefetch follows their rate): a claim also guards
# its items, and a 100,000-item task of no-op items runs 4-5% faster here with
# claims of 1000 than of 500. Claimed items wait in the worker's buffer
# as running, and are handed back at shutdown.
ITEM_CLAIM_BATCH = 1000
# A create of this many items or more analyzes the item table once it has
# committed. An autovacuum that ran while such a create was in flight counted
# none of its rows, and the planner then took the table for empty: each
# claim probed its items through item_task_status, a walk of the whole index
# per item (1,000,000 items: the claims outran their statement timeout and
# the task stalled until autovacuum came round again). About a second at
# 1,000,000 items, against the create's 15-25 s.
ANALYZE_AFTER_ITEMS = 50_000

log = logging.getLogger("shoal.batch")


class Batches:
    """The batch layer's front door, over one :class:`Shoal` client."""

    def __init__(
        self,
        boss: Shoal,
        kinds: Mapping[str, BatchKind],
        *,
        max_items: int = DEFAULT_MAX_ITEMS,
    ) -> None:
        self.boss = boss
        self.kinds = dict(kinds)
        self.max_items = max_items
        self.store = BatchStore(boss.db, holder=lambda: boss.store.holder)
        self.clock = boss.clock
        self.aggregator = Aggregator(self.store, boss, clock=boss.clock)
        self.runners = {
            name: ItemRunner(
                self.store,
                kind,
                clock=boss.clock,
                send=functools.partial(dispatch_items, boss),
                jitter=boss.jitter,
                wake=self.aggregator.wake,
                hooks=boss.hooks,
            )
            for name, kind in kinds.items()
        }

    def work(self, kind: str, *, poll_interval: timedelta = DEFAULT_POLL_INTERVAL) -> KindWorker:
        """Start running ``kind``'s items in this process (``App.run`` does this for each kind).

        A kind with limits (``global_concurrency``, ``rate_limit``,
        ``partition_by``) declares them and is claimed within them, across
        every process; one without
        claims within those its item queue has, if another process declared
        some (docs/limits.md, "Batch kinds").
        """
        spec = self.kind(kind)
        runner = self.runners[spec.name]
        if spec.limits:
            return KindWorker(self._work_limited(spec, runner, poll_interval), runner)
        # Without limits of its own, the worker claims through runner.claim
        # while the kind's queue has none, and through the limited claim
        # while another process's declaration gives it some.
        worker = self.boss.work(
            spec.queue,
            runner,
            concurrency=spec.concurrency,
            poll_interval=poll_interval,
            batch_size=ITEM_CLAIM_BATCH,
            claim=runner.claim,
            claim_cursor=runner.cursor,
            finalize=runner.recorder.finalize,
            # The item row holds the result; the job needs no copy.
            store_output=False,
            # Buffered items are running (the aggregator reaps them past the
            # zombie timeout): hold no more than the runners start within
            # one heartbeat interval.
            max_hold=runner.heartbeat_interval,
        )
        return KindWorker(worker, runner)

    def _work_limited(
        self, spec: BatchKind, runner: ItemRunner, poll_interval: timedelta
    ) -> Worker:
        """The worker of a kind with limits: its item jobs are claimed by the limited claim.

        A slot of the limits is an active job, so the jobs stay leased (not
        taken, as ``runner.claim`` takes them) until the item's run ends: its
        result recorded (finalize completes the job), its failure retried by
        the queue, its run handed back at shutdown, or its lease expired. The
        runner guards each item as its run starts. Its jobs carry their items'
        partition keys (given when each task was created), so ``partition_by``
        is declared with the queue's limits and never run on a job.
        """
        return self.boss.work(
            spec.queue,
            runner,
            concurrency=spec.concurrency,
            poll_interval=poll_interval,
            batch_size=ITEM_CLAIM_BATCH,
            finalize=runner.recorder.finalize,
            store_output=False,
            global_concurrency=spec.global_concurrency,
            rate_limit=spec.rate_limit,
            partition_by=spec.partition_by,
            keys_given=True,
        )

    def kind(self, name: object) -> BatchKind:
        return find_kind(name, self.kinds)

    async def kind_settings(self, name: object) -> KindSettings:
        """What a create of kind ``name`` needs: this process's own kind, else the one
        workers stored (:meth:`store_kinds`), as :class:`~shoal.batch.sync.SyncBatches`
        reads it. So an API started before a new kind was deployed creates its tasks
        once a worker of it has started. InvalidInput naming the kinds of both when
        neither has it.
        """
        if isinstance(name, str) and name in self.kinds:
            return self.kinds[name].settings
        own = {kind: spec.settings for kind, spec in self.kinds.items()}
        return find_kind(name, (await self.store.kinds()) | own)

    async def store_kinds(self) -> None:
        """Store this process's kinds in the database (``App.run`` does, when a worker starts).

        Creators without the kinds' code read them there:
        :class:`~shoal.batch.sync.SyncBatches` and ``create_task()`` in SQL.
        The last worker to start wins; tasks already created keep their settings.
        """
        settings = [self.kinds[name].settings for name in sorted(self.kinds)]
        await self.store.put_kinds(settings, now=self.clock.sql_now())

    async def create(
        self,
        kind: str,
        items: Sequence[str | Mapping[str, Any]],
        *,
        idempotency_key: str | None = None,
        params: Any = None,
        deadline: timedelta | float | None = None,
        on_complete_queue: str | None = None,
        conn: AsyncConn | None = None,
    ) -> Created:
        """Create a task with its items and their jobs, in ONE transaction.

        Idempotent by ``idempotency_key``: the same key with the same request
        answers the existing task (``created=False``); with a different request
        it raises :class:`IdempotencyMismatch`; while a concurrent identical
        request is still being created it raises :class:`StillCreating`.
        Nothing is written when anything is invalid. ``kind`` is one of this
        process's kinds or one a worker stored (:meth:`kind_settings`).

        Each item is a ref, or ``{"ref", "data", "partition_key"}``: a kind
        with ``partition_by`` keys each item by it (an item's own
        ``partition_key`` wins), and the item keeps that key through every
        run (docs/limits.md, "Batch kinds").

        ``on_complete_queue`` sends the task's completion job (``{"task_id",
        "outcome"}``) to that queue in place of the kind's ``on_complete``
        hook: what a workflow's ``wf.batch`` resumes on. With ``conn``, the
        task is written in the caller's open transaction.
        """
        own = self.kinds.get(kind) if isinstance(kind, str) else None
        plan = CreatePlan.of(
            await self.kind_settings(kind),
            items,
            idempotency_key=idempotency_key,
            params=params,
            deadline=deadline,
            max_items=self.max_items,
            max_payload_bytes=self.boss.max_payload_bytes,
            defaults=self.boss.defaults,
            partitioner=None if own is None else own.partitioner,
        )
        if on_complete_queue is not None:
            plan = replace(
                plan, task=replace(plan.task, on_complete_queue=check_queue_name(on_complete_queue))
            )
        now = self.clock.sql_now()
        # A big task's one statement of items and jobs is given as long as
        # its size needs, and so is the transaction around it.
        within = create_deadline(self.boss.db.deadline, len(plan.items))
        big = within > self.boss.db.deadline

        # The steps of shoal.batch.plans, as SyncBatches.create runs them.
        async def create(conn: AsyncConn) -> Created:
            before = await self.store.set_lock_timeout(conn, IDEMPOTENCY_WAIT)
            task_id = await self.store.insert_task(conn, plan.task, now=now)
            await self.store.set_lock_timeout(conn, before)
            if task_id is None:
                assert idempotency_key is not None
                return plan.existing(await self.store.task_by_key(conn, idempotency_key))
            if big:
                limit = statement_timeout_for(within)
                before = await self.store.raise_statement_timeout(conn, limit)
            await self.store.insert_items(
                conn,
                task_id,
                plan.items.refs,
                plan.items.data,
                jobs=plan.item_jobs,
                keys=ItemKeys(plan.partition_keys, plan.partition_field),
                now=now,
            )
            if big:
                await self.store.set_statement_timeout(conn, before)
            await self.boss.store.notify(conn, [plan.task.item_queue])
            return Created(task_id, created=True)

        try:
            if conn is not None:
                return await self.boss.db.on(conn, create)
            created = await self.boss.db.run(create, deadline=within)
        except TransientError as exc:
            raise still_creating(exc, idempotency_key) from exc
        if created.created and len(plan.items) >= ANALYZE_AFTER_ITEMS:
            await self._analyze_items()
        return created

    async def _analyze_items(self) -> None:
        """Fresh item statistics after a big create: best effort, the task is created."""
        try:
            await self.store.analyze_items()
        except Exception as exc:  # the task is created: its statistics wait for autovacuum
            log.warning("ANALYZE of the item table after a big create failed: %s", exc)

    async def get(self, task_id: str) -> TaskView:
        """A task with its progress, elapsed time, estimate of time left, and pause."""
        row = await self._row(task_id)
        counts = await self.store.progress(row.id)
        paused = await self.boss.paused_queues()
        return task_view(row, counts, now=self.clock.now(), paused_queues=paused)

    async def tasks(
        self,
        *,
        status: TaskStatus | None = None,
        kind: str | None = None,
        limit: int = 50,
        before: str | None = None,
    ) -> list[TaskView]:
        """Tasks newest first (of one ``status`` and ``kind`` when given), as :meth:`get`.

        ``before``, a task id (the last of the previous page), pages on: only
        tasks created before that one are listed. NotFound when it names none.
        """
        after = None if before is None else await self._row(before)
        rows = await self.store.list_tasks(
            status=status,
            kind=kind,
            before=None if after is None else (after.created_at, after.id),
            limit=limit,
        )
        counts = await self.store.progress_many([r.id for r in rows]) if rows else {}
        paused = await self.boss.paused_queues() if rows else []
        now = self.clock.now()
        return [task_view(r, counts.get(r.id, {}), now=now, paused_queues=paused) for r in rows]

    async def items(
        self,
        task_id: str,
        *,
        status: ItemStatus | str | None = None,
        cursor: int | None = None,
        limit: int = 100,
        ref: str | None = None,
    ) -> ItemsPage:
        """A page of a task's items in id order, of one ``status`` or whose ref contains ``ref``."""
        row = await self._row(task_id)
        if ref is not None and (not isinstance(ref, str) or not ref or "\x00" in ref):
            raise InvalidInput("ref", f"must be a non-empty string without NUL, got {ref!r:.80}")
        try:
            parsed = None if status is None else ItemStatus(status)
        except ValueError:
            raise InvalidInput(
                "status", f"{status!r} is not an item status ({', '.join(ItemStatus)})"
            ) from None
        if not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise InvalidInput("limit", f"must be an integer from 1 to 1000, got {limit!r}")
        if cursor is not None and (not isinstance(cursor, int) or cursor < 0):
            raise InvalidInput("cursor", f"must be an integer >= 0, got {cursor!r}")
        rows = await self.store.list_items(
            row.id, status=parsed, after_id=cursor or 0, limit=limit + 1, ref=ref
        )
        more = len(rows) > limit
        page = tuple(rows[:limit])
        return ItemsPage(page, page[-1].id if more and page else None)

    async def cancel(self, task_id: str) -> TaskView:
        """Stop a task: pending items never start, running ones are stopped, then it closes.

        One transaction: the task is marked, its pending and running items
        are cancelled, and the processes running its items are told (they
        stop the handlers; docs/batch.md, "Cancelling a task").
        """
        row = await self._row(task_id)
        await self.boss.db.run(lambda conn: self.cancel_on(conn, row.id))
        return await self.get(row.id)

    async def cancel_on(self, conn: AsyncConn, task_id: str) -> None:
        """:meth:`cancel` in the caller's open transaction on ``conn``.

        Raises :class:`NotFound` or :class:`Conflict` (closed already) before
        writing anything, so the caller's transaction can go on.
        """
        ident = task_id_of(task_id)
        now = self.clock.sql_now()
        check_cancellable(ident, await self.store.lock_task(conn, ident))
        if await self.store.request_cancel(conn, ident, TaskOutcome.CANCELLED, now=now):
            await self.store.cancel_pending_items(conn, [ident], now=now)
            await self.store.cancel_running_items(conn, [ident], now=now)

    async def retry_failed(self, task_id: str) -> int:
        """Put a task's error and cancelled items back to pending with fresh attempts.

        One transaction: the items are reopened, the task goes back to
        processing (a cancel is undone: a cancelled task is re-opened) and
        their jobs are sent. Returns how many items were reopened. A task
        that timed out is a Conflict: its deadline has passed.
        """
        row = await self._row(task_id)
        now = self.clock.sql_now()

        async def retry(conn: AsyncConn) -> int:
            locked = await self.store.lock_task(conn, row.id)
            assert locked is not None
            if locked.cancel_reason is TaskOutcome.TIMED_OUT:
                raise Conflict(f"task {row.id} timed out (its deadline passed); cannot retry")
            reopened = await self.store.reopen_failed_items(conn, row.id, now=now)
            if reopened:
                await self.store.reopen_task(conn, row.id)
                await dispatch_items(self.boss, conn, reopened)
            return len(reopened)

        return await self.boss.db.run(retry)

    async def export_rows(self, task_id: str) -> list[ItemRow]:
        """Every item of a task, in id order (for JSON Lines and CSV export)."""
        rows: list[ItemRow] = []
        cursor: int | None = None
        while True:
            page = await self.items(task_id, cursor=cursor, limit=1000)
            rows.extend(page.items)
            if page.next_cursor is None:
                return rows
            cursor = page.next_cursor

    async def phantom_skips(self) -> int:
        return (await self.store.counters()).get(PHANTOM_SKIPS, 0)

    async def _row(self, task_id: str) -> TaskRow:
        row = await self.store.get_task(task_id_of(task_id))
        if row is None:
            raise NotFound(f"task {task_id!r} does not exist")
        return row


__all__ = [
    "DEFAULT_MAX_ITEMS",
    "IDEMPOTENCY_WAIT",
    "ITEM_CLAIM_BATCH",
    "MAX_KEY_LENGTH",
    "MAX_REF_LENGTH",
    "Batches",
    "Created",
    "IdempotencyMismatch",
    "ItemId",
    "ItemsPage",
    "KindWorker",
    "ParsedItems",
    "Progress",
    "StillCreating",
    "TaskView",
    "parse_items",
    "request_hash",
]
