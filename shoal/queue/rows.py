"""The queue layer's rows as Python sees them: what a store's statements take and return.

Plain values, read by column position where a statement's columns are fixed;
a claim row (``claim_reader``) and a job row (``job_reader``) are read by
column name, for every statement and store that returns one. No SQL runs
here: the stores (:mod:`shoal.queue.store`, :mod:`shoal.queue.sync_store`)
run it.
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from shoal.db.queries import positions
from shoal.queue.options import JobOptions
from shoal.queue.retry import RetryPolicy
from shoal.queue.states import JobId, JobState


@dataclass(frozen=True, slots=True)
class JobSettings:
    """Everything about a new job but its payload and singleton key.

    Shared by every job sent with the same options, so a batch of 10,000
    usually carries one of these, sent to the database once.
    """

    queue: str
    priority: int
    retry_limit: int
    retry_delay: timedelta
    retry_backoff: bool
    retry_delay_max: timedelta
    expire_in: timedelta
    dead_letter: str | None
    start_at: datetime | None
    start_in: timedelta | None
    # The options the sender named (of QUEUE_DEFAULT_NAMES): these keep their
    # value, the others give way to the queue's stored defaults.
    given: frozenset[str] = frozenset()

    @classmethod
    def of(
        cls, queue: str, options: JobOptions, *, given: frozenset[str] = frozenset()
    ) -> JobSettings:
        """The settings of jobs sent to ``queue`` with ``options`` (already validated).

        ``given`` names the options the send named; the queue's defaults
        (``queue_default``) replace the others when the job is inserted.
        """
        start_after = options.start_after
        return cls(
            queue=queue,
            priority=options.priority,
            retry_limit=options.retry_limit,
            retry_delay=options.retry_delay,
            retry_backoff=options.retry_backoff,
            retry_delay_max=options.retry_delay_max,
            expire_in=options.expire_in,
            dead_letter=options.dead_letter,
            start_at=start_after if isinstance(start_after, datetime) else None,
            start_in=start_after if isinstance(start_after, timedelta) else None,
            given=given,
        )

    @property
    def runs_now(self) -> bool:
        return self.start_at is None and not self.start_in

    def params(self) -> dict[str, Any]:
        """The values of OPTION_COLUMNS by name, for a statement that sends jobs alike."""
        return dict(zip(OPTION_COLUMNS, self.row(), strict=True))

    def row(self) -> tuple[Any, ...]:
        """The values of OPTION_COLUMNS."""
        return (
            self.queue,
            self.priority,
            self.retry_limit,
            self.retry_delay.total_seconds(),
            self.retry_backoff,
            self.retry_delay_max.total_seconds(),
            self.expire_in.total_seconds(),
            self.dead_letter,
            self.start_at,
            None if self.start_in is None else self.start_in.total_seconds(),
            sum(GIVEN_BITS[name] for name in self.given),
        )


OPTION_COLUMNS = (
    "queue",
    "priority",
    "retry_limit",
    "retry_delay_s",
    "retry_backoff",
    "retry_delay_max_s",
    "expire_in_s",
    "dead_letter",
    "start_at",
    "start_in_s",
    "given",
)

# One bit per option a queue may default, set when the send named it: the
# insert statement (insert_jobs in queries.sql) tests these same numbers.
GIVEN_BITS = {
    "priority": 1,
    "retry_limit": 2,
    "retry_delay": 4,
    "retry_backoff": 8,
    "retry_delay_max": 16,
    "expire_in": 32,
    "dead_letter": 64,
}


class NewJob(NamedTuple):
    """A validated job, ready to insert. ``data`` is JSON text.

    ``partition_key`` None lets the insert take the key of a limited queue's
    jobs from their data (or give them ''); ``cost`` None is 1. A NamedTuple,
    like ClaimedJob: an insert of 10,000 jobs builds 10,000 of them, and a
    frozen dataclass sets each field through object.__setattr__.
    """

    settings: JobSettings
    data: str
    singleton_key: str | None = None
    partition_key: str | None = None
    cost: int | None = None


class ClaimedJob(NamedTuple):
    """A job a worker holds under a lease. ``attempt`` is its fencing token.

    A job taken by ``take_item_jobs_v2()`` (deleted already, a one-shot delivery) has
    no lease: ``lease_expires_at`` is None, and its heartbeats only push back
    the worker's local execution deadline.

    A NamedTuple rather than a frozen dataclass: one is built for every
    claimed job on the hot path, where a tuple is several times cheaper to
    make. The payload stays JSON text until someone reads ``data``.
    """

    id: JobId
    queue: str
    data_json: str
    priority: int
    attempt: int
    policy: RetryPolicy
    expire_in_s: float
    singleton_key: str | None
    dead_letter: str | None
    created_at: datetime
    started_at: datetime
    lease_expires_at: datetime | None

    @property
    def data(self) -> Any:
        return json.loads(self.data_json)

    @property
    def expire_in(self) -> timedelta:
        return timedelta(seconds=self.expire_in_s)


@dataclass(frozen=True, slots=True)
class ClaimedJobs:
    """What one claim statement took, and what the statement cost."""

    jobs: list[ClaimedJob]
    # Seconds on its connection, without the wait for one from the pool
    # (shoal.db.queries.fetch_named_timed).
    cost_s: float


@dataclass(frozen=True, slots=True)
class JobError:
    """One failed attempt, as recorded on the job."""

    attempt: int
    at: str
    type: str
    message: str
    traceback: str | None


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A job as stored, for inspection."""

    id: JobId
    queue: str
    state: JobState
    data: Any
    priority: int
    attempt: int
    policy: RetryPolicy
    expire_in: timedelta
    singleton_key: str | None
    dead_letter: str | None
    origin_queue: str | None
    origin_id: JobId | None
    start_after: datetime
    created_at: datetime
    started_at: datetime | None
    lease_expires_at: datetime | None
    finished_at: datetime | None
    output: Any
    errors: tuple[JobError, ...]
    # The registry id of the worker process that claimed it last (the
    # Workers page's row); None once it went back to waiting, or when the
    # claiming client keeps no registry row.
    holder: str | None = None


@dataclass(frozen=True, slots=True)
class Failure:
    """The outcome of a failed attempt, to be written fenced by ``attempt``."""

    id: JobId
    attempt: int
    state: JobState  # RETRY or FAILED
    retry_in: timedelta | None
    error: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ExpiredLease:
    id: JobId
    attempt: int
    policy: RetryPolicy
    lease_expires_at: datetime
    queue: str


@dataclass(frozen=True, slots=True)
class OrphanedJob:
    """An active job whose holding process stopped heartbeating, and who that was."""

    id: JobId
    attempt: int
    policy: RetryPolicy
    queue: str
    holder: str  # the process's registry id
    host: str
    pid: int
    app: str
    heartbeat_at: datetime  # its last heartbeat
    rescue_after_s: float  # its own setting


@dataclass(frozen=True, slots=True)
class QueueStateCount:
    queue: str
    state: JobState
    count: int
    oldest_waiting: timedelta | None


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    """A schedule as stored (list_schedules), paused or not."""

    name: str
    queue: str
    cron: str
    timezone: str
    data: Any
    options: Mapping[str, Any]
    last_tick: datetime
    db_now: datetime
    created_at: datetime
    updated_at: datetime
    paused_at: datetime | None
    owner: str | None  # the App that declared it, if one did
    last_job_id: JobId | None  # the job its latest tick sent
    last_job_state: JobState | None  # that job's state (None: gone, or no tick yet)

    @property
    def ticks(self) -> bool:
        """Whether the scheduler sends its jobs (a paused one waits to be resumed)."""
        return self.paused_at is None


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A worker process's row in the registry (shoal.queue.registry)."""

    id: str
    host: str
    pid: int
    app: str
    queues: dict[str, int]
    started_at: datetime
    heartbeat_at: datetime
    running: int
    done: int
    gone: bool
    # Jobs maintenance handed back because this process went silent, and when
    # it last did (0 and None for a process that never did).
    rescued: int = 0
    rescued_at: datetime | None = None


@functools.lru_cache(maxsize=256)
def retry_policy(limit: int, delay_s: float, backoff: bool, max_s: float) -> RetryPolicy:
    # Cached: a claim of a hundred jobs almost always carries one policy.
    return RetryPolicy(limit, timedelta(seconds=delay_s), backoff, timedelta(seconds=max_s))


# The claim row: the columns every claim of jobs returns, by these names
# (the claim row of shoal/queue/functions.sql). Other layers'
# claims (item jobs, ingest messages) return them too, and read them with
# claim_reader.
CLAIM_COLUMNS = (
    "id",
    "queue",
    "data",
    "priority",
    "attempt",
    "retry_limit",
    "retry_delay_s",
    "retry_backoff",
    "retry_delay_max_s",
    "expire_in_s",
    "singleton_key",
    "dead_letter",
    "created_at",
    "started_at",
    "lease_expires_at",
)


@functools.lru_cache(maxsize=64)
def claim_reader(columns: tuple[str, ...]) -> Callable[[Sequence[Any]], ClaimedJob]:
    """Reads a ClaimedJob from a row of a statement with these column names.

    The statement may return other columns too (a batch claim adds its
    item's); the claim row's are found by name once per statement shape, and
    each row is then read by position, as cheaply as a plain tuple.
    """
    pick = operator.itemgetter(*positions(columns, CLAIM_COLUMNS, what="a claim"))

    def read(row: Sequence[Any]) -> ClaimedJob:
        (id_, queue, data, priority, attempt, limit, delay, backoff, delay_max, expire_in,
         key, dead_letter, created_at, started_at, lease) = pick(row)  # fmt: skip
        return ClaimedJob(
            id_,
            queue,
            data,
            priority,
            attempt,
            retry_policy(limit, delay, backoff, delay_max),
            expire_in,
            key,
            dead_letter,
            created_at,
            started_at,
            lease,
        )

    return read


# The lean claim row of the worker's own claim (claim_jobs_v5 of
# shoal/queue/functions.sql): the claim row without what the worker knows (the
# queue it claimed, the lease's end: its start plus expire_in), with the times
# as seconds since the epoch.
LEAN_CLAIM_COLUMNS = (
    "id",
    "data",
    "priority",
    "attempt",
    "retry_limit",
    "retry_delay_s",
    "retry_backoff",
    "retry_delay_max_s",
    "expire_in_s",
    "singleton_key",
    "dead_letter",
    "created_at_s",
    "started_at_s",
)


@functools.lru_cache(maxsize=16)
def _lean_pick(columns: tuple[str, ...]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    return operator.itemgetter(*positions(columns, LEAN_CLAIM_COLUMNS, what="a lean claim"))


def lean_claims(
    columns: tuple[str, ...], rows: Sequence[Sequence[Any]], queue: str
) -> list[ClaimedJob]:
    """The ClaimedJobs of a claim of ``queue`` that returned lean claim rows.

    Each job is leased: its lease ends ``expire_in_s`` after its start. A
    claim starts every job at one time, and jobs sent together share their
    creation time, so each distinct time is made into a datetime (in UTC)
    once per claim.
    """
    pick = _lean_pick(columns)
    times: dict[float, datetime] = {}
    leases: dict[tuple[float, float], datetime] = {}
    jobs = []
    for row in rows:
        (id_, data, priority, attempt, limit, delay, backoff, delay_max, expire_in, key,
         dead_letter, created_s, started_s) = pick(row)  # fmt: skip
        created_at = times.get(created_s)
        if created_at is None:
            created_at = times[created_s] = datetime.fromtimestamp(created_s, UTC)
        started_at = times.get(started_s)
        if started_at is None:
            started_at = times[started_s] = datetime.fromtimestamp(started_s, UTC)
        lease = leases.get((started_s, expire_in))
        if lease is None:
            lease = leases[started_s, expire_in] = started_at + timedelta(seconds=expire_in)
        jobs.append(
            ClaimedJob(
                id_,
                queue,
                data,
                priority,
                attempt,
                retry_policy(limit, delay, backoff, delay_max),
                expire_in,
                key,
                dead_letter,
                created_at,
                started_at,
                lease,
            )
        )
    return jobs


# The job row: the columns every statement that reads whole jobs returns, by
# these names (get_job and list_jobs of queries.sql, the console's lists).
# Read with job_reader, whichever store runs the statement.
JOB_COLUMNS = (
    "id",
    "queue",
    "state",
    "data",
    "priority",
    "attempt",
    "retry_limit",
    "retry_delay_s",
    "retry_backoff",
    "retry_delay_max_s",
    "expire_in_s",
    "singleton_key",
    "dead_letter",
    "origin_queue",
    "origin_id",
    "start_after",
    "created_at",
    "started_at",
    "lease_expires_at",
    "finished_at",
    "output",
    "errors",
    "holder",
)


@functools.lru_cache(maxsize=64)
def job_reader(columns: tuple[str, ...]) -> Callable[[Sequence[Any]], JobRecord]:
    """Reads a JobRecord from a row of a statement with these column names.

    As :func:`claim_reader`: the job row's columns are found by name once per
    statement shape, so a statement may add columns or order them its own way,
    and one that lacks one is a RuntimeError naming it, not a shifted field.
    """
    pick = operator.itemgetter(*positions(columns, JOB_COLUMNS, what="a job row"))

    def read(row: Sequence[Any]) -> JobRecord:
        (id_, queue, state, data, priority, attempt, limit, delay, backoff, delay_max,
         expire_in, key, dead_letter, origin_queue, origin_id, start_after, created_at,
         started_at, lease, finished_at, output, errors, holder) = pick(row)  # fmt: skip
        return JobRecord(
            id=JobId(id_),
            queue=queue,
            state=JobState(state),
            data=data,
            priority=priority,
            attempt=attempt,
            policy=retry_policy(limit, delay, backoff, delay_max),
            expire_in=timedelta(seconds=expire_in),
            singleton_key=key,
            dead_letter=dead_letter,
            origin_queue=origin_queue,
            origin_id=None if origin_id is None else JobId(origin_id),
            start_after=start_after,
            created_at=created_at,
            started_at=started_at,
            lease_expires_at=lease,
            finished_at=finished_at,
            output=output,
            errors=tuple(
                JobError(e["attempt"], e["at"], e["type"], e["message"], e.get("traceback"))
                for e in errors
            ),
            holder=holder,
        )

    return read


def job_records(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[JobRecord]:
    """Every row of a statement that returns job rows (see :func:`job_reader`)."""
    read = job_reader(tuple(columns))
    return [read(row) for row in rows]


@dataclass(frozen=True, slots=True)
class QueueDefaultRow:
    """A queue's stored default options (None: no default for that option)."""

    queue: str
    options: Mapping[str, Any]
    updated_at: datetime


def queue_default_params(queue: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters of ``set_queue_default`` from validated options (durations as seconds)."""

    def seconds(name: str) -> float | None:
        value = options.get(name)
        return None if value is None else float(value.total_seconds())

    return {
        "queue": queue,
        "priority": options.get("priority"),
        "retry_limit": options.get("retry_limit"),
        "retry_delay_s": seconds("retry_delay"),
        "retry_backoff": options.get("retry_backoff"),
        "retry_delay_max_s": seconds("retry_delay_max"),
        "expire_in_s": seconds("expire_in"),
        "dead_letter": options.get("dead_letter"),
    }


def queue_default_row(row: Sequence[Any]) -> QueueDefaultRow:
    """A get_queue_default row: the options as ``set_queue_defaults`` takes them."""
    names = ("priority", "retry_limit", "retry_delay", "retry_backoff", "retry_delay_max")
    values = dict(zip((*names, "expire_in", "dead_letter"), row[1:8], strict=True))
    options = {
        k: timedelta(seconds=v) if k in ("retry_delay", "retry_delay_max", "expire_in") else v
        for k, v in values.items()
        if v is not None
    }
    return QueueDefaultRow(row[0], options, row[8])
