"""Which failures are worth another delivery, and how long to wait before it.

The reference's rule (decision D4): retryable errors (the database timing out
or dropping the connection, a lock or statement timeout, a serialization
failure, a deadline) are delivered again on a fixed ladder, 5s/15s/30s/1m/
2m/5m and then every 5 minutes, without limit; anything else is a business
error (not found, invalid data) that no retry can fix, acknowledged with a
WARN. Users add their own retryable classes per consumer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta

import psycopg

from shoal.db.pool import translate
from shoal.errors import TransientError

DELAY_LADDER: tuple[timedelta, ...] = tuple(timedelta(seconds=s) for s in (5, 15, 30, 60, 120, 300))
# From this attempt on, every redelivery is logged at ERROR.
LOUD_FROM_ATTEMPT = 10

RETRYABLE: tuple[type[BaseException], ...] = (
    TransientError,  # shoal's own: deadlines, dropped connections, lock/statement timeouts
    TimeoutError,
    asyncio.TimeoutError,
    ConnectionError,
    OSError,
)


def redelivery_delay(attempt: int, ladder: Sequence[timedelta] = DELAY_LADDER) -> timedelta:
    """The wait before delivery ``attempt + 1``, after delivery ``attempt`` (1-based) failed."""
    if attempt < 1:
        raise ValueError(f"attempt is 1-based, got {attempt}")
    return ladder[min(attempt, len(ladder)) - 1]


def is_retryable(error: BaseException, extra: tuple[type[BaseException], ...] = ()) -> bool:
    """True for errors that another delivery may get past (see the module docstring)."""
    if isinstance(error, psycopg.Error):
        error = translate(error)
    return isinstance(error, RETRYABLE + extra)
