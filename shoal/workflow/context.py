"""``Workflow``: a run as its workflow's code sees it, and how each step is checkpointed.

A run is resumed by running its workflow function again from the top. Each
call of :meth:`Workflow.step`, :meth:`Workflow.sleep` or
:meth:`Workflow.wait_for` takes the next place in the run (1, 2, ...); where
the run recorded a checkpoint at that place, the call returns what was
recorded instead of doing the work again. So the code between the calls must
decide the same way on every replay: what varies (the time, a random number,
a read of the world) belongs in a step, whose result is recorded once.

Waiting never holds a process: a sleep, a wait for an event, or a failed
step's retry delay records where the run stopped, sends the queue job that
will resume it (at the time, or earlier when the event comes), and unwinds
the workflow function with :class:`Suspended`, which the runner catches.
"""

from __future__ import annotations

import asyncio
import json
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from shoal.batch.states import TaskStatus
from shoal.db.pool import AsyncConn
from shoal.errors import InvalidInput, PermanentError, UnstorableResult
from shoal.queue.results import callable_name, encode_result
from shoal.queue.retry import SYSTEM_JITTER
from shoal.queue.retry import retry_delay as delay_after
from shoal.tracing import StepSpan, step_span
from shoal.workflow.runtime import (
    MAX_KEY_LENGTH,
    NO_TIMEOUT,
    MachineryFailed,
    Runtime,
    StepOptions,
    Superseded,
    Suspended,
    caller_of,
    child_key,
    digest,
    parse_time,
    returned_by,
    task_key,
    to_json,
)
from shoal.workflow.states import RunStatus, StepFailed, StepKind, StepStatus, WorkflowChanged
from shoal.workflow.store import Checkpoint, StepRecord

T = TypeVar("T")


class Workflow:
    """One run of a workflow, handed to the workflow function as its first argument.

    >>> @app.workflow("onboard")                                # doctest: +SKIP
    ... async def onboard(wf: Workflow, user_id: int) -> str:
    ...     account = await wf.step(create_account, user_id)
    ...     await wf.sleep(timedelta(days=3))
    ...     answer = await wf.wait_for(f"survey:{user_id}", timeout=timedelta(days=7))
    ...     return "answered" if answer else "no answer"
    """

    def __init__(
        self,
        runtime: Runtime,
        run_id: str,
        name: str,
        epoch: int,
        checkpoints: dict[int, Checkpoint],
    ) -> None:
        self._rt = runtime
        self.id = run_id
        self.name = name
        self._epoch = epoch
        self._checkpoints = checkpoints
        self._seq = 0

    # -- steps ---------------------------------------------------------------

    async def step(
        self,
        fn: Callable[..., Any],
        *args: Any,
        name: str | None = None,
        retry_limit: int = 0,
        retry_delay: timedelta = timedelta(0),
        retry_backoff: bool = False,
        transaction: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` once for this run; a replay returns its recorded result.

        The result must be storable as JSON; it comes back as JSON reads it
        (a tuple as a list), on the first run as on a replay. A step that
        raises is tried again ``retry_limit`` times, after ``retry_delay``
        (doubling with ``retry_backoff``; a delay is slept durably, holding
        no process), then :class:`StepFailed` is raised here. A
        :class:`PermanentError` is not retried.

        With ``transaction=True``, ``fn`` is called as ``fn(conn, *args,
        **kwargs)`` inside a transaction on ``conn`` (a psycopg async
        connection) that also writes the step's checkpoint: the step's own
        writes and its checkpoint commit together or not at all, so its
        effect in the database happens once.
        """
        options = StepOptions.of(name, retry_limit, retry_delay, retry_backoff, transaction)
        return await self.call(fn, args, kwargs, options)

    async def call(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: StepOptions,
    ) -> Any:
        """:meth:`step` with the step's options apart from ``fn``'s own arguments."""
        seq = self._next()
        label = options.name or callable_name(fn)
        done = self._replayed(seq, label, StepKind.STEP)
        attempts = 0
        if done is not None:
            if done.status is StepStatus.COMPLETED:
                return done.result
            if done.status is StepStatus.FAILED:
                raise StepFailed(self.id, label, seq, done.attempts, done.error or "")
            attempts = done.attempts
        call = caller_of(fn, options.transaction)
        while True:
            attempts += 1
            started = self._rt.clock.now()
            with step_span(self.name, self.id, seq, label, attempts) as span:
                try:
                    if options.transaction:
                        value = await self._run_in_transaction(
                            call, args, kwargs, seq, label, attempts, started
                        )
                        self._ended(span, seq, label, attempts, "completed")
                        return value
                    value = await call(*args, **kwargs)
                    text = encode_result(value, returned_by=returned_by(label, seq))
                except (asyncio.CancelledError, Suspended, Superseded, MachineryFailed):
                    raise
                except Exception as exc:
                    error = "".join(traceback.format_exception(exc))
                    permanent = isinstance(exc, PermanentError | UnstorableResult)
                    if not permanent and attempts <= options.policy.retry_limit:
                        self._ended(span, seq, label, attempts, "retried", exc)
                        delay = delay_after(attempts, options.policy, SYSTEM_JITTER)
                        if delay <= timedelta(0):
                            continue
                        await self._retry_later(seq, label, attempts, error, started, delay)
                    self._ended(span, seq, label, attempts, "failed", exc)
                    await self._record(
                        StepRecord(
                            seq,
                            label,
                            StepKind.STEP,
                            StepStatus.FAILED,
                            attempts,
                            None,
                            error,
                            started,
                            self._rt.clock.now(),
                        )
                    )
                    raise StepFailed(self.id, label, seq, attempts, error) from exc
                await self._record(
                    StepRecord(
                        seq,
                        label,
                        StepKind.STEP,
                        StepStatus.COMPLETED,
                        attempts,
                        text,
                        None,
                        started,
                        self._rt.clock.now(),
                    )
                )
                self._ended(span, seq, label, attempts, "completed")
                return None if text is None else json.loads(text)

    def _ended(
        self,
        span: StepSpan,
        seq: int,
        label: str,
        attempt: int,
        outcome: str,
        error: BaseException | None = None,
    ) -> None:
        """An attempt of a step ended: its span says how, and so does a ``step_finished`` event."""
        span.end(outcome, error)
        hooks = self._rt.boss.hooks
        if hooks:
            hooks.emit(
                "step_finished",
                self._rt.queue,
                workflow=self.name,
                run_id=self.id,
                seq=seq,
                step=label,
                attempt=attempt,
                outcome=outcome,
            )

    async def _run_in_transaction(
        self,
        call: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        seq: int,
        label: str,
        attempts: int,
        started: datetime,
    ) -> Any:
        async def work(conn: AsyncConn) -> Any:
            value = await call(conn, *args, **kwargs)
            text = encode_result(value, returned_by=returned_by(label, seq))
            record = StepRecord(
                seq,
                label,
                StepKind.STEP,
                StepStatus.COMPLETED,
                attempts,
                text,
                None,
                started,
                self._rt.clock.now(),
            )
            if not await self._machinery(
                self._rt.store.record_step(self.id, self._epoch, record, conn)
            ):
                raise Superseded  # rolls back the step's own writes with it
            return None if text is None else json.loads(text)

        return await self._rt.db.run(work)

    # -- durable timers --------------------------------------------------------

    async def sleep(self, duration: timedelta) -> None:
        """Wait ``duration``, holding no process; a run resumed by a restart does not wait again."""
        if not isinstance(duration, timedelta):
            raise InvalidInput("duration", f"must be a timedelta, got {duration!r}")
        await self._sleep(lambda now: now + max(duration, timedelta(0)))

    async def sleep_until(self, when: datetime) -> None:
        """Wait until ``when`` (timezone-aware) without holding a process."""
        if not isinstance(when, datetime) or when.tzinfo is None:
            raise InvalidInput("when", f"must be a timezone-aware datetime, got {when!r}")
        await self._sleep(lambda _now: when)

    async def _sleep(self, until_of: Callable[[datetime], datetime]) -> None:
        seq = self._next()
        done = self._replayed(seq, "sleep", StepKind.SLEEP)
        now = self._rt.clock.now()
        if done is not None and done.status is StepStatus.COMPLETED:
            return
        until = until_of(now) if done is None else parse_time(done.result["until"])
        started = now if done is None else None
        if now >= until:
            await self._record(
                StepRecord(
                    seq,
                    "sleep",
                    StepKind.SLEEP,
                    StepStatus.COMPLETED,
                    0,
                    to_json({"until": until.isoformat()}),
                    None,
                    started,
                    now,
                )
            )
            return
        record = StepRecord(
            seq,
            "sleep",
            StepKind.SLEEP,
            StepStatus.WAITING,
            0,
            to_json({"until": until.isoformat()}),
            None,
            started,
            None,
        )
        await self._suspend(record, RunStatus.SLEEPING, until, key=None)

    # -- events ----------------------------------------------------------------

    async def wait_for(
        self,
        key: str,
        *,
        timeout: timedelta | None = None,  # noqa: ASYNC109 - a durable timeout, not a deadline
    ) -> Any:
        """The payload of the next event sent to ``key`` with :meth:`Workflows.signal`.

        An event sent before the wait is kept for it; each event is
        delivered to one wait, once. Returns None when ``timeout`` passes
        first. Holds no process while it waits.
        """
        if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_LENGTH:
            raise InvalidInput("key", f"must be a string of 1 to {MAX_KEY_LENGTH} characters")
        if timeout is not None and not isinstance(timeout, timedelta):
            raise InvalidInput("timeout", f"must be a timedelta or None, got {timeout!r}")
        seq = self._next()
        done = self._replayed(seq, key, StepKind.WAIT)
        if done is not None and done.status is StepStatus.COMPLETED:
            return None if done.result.get("timed_out") else done.result.get("payload")
        now = self._rt.clock.now()
        if done is None:
            deadline = None if timeout is None else now + max(timeout, timedelta(0))
            started: datetime | None = now
        else:
            deadline = parse_time(done.result["deadline"]) if done.result.get("deadline") else None
            started = None
        store = self._rt.store

        async def attempt(conn: AsyncConn) -> tuple[bool, Any]:
            found, payload = await store.take_event(
                conn, self.id, seq, key, now=self._rt.clock.sql_now()
            )
            if found or (deadline is not None and now >= deadline):
                result = {"payload": payload} if found else {"timed_out": True}
                record = StepRecord(
                    seq,
                    key,
                    StepKind.WAIT,
                    StepStatus.COMPLETED,
                    0,
                    to_json(result),
                    None,
                    started,
                    now,
                )
                if not await store.record_step(self.id, self._epoch, record, conn):
                    raise Superseded
                return True, payload if found else None
            record = StepRecord(
                seq,
                key,
                StepKind.WAIT,
                StepStatus.WAITING,
                0,
                to_json({"deadline": None if deadline is None else deadline.isoformat()}),
                None,
                started,
                None,
            )
            await self._arm(conn, record, RunStatus.WAITING, deadline or now + NO_TIMEOUT, key)
            return False, None

        over, value = await self._machinery(self._rt.db.run(attempt))
        if not over:
            raise Suspended
        return value

    # -- fan-out -----------------------------------------------------------------

    async def batch(
        self,
        kind: str,
        items: Sequence[str | Mapping[str, Any]],
        *,
        params: Any = None,
        deadline: timedelta | None = None,
    ) -> dict[str, Any]:
        """Create a batch task of ``kind`` and wait, holding no process, until it closes.

        Returns ``{"task_id", "outcome", "progress"}`` (the progress counts as
        :class:`shoal.Progress` gives them). The task is created once per run,
        in the transaction that records the step; its completion job resumes
        the run (in place of the kind's ``on_complete`` hook). Cancelling the
        run cancels the task.
        """
        if self._rt.batches is None:
            raise InvalidInput("kind", "this workflow's runner has no batch kinds (App.batch)")
        batches = self._rt.batches
        seq = self._next()
        done = self._replayed(seq, kind, StepKind.BATCH)
        if done is not None and done.status is StepStatus.COMPLETED:
            return dict(done.result)
        now = self._rt.clock.now()
        if done is None:
            key = f"shoal.workflow:{digest(self.id)}:{seq}"

            async def create(conn: AsyncConn) -> None:
                created = await batches.create(
                    kind,
                    items,
                    idempotency_key=key,
                    params=params,
                    deadline=deadline,
                    on_complete_queue=self._rt.queue,
                    conn=conn,
                )
                record = StepRecord(
                    seq,
                    kind,
                    StepKind.BATCH,
                    StepStatus.WAITING,
                    0,
                    to_json({"task_id": created.task_id}),
                    None,
                    now,
                    None,
                )
                await self._wait_unwoken(conn, record, task_key(created.task_id))

            await self._machinery(self._rt.db.run(create))
            raise Suspended
        task_id = str(done.result["task_id"])
        view = await self._machinery(batches.get(task_id))
        if view.status is TaskStatus.PROCESSING:

            async def again(conn: AsyncConn) -> None:
                record = StepRecord(
                    seq,
                    kind,
                    StepKind.BATCH,
                    StepStatus.WAITING,
                    0,
                    to_json({"task_id": task_id}),
                    None,
                    None,
                    None,
                )
                await self._wait_unwoken(conn, record, task_key(task_id))

            await self._machinery(self._rt.db.run(again))
            raise Suspended
        result = {
            "task_id": task_id,
            "outcome": None if view.outcome is None else view.outcome.value,
            "progress": view.progress.as_dict(),
        }
        await self._record(
            StepRecord(
                seq, kind, StepKind.BATCH, StepStatus.COMPLETED, 0, to_json(result), None, None, now
            )
        )
        return json.loads(to_json(result))  # type: ignore[no-any-return]

    async def child(self, name: str, input: Any = None) -> Any:
        """Start a run of workflow ``name`` and wait for it, holding no process: its result.

        The child's id is derived from this run's and its place here, so a
        replay finds the same child. A child that fails or is cancelled raises
        :class:`StepFailed` here; cancelling this run cancels the child.
        """
        if self._rt.start_child is None:
            raise InvalidInput("name", "this workflow's runner cannot start child workflows")
        start_child = self._rt.start_child
        child_id = f"{self.id}/{self._seq + 1}"
        if len(child_id) > MAX_KEY_LENGTH // 2:
            child_id = f"child-{digest(self.id)}-{self._seq + 1}"
        key = child_key(child_id)

        async def start(conn: AsyncConn) -> str:
            await start_child(name, input, child_id, key, conn)
            return child_id

        await self.step(start, name=f"start {name}", transaction=True)
        ended = await self.wait_for(key)
        if ended.get("status") != "completed":
            status = ended.get("status")
            error = ended.get("error") or f"the child run {child_id!r} was {status}"
            raise StepFailed(self.id, f"child {name}", self._seq, 1, str(error))
        return ended.get("result")

    async def gather(self, *steps: Awaitable[Any]) -> list[Any]:
        """Run steps at once, ``await wf.gather(wf.step(a), wf.step(b, 2))``: their results.

        Each argument is one call of :meth:`step` (their places in the run are
        taken in argument order); for a branch of several steps, start a
        :meth:`child` workflow. If one step waits (a retry delay) or fails,
        the others are stopped; their finished steps keep their checkpoints.
        """
        tasks = [asyncio.ensure_future(step) for step in steps]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
            raise

    # -- bookkeeping -------------------------------------------------------------

    async def _wait_unwoken(self, conn: AsyncConn, record: StepRecord, key: str) -> None:
        """Record a wait that no job of its own ends (a task's completion job or an event does)."""
        rt = self._rt
        if not await rt.store.record_step(self.id, self._epoch, record, conn):
            raise Superseded
        suspended = await rt.store.suspend_run(
            conn,
            self.id,
            self._epoch,
            status=RunStatus.WAITING,
            wake_job=None,
            seq=record.seq,
            key=key,
            now=rt.clock.sql_now(),
        )
        if not suspended:
            raise Superseded

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def _replayed(self, seq: int, name: str, kind: StepKind) -> Checkpoint | None:
        done = self._checkpoints.get(seq)
        if done is not None and (done.kind is not kind or done.name != name):
            raise WorkflowChanged(
                f"workflow {self.name!r}, run {self.id!r}: step {seq} was recorded as "
                f"{done.kind.value} {done.name!r}, but the code now has {kind.value} {name!r} "
                "there; finish or cancel the runs started on the old code before deploying "
                "a change to the order of steps (docs/workflows.md)"
            )
        return done

    async def _record(self, record: StepRecord) -> None:
        if not await self._machinery(self._rt.store.record_step(self.id, self._epoch, record)):
            raise Superseded

    async def _retry_later(
        self, seq: int, label: str, attempts: int, error: str, started: datetime, delay: timedelta
    ) -> None:
        record = StepRecord(
            seq, label, StepKind.STEP, StepStatus.RETRYING, attempts, None, error, started, None
        )
        await self._suspend(record, RunStatus.SLEEPING, self._rt.clock.now() + delay, key=None)

    async def _suspend(
        self, record: StepRecord, status: RunStatus, wake_at: datetime, *, key: str | None
    ) -> None:
        async def arm(conn: AsyncConn) -> None:
            await self._arm(conn, record, status, wake_at, key)

        await self._machinery(self._rt.db.run(arm))
        raise Suspended

    async def _arm(
        self,
        conn: AsyncConn,
        record: StepRecord,
        status: RunStatus,
        wake_at: datetime,
        key: str | None,
    ) -> None:
        """In ``conn``'s transaction: the checkpoint, the resume job, and the run's new status."""
        rt = self._rt
        if not await rt.store.record_step(self.id, self._epoch, record, conn):
            raise Superseded
        job = await rt.boss.send(
            rt.queue, {"run": self.id}, conn=conn, start_after=wake_at, **rt.job_options
        )
        assert job is not None  # no singleton key: a send always inserts
        suspended = await rt.store.suspend_run(
            conn,
            self.id,
            self._epoch,
            status=status,
            wake_job=job,
            seq=record.seq,
            key=key,
            now=rt.clock.sql_now(),
        )
        if not suspended:
            raise Superseded

    async def _machinery(self, work: Awaitable[T]) -> T:
        try:
            return await work
        except (Suspended, Superseded, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise MachineryFailed(exc) from exc
