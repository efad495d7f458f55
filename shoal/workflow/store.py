"""The only code that runs the workflow layer's SQL: one typed function per statement."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar, cast

from shoal.db.coalesce import Coalescer
from shoal.db.pool import AsyncConn, Database
from shoal.db.queries import load_queries
from shoal.queue.options import JobOptions
from shoal.workflow.states import RunStatus, StepKind, StepStatus


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What a run recorded of one step, as a replay reads it."""

    seq: int
    name: str
    kind: StepKind
    status: StepStatus
    attempts: int
    result: Any
    error: str | None


@dataclass(frozen=True, slots=True)
class Begun:
    """A run as the job that resumes it took it."""

    id: str
    name: str
    input: Any
    epoch: int
    checkpoints: dict[int, Checkpoint]


@dataclass(frozen=True, slots=True)
class RunRow:
    id: str
    name: str
    status: RunStatus
    input: Any
    result: Any
    error: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    wait_key: str | None
    epoch: int

    def as_dict(self) -> dict[str, Any]:
        """The run as JSON shows it (the API's, and ``shoal workflows show --json``)."""
        return {
            "id": self.id,
            "name": self.name,
            "status": self.status.value,
            "input": self.input,
            "result": self.result,
            "error": self.error,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
            "finished_at": _iso(self.finished_at),
            "wait_key": self.wait_key,
        }


@dataclass(frozen=True, slots=True)
class StepRow:
    seq: int
    name: str
    kind: StepKind
    status: StepStatus
    attempts: int
    result: Any
    error: str | None
    started_at: datetime
    finished_at: datetime | None

    @property
    def until(self) -> str | None:
        """When a sleep ends, or a wait not over yet gives up (None: no such time)."""
        if not isinstance(self.result, dict):
            return None
        if self.kind is StepKind.SLEEP:
            until = self.result.get("until")
        elif self.kind is StepKind.WAIT:
            until = self.result.get("deadline")
        else:
            return None
        return until if isinstance(until, str) else None

    def as_dict(self) -> dict[str, Any]:
        """The step as JSON shows it."""
        return {
            "seq": self.seq,
            "name": self.name,
            "kind": self.kind.value,
            "status": self.status.value,
            "attempts": self.attempts,
            "result": self.result,
            "error": self.error,
            "started_at": self.started_at.isoformat(),
            "finished_at": _iso(self.finished_at),
            "until": self.until,
        }


@dataclass(frozen=True, slots=True)
class StepRecord:
    """A checkpoint to write: the step's place, what it is, and how it ended so far."""

    seq: int
    name: str
    kind: StepKind
    status: StepStatus
    attempts: int = 0
    result: str | None = None  # JSON text
    error: str | None = None
    started: datetime | None = None
    finished: datetime | None = None


@dataclass(frozen=True, slots=True)
class RunStart:
    """A run to create, with the settings of the job that runs it."""

    id: str
    name: str
    input: str | None  # JSON text
    done_key: str | None
    queue: str
    options: JobOptions
    now: datetime | None
    trace: str | None = None  # JSON text: the starter's trace context, merged into the job's data


@dataclass(frozen=True, slots=True)
class RunEnd:
    """How a run held at ``epoch`` ended."""

    run: str
    epoch: int
    status: RunStatus
    result: str | None  # JSON text
    error: str | None
    now: datetime | None


K = TypeVar("K", bound=Hashable)
R = TypeVar("R")
Out = TypeVar("Out")


async def in_rounds(
    requests: Sequence[R],
    key: Callable[[R], K],
    run_round: Callable[[Sequence[R]], Awaitable[list[Out]]],
) -> list[Out]:
    """``run_round`` over rounds of requests with distinct keys, in order; results in order.

    A batched statement takes each run (or step) once; a key repeated in a
    batch (two starts of one id) goes to the next round, so it sees what the
    round before it wrote, as it would have one call after the other.
    """
    rounds: list[list[int]] = []
    keys: list[set[K]] = []
    for i, request in enumerate(requests):
        k = key(request)
        for taken, members in zip(keys, rounds, strict=True):
            if k not in taken:
                taken.add(k)
                members.append(i)
                break
        else:
            keys.append({k})
            rounds.append([i])
    results: list[Out | None] = [None] * len(requests)
    for members in rounds:
        for i, out in zip(members, await run_round([requests[i] for i in members]), strict=True):
            results[i] = out
    return cast(list[Out], results)


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat()


def _run_row(row: tuple[Any, ...]) -> RunRow:
    return RunRow(
        id=row[0],
        name=row[1],
        status=RunStatus(row[2]),
        input=row[3],
        result=row[4],
        error=row[5],
        created_at=row[6],
        updated_at=row[7],
        finished_at=row[8],
        wait_key=row[9],
        epoch=row[10],
    )


def _checkpoint(cell: list[Any]) -> Checkpoint:
    seq, name, kind, status, attempts, result, error = cell
    return Checkpoint(seq, name, StepKind(kind), StepStatus(status), attempts, result, error)


class WorkflowStore:
    """Typed access to the workflow tables of one schema."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.sql = load_queries("shoal.workflow", db.schema)
        # Concurrent runs' hot-path writes share round trips and commits.
        self._starts = Coalescer(self.start_many, name="shoal-workflow-starts")
        self._begins = Coalescer(self._begin_many, name="shoal-workflow-begins")
        self._records = Coalescer(self._record_many, name="shoal-workflow-checkpoints")
        self._finishes = Coalescer(self._finish_many, name="shoal-workflow-ends")

    async def _rows(
        self, name: str, params: Mapping[str, Any], conn: AsyncConn | None = None
    ) -> list[tuple[Any, ...]]:
        return await self.db.fetch(self.sql[name], params, conn)

    async def start_run(
        self,
        run_id: str,
        name: str,
        data: str | None,
        *,
        queue: str,
        options: JobOptions,
        done_key: str | None = None,
        now: datetime | None,
        trace: str | None = None,
        conn: AsyncConn | None = None,
    ) -> bool:
        """A new run and its job (sent with ``options``); False when the id is taken.

        ``done_key``: the event the run's end sends (a child's to its parent);
        ``trace``: the starter's trace context, as JSON text. Without
        ``conn``, concurrent starts share one statement and commit.
        """
        start = RunStart(run_id, name, data, done_key, queue, options, now, trace)
        if conn is None:
            return await self._starts.submit(start)
        return (await self.start_many([start], conn))[0]

    async def begin_run(self, run_id: str, job: int, *, now: datetime | None) -> Begun | None:
        """Take the run for this job (the next epoch) with its checkpoints; None: not its turn.

        Concurrent takes share one statement.
        """
        return await self._begins.submit((run_id, job, now))

    async def begin_waiting_run(self, key: str, job: int, *, now: datetime | None) -> Begun | None:
        """:meth:`begin_run` for the run waiting for ``key`` (a batch task's completion)."""
        rows = await self._rows("begin_waiting_run", {"key": key, "job": job, "now": now})
        if not rows:
            return None
        run_id, name, data, epoch, steps = rows[0]
        return Begun(run_id, name, data, epoch, {c.seq: c for c in map(_checkpoint, steps)})

    async def record_step(
        self, run_id: str, epoch: int, step: StepRecord, conn: AsyncConn | None = None
    ) -> bool:
        """Write a checkpoint; False when this runner no longer holds the run (fenced).

        Without ``conn``, concurrent runs' checkpoints share one statement and commit.
        """
        if conn is None:
            return await self._records.submit((run_id, epoch, step))
        return (await self._record_many([(run_id, epoch, step)], conn))[0]

    async def suspend_run(
        self,
        conn: AsyncConn,
        run_id: str,
        epoch: int,
        *,
        status: RunStatus,
        wake_job: int | None,
        seq: int,
        key: str | None,
        now: datetime | None,
    ) -> bool:
        params = {
            "run": run_id,
            "epoch": epoch,
            "status": status.value,
            "wake_job": wake_job,
            "seq": seq,
            "key": key,
            "now": now,
        }
        return bool(await self._rows("suspend_run", params, conn))

    async def finish_run(
        self,
        run_id: str,
        epoch: int,
        *,
        status: RunStatus,
        result: str | None,
        error: str | None,
        now: datetime | None,
    ) -> bool:
        """End a run held at ``epoch``; False when it is not (fenced). Concurrent ends share one."""
        return await self._finishes.submit(RunEnd(run_id, epoch, status, result, error, now))

    # -- the batched statements: each takes requests with distinct keys -------

    async def start_many(
        self, starts: Sequence[RunStart], conn: AsyncConn | None = None
    ) -> list[bool]:
        """:meth:`start_run` for each of ``starts``, in one statement (more if an id repeats)."""

        async def one_round(round_: Sequence[RunStart]) -> list[bool]:
            options = [s.options for s in round_]
            params = {
                "ids": [s.id for s in round_],
                "names": [s.name for s in round_],
                "inputs": [s.input for s in round_],
                "done_keys": [s.done_key for s in round_],
                "queues": [s.queue for s in round_],
                "retry_limits": [o.retry_limit for o in options],
                "retry_delays_s": [o.retry_delay.total_seconds() for o in options],
                "retry_backoffs": [o.retry_backoff for o in options],
                "retry_delay_maxes_s": [o.retry_delay_max.total_seconds() for o in options],
                "expires_in_s": [o.expire_in.total_seconds() for o in options],
                "dead_letters": [o.dead_letter for o in options],
                "traces": [s.trace for s in round_],
                "nows": [s.now for s in round_],
            }
            created = {row[0] for row in await self._rows("start_runs", params, conn)}
            return [s.id in created for s in round_]

        return await in_rounds(starts, lambda s: s.id, one_round)

    async def _begin_many(
        self, begins: Sequence[tuple[str, int, datetime | None]]
    ) -> list[Begun | None]:
        async def one_round(
            round_: Sequence[tuple[str, int, datetime | None]],
        ) -> list[Begun | None]:
            params = {
                "runs": [run for run, _, _ in round_],
                "jobs": [job for _, job, _ in round_],
                "nows": [now for _, _, now in round_],
            }
            begun = {
                run_id: Begun(
                    run_id, name, data, epoch, {c.seq: c for c in map(_checkpoint, steps)}
                )
                for run_id, name, data, epoch, steps in await self._rows("begin_runs", params)
            }
            return [begun.get(run) for run, _, _ in round_]

        return await in_rounds(begins, lambda b: b[0], one_round)

    async def _record_many(
        self, records: Sequence[tuple[str, int, StepRecord]], conn: AsyncConn | None = None
    ) -> list[bool]:
        async def one_round(round_: Sequence[tuple[str, int, StepRecord]]) -> list[bool]:
            steps = [step for _, _, step in round_]
            params = {
                "runs": [run for run, _, _ in round_],
                "epochs": [epoch for _, epoch, _ in round_],
                "seqs": [s.seq for s in steps],
                "names": [s.name for s in steps],
                "kinds": [s.kind.value for s in steps],
                "statuses": [s.status.value for s in steps],
                "attempts": [s.attempts for s in steps],
                "results": [s.result for s in steps],
                "errors": [s.error for s in steps],
                "started": [s.started for s in steps],
                "finished": [s.finished for s in steps],
            }
            written = {(row[0], row[1]) for row in await self._rows("record_steps", params, conn)}
            return [(run, step.seq) in written for run, _, step in round_]

        return await in_rounds(records, lambda r: (r[0], r[2].seq), one_round)

    async def _finish_many(self, ends: Sequence[RunEnd]) -> list[bool]:
        async def one_round(round_: Sequence[RunEnd]) -> list[bool]:
            params = {
                "runs": [e.run for e in round_],
                "epochs": [e.epoch for e in round_],
                "statuses": [e.status.value for e in round_],
                "results": [e.result for e in round_],
                "errors": [e.error for e in round_],
                "nows": [e.now for e in round_],
            }
            finished = {row[0] for row in await self._rows("finish_runs", params)}
            return [e.run in finished for e in round_]

        return await in_rounds(ends, lambda e: e.run, one_round)

    async def fail_abandoned_run(
        self, run_id: str, job: int | None, error: str, *, now: datetime | None
    ) -> bool:
        """Fail a run whose job ``job`` failed for good, unless another job holds it now."""
        params = {"run": run_id, "job": job, "error": error, "now": now}
        return bool(await self._rows("fail_abandoned_run", params))

    async def take_event(
        self, conn: AsyncConn, run_id: str, seq: int, key: str, *, now: datetime | None
    ) -> tuple[bool, Any]:
        """Lock the key against signals, then take its oldest untaken event: (found, payload)."""
        await self._rows("lock_event_key", {"key": key}, conn)
        rows = await self._rows(
            "take_event", {"run": run_id, "seq": seq, "key": key, "now": now}, conn
        )
        return (True, rows[0][0]) if rows else (False, None)

    async def signal(
        self, key: str, payload: str | None, *, now: datetime | None, conn: AsyncConn | None
    ) -> int:
        rows = await self._rows("signal", {"key": key, "payload": payload, "now": now}, conn)
        return int(rows[0][0])

    async def cancel_run(
        self, conn: AsyncConn, run_id: str, *, now: datetime | None
    ) -> tuple[list[int], str | None] | None:
        """Cancel a run not finished: the jobs holding or waking it, and the key it waited for.

        None when nothing was cancelled (finished, or no such run).
        """
        rows = await self._rows("cancel_run", {"run": run_id, "now": now}, conn)
        if not rows:
            return None
        job, wake_job, wait_key, _signalled = rows[0]
        return [j for j in (job, wake_job) if j is not None], wait_key

    async def reopen_run(self, conn: AsyncConn, run_id: str, *, now: datetime | None) -> str | None:
        """A failed or cancelled run back to pending; its workflow's name (None: not reopened)."""
        rows = await self._rows("reopen_run", {"run": run_id, "now": now}, conn)
        return str(rows[0][1]) if rows else None

    async def get_run(self, run_id: str) -> RunRow | None:
        rows = await self._rows("get_run", {"run": run_id})
        return _run_row(rows[0]) if rows else None

    async def run_steps(self, run_id: str) -> list[StepRow]:
        rows = await self._rows("run_steps", {"run": run_id})
        return [
            StepRow(r[0], r[1], StepKind(r[2]), StepStatus(r[3]), r[4], r[5], r[6], r[7], r[8])
            for r in rows
        ]

    async def list_runs(
        self,
        *,
        name: str | None,
        status: RunStatus | None,
        before: tuple[datetime, str] | None,
        limit: int,
    ) -> list[RunRow]:
        params = {
            "name": name,
            "status": None if status is None else status.value,
            "before_at": None if before is None else before[0],
            "before_id": None if before is None else before[1],
            "limit": limit,
        }
        return [_run_row(r) for r in await self._rows("list_runs", params)]

    async def count_open_runs(self, *, cap: int) -> list[tuple[str, RunStatus, int]]:
        """(workflow, status, runs) of unfinished and failed runs, counting at most ``cap``."""
        rows = await self._rows("count_open_runs", {"cap": cap})
        return [(str(name), RunStatus(status), int(n)) for name, status, n in rows]


def dumps(value: Any) -> str:
    """JSON text of a value already checked storable (inputs, payloads)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
