"""A batch kind: the handler for one item and its options."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from shoal._deprecation import warn_renamed
from shoal.errors import InvalidInput, PermanentError
from shoal.queue.limits import HOOK_QUEUE_SUFFIX, ITEM_QUEUE_PREFIX, Limits, Partitioner, Rate
from shoal.queue.options import MAX_DURATION, check_queue_name, parse_options
from shoal.queue.registry import DEFAULT_RESCUE_AFTER
from shoal.queue.threaded import as_async

if TYPE_CHECKING:
    from shoal.batch.item import Item
    from shoal.batch.views import TaskView

# An ``async def``, or a plain ``def`` run in a thread pool of its own.
ItemHandler = Callable[["Item"], Any]
TaskHook = Callable[["TaskView"], Awaitable[None]]
Classifier = Callable[[BaseException], bool]

DEFAULT_CONCURRENCY = 10
DEFAULT_RETRY_LIMIT = 3
DEFAULT_RETRY_DELAY = timedelta(seconds=1)
# An execution timeout per item run, from the moment it starts.
DEFAULT_EXPIRE_IN = timedelta(minutes=30)
# How long a running item may go without a sign of life before the aggregator
# reaps it. Workers send one every quarter of this while the handler runs, so
# only a dead or frozen process misses it. The same as the queue's
# rescue_after (60 s), so a dead process's items come back as soon as its jobs
# do; it was 2 minutes, and a running item has no job left to rescue (its
# one-shot delivery is deleted at the claim).
DEFAULT_ZOMBIE_TIMEOUT = DEFAULT_RESCUE_AFTER


def check_kind_limits(
    kind: str, *, global_concurrency: object, rate_limit: object, partition_by: object
) -> Limits:
    """A batch kind's limits, validated as a queue's are (InvalidInput naming the option).

    ``partition_by`` is a field of the item's data or a function of it, as
    a queue's is of a job's: each item is keyed by it when its task is
    created, and keeps that key through every job of its runs.
    """
    try:
        return Limits.of(
            global_concurrency=global_concurrency,
            rate_limit=rate_limit,
            partition_by=partition_by,
        )
    except InvalidInput as exc:
        raise InvalidInput(exc.field, f"batch kind {kind!r}: {exc.message}") from None


@dataclass(frozen=True, slots=True)
class KindSettings:
    """What creating a task of a kind needs of it: the part of a :class:`BatchKind`
    that can be stored, so a creator without the kind's code can create its tasks.

    A worker's start stores its App's kinds (the ``batch_kind`` table), read
    by :class:`~shoal.batch.sync.SyncBatches` and ``create_task()`` in SQL.
    """

    name: str
    max_attempts: int
    zombie_timeout_s: float
    item_queue: str
    job_options: Mapping[str, Any]
    on_complete_queue: str | None
    # How its items are keyed when a task is created: by this field of each
    # item's data, or by a function (named here; run only where the kind's
    # code is). Both None: the kind is not partitioned.
    partition_field: str | None = None
    partition_function: str | None = None


@dataclass(frozen=True, slots=True)
class BatchKind:
    """What runs each item of a task of this kind, and how.

    ``retry_limit`` counts retries after the first run; a transient error puts
    the item back to pending and retries it with (exponential, jittered)
    backoff. Exceptions in ``permanent``, :class:`~shoal.PermanentError`, and
    any for which ``classify`` returns True mark the item ``error`` at once.

    ``concurrency`` counts in each worker process; ``global_concurrency`` and
    ``rate_limit`` hold the kind's items across every process (its item
    queue's limits, docs/limits.md): at most ``global_concurrency`` items run
    at once, and at most ``rate_limit`` start per period, each start costing
    one token unless the handler reports what its run really cost
    (:meth:`Item.report_cost <shoal.batch.item.Item.report_cost>`).
    ``partition_by`` (a field of the item's data, or a function of the data)
    counts both per key: each item is keyed when its task is created (an
    item may name its own key, ``{"ref", "data", "partition_key"}``), and
    keeps that key through its retries and re-sends.

    >>> kind = BatchKind("extract", handler=lambda item: None, global_concurrency=2)
    >>> kind.limits.global_concurrency
    2
    >>> BatchKind("call", handler=lambda item: None, rate_limit=Rate(60),
    ...           partition_by="model").settings.partition_field
    'model'
    """

    name: str
    handler: ItemHandler
    concurrency: int = DEFAULT_CONCURRENCY
    retry_limit: int = DEFAULT_RETRY_LIMIT
    retry_delay: timedelta = DEFAULT_RETRY_DELAY
    retry_backoff: bool = True
    expire_in: timedelta = DEFAULT_EXPIRE_IN
    zombie_timeout: timedelta = DEFAULT_ZOMBIE_TIMEOUT
    on_complete: TaskHook | None = None
    permanent: tuple[type[BaseException], ...] = ()
    classify: Classifier | None = None
    priority: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    global_concurrency: int | None = None
    rate_limit: Rate | None = None
    partition_by: str | Partitioner | None = None

    def __post_init__(self) -> None:
        check_queue_name(self.queue, field="kind")
        check_kind_limits(
            self.name,
            global_concurrency=self.global_concurrency,
            rate_limit=self.rate_limit,
            partition_by=self.partition_by,
        )
        for name in ("concurrency",):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidInput(name, f"must be an integer >= 1, got {value!r}")
        # A plain ``def`` item handler runs in threads of its own (shoal.queue.threaded).
        handler = as_async(self.handler, threads=self.concurrency, name=self.queue)
        object.__setattr__(self, "handler", handler)
        if not isinstance(self.retry_limit, int) or self.retry_limit < 0:
            raise InvalidInput("retry_limit", f"must be an integer >= 0, got {self.retry_limit!r}")
        for name in ("expire_in", "zombie_timeout"):
            value = getattr(self, name)
            if not isinstance(value, timedelta) or value <= timedelta(0):
                raise InvalidInput(name, f"must be a positive timedelta, got {value!r}")
        # The item jobs' options in the ranges of every job's (docs/queue.md,
        # "Ranges"): 40,000 days of retry_delay overflowed the first retry.
        parse_options(
            {
                "retry_limit": self.retry_limit,
                "retry_delay": self.retry_delay,
                "expire_in": self.expire_in,
                "priority": self.priority,
            }
        )
        if self.zombie_timeout > MAX_DURATION:
            raise InvalidInput(
                "zombie_timeout", f"must be at most 100 years, got {self.zombie_timeout!r}"
            )

    @property
    def limits(self) -> Limits:
        """The limits of this kind's item queue (falsy when it has none)."""
        return Limits(self.global_concurrency, self.rate_limit, self.partition_by)

    @property
    def partitioner(self) -> Partitioner | None:
        """The kind's ``partition_by`` function, when it is partitioned by one."""
        by = self.partition_by
        return None if by is None or isinstance(by, str) else by

    @property
    def queue(self) -> str:
        """The queue of this kind's item jobs."""
        return f"{ITEM_QUEUE_PREFIX}{self.name}"

    @property
    def hook_queue(self) -> str | None:
        return f"{ITEM_QUEUE_PREFIX}{self.name}{HOOK_QUEUE_SUFFIX}" if self.on_complete else None

    @property
    def max_attempts(self) -> int:
        """Deprecated: ``retry_limit + 1``, the most runs an item gets."""
        warn_renamed("BatchKind.max_attempts", "BatchKind.retry_limit + 1")
        return self.retry_limit + 1

    @property
    def job_options(self) -> dict[str, Any]:
        """The queue options of this kind's item jobs (JSON-safe: durations in seconds)."""
        return {
            "retry_limit": self.retry_limit,
            "retry_delay": self.retry_delay.total_seconds(),
            "retry_backoff": self.retry_backoff,
            "expire_in": self.expire_in.total_seconds(),
            "priority": self.priority,
        }

    @property
    def settings(self) -> KindSettings:
        """What creating a task of this kind needs of it (stored when a worker starts)."""
        limits = self.limits
        return KindSettings(
            name=self.name,
            max_attempts=self.retry_limit + 1,
            zombie_timeout_s=self.zombie_timeout.total_seconds(),
            item_queue=self.queue,
            job_options=self.job_options,
            on_complete_queue=self.hook_queue,
            partition_field=limits.partition_field,
            partition_function=None if self.partitioner is None else limits.partition_description,
        )

    def is_permanent(self, error: BaseException) -> bool:
        if isinstance(error, PermanentError | InvalidInput):
            return True
        if self.permanent and isinstance(error, self.permanent):
            return True
        return bool(self.classify and self.classify(error))
