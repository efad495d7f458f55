"""The JSON shapes of the console's ``/v1`` routes (queues, jobs, schedules,
topics), as documented in ``docs/api.md``. Times are ISO 8601 strings."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

JobReasonName = Literal[
    "scheduled", "retry_wait", "queue_paused", "due", "running", "lease_passed", "finished"
]
JobStateName = Literal["created", "retry", "active", "completed", "cancelled", "failed"]


class QueueOut(BaseModel):
    queue: str
    counts: dict[str, int] = Field(description="Jobs per state.")
    oldest_waiting_s: float | None = Field(description="Age of the oldest job that could run.")
    paused: bool
    paused_at: str | None = None
    completed_5m: int = Field(0, description="Jobs completed in the last five minutes.")
    failed_5m: int = Field(0, description="Jobs failed for good in the last five minutes.")
    throughput_per_min: float = Field(0.0, description="completed_5m per minute.")
    estimated: list[str] = Field(
        default_factory=list,
        description=(
            "States whose counts are the planner's estimates (completed and cancelled, once "
            "the job table holds more than 200,000 jobs); empty when every count is exact."
        ),
    )


class QueueList(BaseModel):
    queues: list[QueueOut]


class QueueAction(BaseModel):
    queue: str
    paused: bool


class BulkDone(BaseModel):
    queue: str
    count: int = Field(description="Jobs retried (or deleted) now.")


class JobErrorOut(BaseModel):
    attempt: int
    at: str
    type: str
    message: str
    traceback: str | None = None


class JobSummary(BaseModel):
    id: int
    queue: str
    state: JobStateName
    attempt: int
    retry_limit: int
    priority: int
    singleton_key: str | None
    created_at: str
    started_at: str | None
    finished_at: str | None
    error: str | None = Field(description="The last attempt's error message, if any.")


class JobPageOut(BaseModel):
    jobs: list[JobSummary]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page.")


class JobOut(JobSummary):
    data: Any = None
    output: Any = None
    errors: list[JobErrorOut]
    start_after: str
    lease_expires_at: str | None
    holder: str | None = Field(
        description="The worker process that claimed it last (its id on the Workers page); "
        "null once the job went back to waiting."
    )
    dead_letter: str | None
    origin_queue: str | None
    origin_id: int | None
    retry_delay_s: float
    retry_backoff: bool
    retry_delay_max_s: float = Field(description="The longest delay backoff grows to.")
    expire_in_s: float
    wait_s: float | None = Field(description="From created to the start of the last attempt.")
    run_s: float | None = Field(description="From the last attempt's start to its end.")
    reason: JobReasonName | None = Field(
        None,
        description=(
            "Why the job is where it is (GET only): scheduled (start_after to come), "
            "retry_wait (its retry delay running), queue_paused, due (waiting for a "
            "worker), running, lease_passed (maintenance hands it back), finished."
        ),
    )
    queue_paused_at: str | None = Field(None, description="When its queue was paused (GET only).")
    now: str | None = Field(None, description="The server's time the reason was judged at.")


class Deleted(BaseModel):
    id: int
    deleted: bool


class ScheduleOut(BaseModel):
    name: str
    queue: str
    cron: str
    timezone: str
    data: Any = None
    paused: bool
    paused_at: str | None
    owner: str | None = Field(description="The App that declared it, if any.")
    last_run: str = Field(description="The latest tick sent (or, before any, when created).")
    next_run: str | None = Field(description="The next tick; null while paused.")
    last_job_id: int | None
    last_job_state: JobStateName | None
    created_at: str
    updated_at: str


class ScheduleList(BaseModel):
    schedules: list[ScheduleOut]


class ScheduleAction(BaseModel):
    name: str
    paused: bool | None = None
    removed: bool = False


class TopicOut(BaseModel):
    topic: str
    depth: int
    ready: int
    in_flight: int
    delayed: int
    oldest_age_s: float | None
    wait_s: float | None
    paused: bool
    checked_at: str | None = Field(description="When the backlog monitor last looked.")
    dead: int = Field(description="Dead letters waiting for a redrive.")
    consumers: int = Field(0, description="Consumer slots of live workers on this topic.")


class TopicList(BaseModel):
    topics: list[TopicOut]


class DeadLetterOut(BaseModel):
    id: int
    message_id: str
    reason: str
    error: str
    attempt: int
    dead_at: str
    redriven_at: str | None
    envelope: Any = None


class DeadPageOut(BaseModel):
    dead: list[DeadLetterOut]
    next_cursor: str | None


class Redrive(BaseModel):
    """``POST /v1/topics/{name}/redrive``: the letters of ``ids``, or all waiting ones."""

    model_config = {"extra": "forbid", "strict": True}

    ids: list[int] | None = Field(default=None, min_length=1, max_length=10_000)


class Discarded(BaseModel):
    topic: str
    id: int
    message_id: str
    discarded: bool


class Redriven(BaseModel):
    topic: str
    redriven: int


class WorkerOut(BaseModel):
    id: str
    host: str
    pid: int
    app: str
    queues: dict[str, int] = Field(description="Each queue served and its concurrency.")
    started_at: str
    heartbeat_at: str
    running: int = Field(description="Jobs claimed and not yet finished.")
    done: int = Field(description="Jobs completed or failed since the process started.")
    gone: bool = Field(
        description="No heartbeat for longer than the gone timeout (or its rescue_after)."
    )
    rescued: int = Field(
        description="Its jobs handed back by maintenance because its heartbeat stopped."
    )
    rescued_at: str | None = Field(description="When maintenance last handed some back.")


class WorkerList(BaseModel):
    workers: list[WorkerOut]


class RunningOut(BaseModel):
    what: Literal["job", "item"] = Field(description="A job, or a batch item.")
    id: int = Field(description="The job's id, or the item's.")
    queue: str = Field(description="The job's queue; an item's kind's queue, batch.<kind>.")
    task_id: str | None = Field(description="An item's task.")
    ref: str | None = Field(description="An item's ref.")
    attempt: int
    started_at: str
    lease_expires_at: str | None = Field(description="A job's lease (an item's is its heartbeat).")
    preview: str = Field(description="The start of the payload's JSON.")


class WorkerDetailOut(WorkerOut):
    running_now: list[RunningOut] = Field(
        description="The jobs and batch items it runs now, oldest first, up to the limit."
    )
    truncated: bool = Field(description="More were running than the limit shows.")


class HistoryOut(BaseModel):
    queue: str = Field(
        description="The queue, or * for all but shoal's own, or ** for all (?internal=true)."
    )
    window: str
    resolution_s: int = Field(description="Seconds between samples.")
    at: list[str]
    series: dict[str, list[float | None]] = Field(
        description="One value per sample time: counts per interval, depths, seconds."
    )


class OverviewCounts(BaseModel):
    failed_jobs: int
    dead_letters: int
    open_tasks: int
    live_workers: int
    paused_queues: int


class DatabaseOut(BaseModel):
    state: Literal["writable", "stalled", "failed"] = Field(
        description=(
            "writable: a probe write committed within 2 s; stalled: the database answers "
            "but the commit did not complete (a synchronous standby may be down); failed: "
            "the probe could not run (no connection, a refused write)."
        )
    )
    message: str = Field(description="What is wrong, as /readyz says it; empty when writable.")


class OverviewOut(BaseModel):
    counts: OverviewCounts
    history: HistoryOut
    database: DatabaseOut
