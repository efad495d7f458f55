"""Limits across every worker process: global concurrency, rates, partitions by key.

A queue's limits are declared by the workers that serve it (``Shoal.work(...,
global_concurrency=..., rate_limit=..., partition_by=...)``), stored in the
``queue_limit`` table and enforced by the claim itself
(``claim_limited_jobs_v2``), so they hold however many processes claim. See
docs/limits.md.

>>> limits = Limits.of(global_concurrency=20, partition_by="account_id")
>>> limits.partition_field
'account_id'
>>> Rate(100, per=timedelta(seconds=1)).burst
100
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from shoal.errors import InvalidInput

# What a partition_by function receives (the job's data) and returns (its key,
# made a string by str()).
Partitioner = Callable[[Any], Any]
# Longest partition key kept; a longer one is refused when the job is sent.
MAX_PARTITION_KEY_LEN = 512


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``count`` job starts per ``per``, across all processes, with bursts.

    A token bucket: it holds up to ``burst`` tokens (default ``count``) and
    refills at ``count`` per ``per``; each start takes the job's ``cost``
    (default 1). A full bucket lets ``burst`` jobs start at once.

    >>> Rate(600, per=timedelta(minutes=1), burst=10).per_second
    10.0
    """

    count: int
    per: timedelta = timedelta(seconds=1)
    burst: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise InvalidInput("rate_limit.count", f"must be an integer >= 1, got {self.count!r}")
        per: object = self.per
        if isinstance(per, bool) or not isinstance(per, timedelta | int | float):
            raise InvalidInput("rate_limit.per", f"expected a timedelta or seconds, got {per!r}")
        if not isinstance(per, timedelta):
            object.__setattr__(self, "per", timedelta(seconds=per))
        if self.per <= timedelta(0):
            raise InvalidInput("rate_limit.per", f"must be > 0, got {per!r}")
        burst = self.burst
        if burst is None:
            object.__setattr__(self, "burst", self.count)
        elif isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
            raise InvalidInput("rate_limit.burst", f"must be an integer >= 1, got {burst!r}")

    @property
    def per_second(self) -> float:
        return self.count / self.per.total_seconds()

    @property
    def bucket(self) -> int:
        """The most tokens the bucket holds (``burst``)."""
        assert self.burst is not None  # set by __post_init__
        return self.burst


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits of one queue, applied to each partition (the whole queue if unpartitioned).

    ``global_concurrency``: at most this many active jobs per partition,
    across all processes. ``rate``: a :class:`Rate` of starts per partition.
    ``partition_by``: the field of the job data that names the partition, or
    a function of the data computed when the job is sent; None, one partition.
    """

    global_concurrency: int | None = None
    rate: Rate | None = None
    partition_by: str | Partitioner | None = None

    @classmethod
    def of(
        cls,
        *,
        global_concurrency: object = None,
        rate_limit: object = None,
        partition_by: object = None,
    ) -> Limits:
        """Validated limits; each bad value raises :class:`InvalidInput` naming it."""
        if global_concurrency is not None and (
            isinstance(global_concurrency, bool)
            or not isinstance(global_concurrency, int)
            or global_concurrency < 1
        ):
            raise InvalidInput(
                "global_concurrency", f"must be an integer >= 1, got {global_concurrency!r}"
            )
        if rate_limit is not None and not isinstance(rate_limit, Rate):
            raise InvalidInput(
                "rate_limit", f"expected a shoal.Rate (e.g. Rate(100, per=1.0)), got {rate_limit!r}"
            )
        if partition_by is not None:
            if isinstance(partition_by, str):
                if not partition_by or len(partition_by) > MAX_PARTITION_KEY_LEN:
                    raise InvalidInput(
                        "partition_by",
                        "a field name must be a non-empty string of at most "
                        f"{MAX_PARTITION_KEY_LEN} characters",
                    )
            elif not callable(partition_by):
                raise InvalidInput(
                    "partition_by",
                    "expected the name of a field of the job data (str) or a function of the "
                    f"data, got {type(partition_by).__name__} {partition_by!r}",
                )
        return cls(global_concurrency, rate_limit, partition_by)

    @property
    def partition_field(self) -> str | None:
        return self.partition_by if isinstance(self.partition_by, str) else None

    @property
    def partition_description(self) -> str | None:
        """How the queue is partitioned, for people: the field, or the function's name."""
        by = self.partition_by
        if by is None or isinstance(by, str):
            return by
        return f"function {getattr(by, '__qualname__', type(by).__name__)}"

    def __bool__(self) -> bool:
        return any(v is not None for v in (self.global_concurrency, self.rate, self.partition_by))


def partition_key_of(key: object, *, field: str = "partition_key") -> str:
    """A partition key as stored: a string, or InvalidInput naming why not."""
    if key is None or isinstance(key, bool) or not isinstance(key, str | int):
        raise InvalidInput(
            field, f"a partition key must be a string or an integer, got {type(key).__name__}"
        )
    text = str(key)
    if len(text) > MAX_PARTITION_KEY_LEN or "\x00" in text:
        raise InvalidInput(
            field, f"must be at most {MAX_PARTITION_KEY_LEN} characters, without NUL"
        )
    return text


# The batch layer's item queues are named so (BatchKind.queue): their jobs'
# data is {"item": id}, and the field a kind is partitioned by is in the
# item's data, which no job of the queue carries. The batch layer keys each
# item when its task is created and sends every job of the item with that
# key, so only the kind's own declaration can partition its queue.
ITEM_QUEUE_PREFIX = "batch."
HOOK_QUEUE_SUFFIX = ".on_complete"


def is_item_queue(queue: str) -> bool:
    """Whether ``queue`` holds a batch kind's item jobs (not its ``on_complete`` hooks)."""
    return queue.startswith(ITEM_QUEUE_PREFIX) and not queue.endswith(HOOK_QUEUE_SUFFIX)


def check_queue_limits(queue: str, limits: Limits) -> Limits:
    """Refuse limits the queue's jobs cannot honour: a partition of a batch kind's items
    declared on its queue rather than on the kind."""
    if is_item_queue(queue) and limits.partition_by is not None:
        raise InvalidInput(
            "partition_by",
            f"queue {queue!r} holds a batch kind's items, whose partition keys are given "
            "when their task is created: declare partition_by on the kind "
            "(BatchKind, @app.batch), not on its queue",
        )
    return limits


@dataclass(frozen=True, slots=True)
class LimitState:
    """One partition of a limited queue, as :meth:`Shoal.limits` reads it now.

    ``running`` counts its active jobs against ``global_concurrency``;
    ``tokens`` is what its rate bucket holds (None without a rate);
    ``paused_until`` is set while a handler's ``RetryAfter`` holds it back.
    A queue with no jobs and no bucket rows is listed once, with
    ``partition_key`` None.
    """

    queue: str
    partition_key: str | None
    global_concurrency: int | None
    rate: Rate | None
    partition_by: str | None
    running: int
    waiting: int
    tokens: float | None
    paused_until: datetime | None
