"""What happens after an attempt: one pure function from outcome to next state."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from shoal.queue.options import BACKOFF_BASE_WHEN_NO_DELAY
from shoal.queue.states import JobState


class Jitter(Protocol):
    """A source of uniform numbers in [0, 1): ``random.Random`` fits."""

    def random(self) -> float: ...


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    retry_limit: int
    retry_delay: timedelta
    retry_backoff: bool
    retry_delay_max: timedelta


@dataclass(frozen=True, slots=True)
class NextStep:
    state: JobState
    start_after: datetime | None  # when the job may run again; None when finished


def retry_delay(attempt: int, policy: RetryPolicy, jitter: Jitter) -> timedelta:
    """The wait before the next attempt, after ``attempt`` (1-based) failed.

    Without backoff the delay is fixed. With backoff it doubles per attempt
    from ``retry_delay`` (1 s when that is zero), capped at ``retry_delay_max``,
    and "equal jitter" spreads it over [d/2, d) so a burst of failures does
    not come back as a burst.
    """
    if not policy.retry_backoff:
        return min(policy.retry_delay, policy.retry_delay_max)
    base = policy.retry_delay or BACKOFF_BASE_WHEN_NO_DELAY
    # Doubled in float seconds and capped before it becomes a timedelta again:
    # 2**attempt times a delay overflows timedelta within a few dozen attempts.
    doubled_s = base.total_seconds() * 2.0 ** min(attempt - 1, 1000)
    full = timedelta(seconds=min(doubled_s, policy.retry_delay_max.total_seconds()))
    return full / 2 + full / 2 * jitter.random()


def after_failure(
    attempt: int, policy: RetryPolicy, now: datetime, jitter: Jitter, *, permanent: bool = False
) -> NextStep:
    """The state a job takes after its ``attempt``-th run failed.

    ``retry_limit`` counts retries, so a job runs at most ``retry_limit + 1``
    times; a permanent failure ends it at once.
    """
    if permanent or attempt > policy.retry_limit:
        return NextStep(JobState.FAILED, None)
    return NextStep(JobState.RETRY, now + retry_delay(attempt, policy, jitter))


SYSTEM_JITTER: Jitter = random.Random()
