"""``Workflows``: start runs, send events, read, cancel and retry runs.

>>> workflows = app.workflows(boss)                                   # doctest: +SKIP
>>> run = await workflows.start("onboard", {"user": 7}, id="onboard-7")  # doctest: +SKIP
>>> await workflows.signal("survey:7", {"score": 9})                  # doctest: +SKIP
>>> (await workflows.wait(run.id, timeout=timedelta(minutes=1))).status  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from shoal.batch.service import Batches
from shoal.db.pool import AsyncConn
from shoal.errors import Conflict, DeadlineExceeded, InvalidInput, NotFound, UnstorableResult
from shoal.queue.client import Shoal
from shoal.queue.options import JobOptions
from shoal.queue.results import encode_result
from shoal.queue.states import JobId
from shoal.queue.worker import Worker
from shoal.tracing import TRACE_KEY, carrier
from shoal.workflow.abandoned import DEAD_QUEUE, AbandonedRuns
from shoal.workflow.runner import WorkflowRunner, WorkflowSpec, queue_of
from shoal.workflow.runtime import MAX_KEY_LENGTH, Runtime, child_key, task_key
from shoal.workflow.states import FINAL, RunStatus
from shoal.workflow.store import RunRow, RunStart, StepRow, WorkflowStore

MAX_RUN_ID_LENGTH = 256
TASK_KEY_PREFIX = task_key("")
CHILD_KEY_PREFIX = child_key("")
MAX_PAGE = 500
# Runs a start_many writes in one statement.
START_CHUNK = 500


@dataclass(frozen=True, slots=True)
class Started:
    """A start's answer: the run's id, and whether this call created it (False: it existed)."""

    id: str
    created: bool


@dataclass(frozen=True, slots=True)
class RunView:
    """A run and its steps, as the API and the console show it."""

    run: RunRow
    steps: list[StepRow]

    @property
    def id(self) -> str:
        return self.run.id

    @property
    def status(self) -> RunStatus:
        return self.run.status

    @property
    def result(self) -> Any:
        return self.run.result

    @property
    def error(self) -> str | None:
        return self.run.error


class Workflows:
    """The workflow layer's front door, over one :class:`Shoal` client."""

    def __init__(
        self,
        boss: Shoal,
        specs: Mapping[str, WorkflowSpec],
        *,
        batches: Batches | None = None,
    ) -> None:
        self.boss = boss
        # Read, not copied: an App's workflows declared later are known too.
        self.specs = specs
        self.store = WorkflowStore(boss.db)
        # The batch kinds wf.batch creates tasks of (App.workflows passes the app's).
        self.batches = batches
        self._abandoned: Worker | None = None
        self._job_options: dict[str, JobOptions] = {}

    def _spec(self, name: object) -> WorkflowSpec:
        spec = self.specs.get(name) if isinstance(name, str) else None
        if spec is None:
            known = ", ".join(sorted(self.specs)) or "none"
            raise InvalidInput("name", f"no workflow {name!r} is declared (declared: {known})")
        return spec

    def _options(self, spec: WorkflowSpec) -> JobOptions:
        """The settings of ``spec``'s jobs, parsed once (they were checked when it was declared)."""
        options = self._job_options.get(spec.name)
        if options is None:
            options = self._job_options[spec.name] = JobOptions().merged(spec.job_options)
        return options

    def runtime(self, spec: WorkflowSpec) -> Runtime:
        return Runtime(
            self.store, self.boss, spec.queue, spec.job_options, self.batches, self._start_child
        )

    async def _start_child(
        self, name: str, input: Any, run_id: str, done_key: str, conn: AsyncConn
    ) -> bool:
        return await self._start(
            self._spec(name), run_id, _storable("input", input), done_key, conn
        )

    async def start(
        self,
        name: str,
        input: Any = None,
        *,
        id: str | None = None,
        conn: AsyncConn | None = None,
    ) -> Started:
        """Start a run of workflow ``name`` with ``input``; idempotent by ``id``.

        A second start with an ``id`` already used starts nothing and answers
        ``created=False`` (whatever its input). With ``conn``, the run and its
        first job are written in the caller's open transaction.
        """
        spec = self._spec(name)
        run_id = str(uuid.uuid4()) if id is None else _run_id(id)
        created = await self._start(spec, run_id, _storable("input", input), None, conn)
        return Started(run_id, created)

    async def start_many(
        self,
        name: str,
        inputs: Sequence[Any],
        *,
        ids: Sequence[str] | None = None,
        conn: AsyncConn | None = None,
    ) -> list[Started]:
        """Start a run of workflow ``name`` for each input, in one transaction; idempotent by id.

        Runs and jobs are written a few hundred to a statement. ``ids``, when
        given, one per input: an id already used starts nothing again
        (``created=False``). Every input is checked before anything is
        written, so a bad one starts no run. With ``conn``, in the caller's
        open transaction.
        """
        spec = self._spec(name)
        if isinstance(inputs, str | bytes) or not isinstance(inputs, Sequence):
            raise InvalidInput("inputs", f"must be a list of inputs, got {type(inputs).__name__}")
        if ids is None:
            run_ids = [str(uuid.uuid4()) for _ in inputs]
        elif isinstance(ids, str | bytes) or len(ids) != len(inputs):
            raise InvalidInput("ids", "must be a list of run ids, one for each input")
        else:
            run_ids = [_run_id(i) for i in ids]
        texts = [_storable(f"inputs[{i}]", value) for i, value in enumerate(inputs)]
        now = self.boss.clock.sql_now()
        options = self._options(spec)
        trace = _trace()
        starts = [
            RunStart(run_id, spec.name, text, None, spec.queue, options, now, trace)
            for run_id, text in zip(run_ids, texts, strict=True)
        ]

        async def write(c: AsyncConn) -> list[bool]:
            created: list[bool] = []
            for first in range(0, len(starts), START_CHUNK):
                created += await self.store.start_many(starts[first : first + START_CHUNK], c)
            return created

        created = await self.boss.db.on(conn, write) if starts else []
        return [Started(r, c) for r, c in zip(run_ids, created, strict=True)]

    async def _start(
        self,
        spec: WorkflowSpec,
        run_id: str,
        data: str | None,
        done_key: str | None,
        conn: AsyncConn | None,
    ) -> bool:
        now = self.boss.clock.sql_now()
        return await self.store.start_run(
            run_id,
            spec.name,
            data,
            queue=spec.queue,
            options=self._options(spec),
            done_key=done_key,
            now=now,
            trace=_trace(),
            conn=conn,
        )

    async def signal(self, key: str, payload: Any = None, *, conn: AsyncConn | None = None) -> int:
        """Send an event to ``key``: delivered once, to one run's ``wait_for(key)``; its id.

        Kept until a run waits for it when none does yet. Also from SQL:
        ``SELECT shoal.signal('review:42', '{"ok": true}')``.
        """
        if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_LENGTH:
            raise InvalidInput("key", f"must be a string of 1 to {MAX_KEY_LENGTH} characters")
        text = _storable("payload", payload)
        return await self.store.signal(key, text, now=self.boss.clock.sql_now(), conn=conn)

    async def get(self, run_id: str) -> RunView:
        """A run and its steps; :class:`NotFound` when no run has that id."""
        run = await self.store.get_run(_run_id(run_id))
        if run is None:
            raise NotFound(f"no workflow run {run_id!r}", field="run_id")
        return RunView(run, await self.store.run_steps(run.id))

    async def list(
        self,
        *,
        name: str | None = None,
        status: RunStatus | str | None = None,
        before: tuple[datetime, str] | None = None,
        limit: int = 50,
    ) -> list[RunRow]:
        """Runs, newest first; ``before``: the (created_at, id) of the previous page's last run."""
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidInput("limit", f"must be 1 to {MAX_PAGE}, got {limit}")
        try:
            parsed = None if status is None else RunStatus(status)
        except ValueError:
            known = ", ".join(s.value for s in RunStatus)
            raise InvalidInput("status", f"{status!r} is not a run status ({known})") from None
        return await self.store.list_runs(name=name, status=parsed, before=before, limit=limit)

    async def cancel(self, run_id: str, *, by: str = "api", conn: AsyncConn | None = None) -> bool:
        """Cancel a run not finished: False when it had finished already.

        Its running step is stopped (the job running it is cancelled) and its
        sleep or wait ends; what it waited for (a batch task, a child run) is
        cancelled too; steps already finished stay as they are. All in one
        transaction (the caller's, with ``conn``): a crash leaves the run and
        what it waited for both cancelled or neither.
        """
        ident = _run_id(run_id)
        now = self.boss.clock.sql_now()
        if await self.boss.db.on(conn, lambda c: self._cancel(c, ident, by, now)):
            return True
        await self.get(run_id)  # NotFound for a run that does not exist
        return False

    async def _cancel(self, conn: AsyncConn, run_id: str, by: str, now: datetime | None) -> bool:
        cancelled = await self.store.cancel_run(conn, run_id, now=now)
        if cancelled is None:
            return False
        jobs, waited_for = cancelled
        if jobs:
            await self.boss.cancel([JobId(job) for job in jobs], by=by, conn=conn)
        if waited_for is not None and waited_for.startswith(TASK_KEY_PREFIX) and self.batches:
            with contextlib.suppress(Conflict, NotFound):  # closed meanwhile
                await self.batches.cancel_on(conn, waited_for.removeprefix(TASK_KEY_PREFIX))
        elif waited_for is not None and waited_for.startswith(CHILD_KEY_PREFIX):
            await self._cancel(conn, waited_for.removeprefix(CHILD_KEY_PREFIX), by, now)
        return True

    async def retry(self, run_id: str) -> bool:
        """Run a failed or cancelled run again from the step that failed; False if it was neither.

        The steps it finished keep their checkpoints and do not run again.
        """
        ident = _run_id(run_id)
        now = self.boss.clock.sql_now()

        async def reopen(c: AsyncConn) -> bool:
            name = await self.store.reopen_run(c, ident, now=now)
            if name is None:
                return False
            spec = self.specs.get(name)
            options = spec.job_options if spec is not None else {}
            await self.boss.send(queue_of(name), {"run": ident}, conn=c, **options)
            return True

        if await self.boss.db.run(reopen):
            return True
        await self.get(run_id)
        return False

    async def wait(
        self,
        run_id: str,
        *,
        timeout: timedelta,  # noqa: ASYNC109 - how long to poll the run
    ) -> RunView:
        """The run once it is completed, failed or cancelled; :class:`DeadlineExceeded` after
        ``timeout``."""
        deadline = asyncio.get_running_loop().time() + timeout.total_seconds()
        pause = 0.01
        while True:
            view = await self.get(run_id)
            if view.status in FINAL:
                return view
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise DeadlineExceeded(
                    f"workflow run {run_id!r} is still {view.status.value} after {timeout}"
                )
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, 0.5)

    def work(self, name: str) -> Worker:
        """Start running workflow ``name``'s jobs in this process.

        The first call also starts the worker that fails the runs whose jobs
        failed for good (:mod:`shoal.workflow.abandoned`).
        """
        spec = self._spec(name)
        if self._abandoned is None:
            self._abandoned = self.boss.work(DEAD_QUEUE, AbandonedRuns(self.store, self.boss))
        return self.boss.work(
            spec.queue, WorkflowRunner(self.runtime(spec), spec), concurrency=spec.concurrency
        )


def encode_cursor(run: RunRow) -> str:
    """An opaque cursor for the page after ``run``: its (created_at, id), as :meth:`Workflows.list`
    takes them in ``before``."""
    text = json.dumps([run.created_at.isoformat(), run.id], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(cursor: str, *, field: str = "cursor") -> tuple[datetime, str]:
    """The (created_at, id) a cursor of :func:`encode_cursor` carries; InvalidInput otherwise."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at, run_id = json.loads(raw)
        when = datetime.fromisoformat(at)
        if not isinstance(run_id, str) or when.tzinfo is None:
            raise ValueError(cursor)
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise InvalidInput(
            field, "is not a cursor shoal gave (pass next_cursor back as it came)"
        ) from None
    return when, run_id


def _trace() -> str | None:
    """The caller's trace context, for the data of a run's first job (None: tracing is off)."""
    headers = carrier()
    return None if headers is None else json.dumps({TRACE_KEY: headers})


def _storable(field: str, value: object) -> str | None:
    try:
        return encode_result(value)
    except UnstorableResult as exc:
        raise InvalidInput(field, f"cannot be stored as JSON: {exc}") from None


def _run_id(value: object) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_RUN_ID_LENGTH:
        raise InvalidInput("id", f"a run id is a string of 1 to {MAX_RUN_ID_LENGTH} characters")
    return value
