"""Job options and input validation: every bad value is named before anything is written."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict

from shoal.clock import SystemClock
from shoal.errors import InvalidInput
from shoal.queue.limits import partition_key_of

# Matched whole (fullmatch): with match(), "$" also matches before a final
# newline, which would let "q\n" through.
QUEUE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-/]{0,127}")

DEFAULT_RETRY_LIMIT = 2
DEFAULT_RETRY_DELAY = timedelta(0)
# With backoff and no delay given, the ladder starts here (1s, 2s, 4s, ...).
BACKOFF_BASE_WHEN_NO_DELAY = timedelta(seconds=1)
DEFAULT_RETRY_DELAY_MAX = timedelta(hours=1)
# pg-boss's default execution timeout.
DEFAULT_EXPIRE_IN = timedelta(minutes=15)
# Payloads carry ids, not documents.
DEFAULT_MAX_PAYLOAD_BYTES = 8 * 1024
MAX_PRIORITY = 1_000_000
MAX_SINGLETON_KEY_LEN = 512
# A job's cost against a rate is an integer column.
MAX_COST = 2**31 - 1
# retry_limit is an integer column too.
MAX_RETRY_LIMIT = 2**31 - 1

# The sane range of a job's times and durations (docs/queue.md, "Ranges"),
# checked alike by the SQL API (send_v2, shoal/queue/functions.sql). 100 years
# (of 365.25 days) keeps now plus any duration, and any start_after, a time
# both Python (to year 9999) and PostgreSQL hold in any session time zone,
# with some 7,800 years to spare; sums past it overflowed in Python
# (OverflowError) or in PostgreSQL (22008) before the field was named.
MAX_DURATION = timedelta(days=36_525)
MAX_DURATION_S = int(MAX_DURATION.total_seconds())
# The shortest execution timeout: PostgreSQL's intervals count microseconds,
# so a shorter one could round to no timeout at all.
MIN_EXPIRE_IN = timedelta(milliseconds=1)
# The earliest start_after time. A time in the past means "now"; one before
# 1970 is a mistake (a date read as something else), not a plan.
EARLIEST_START = datetime(1970, 1, 1, tzinfo=UTC)
# Only a range, never when a job runs: the wall clock, not a FakeClock.
_WALL_CLOCK = SystemClock()


@dataclass(frozen=True, slots=True)
class JobOptions:
    """Options of one job. Names follow pg-boss.

    ``expire_in`` is an execution timeout, counted from the moment the job
    becomes active (and from each heartbeat), never a queue-wait timeout.
    """

    retry_limit: int = DEFAULT_RETRY_LIMIT
    retry_delay: timedelta = DEFAULT_RETRY_DELAY
    retry_backoff: bool = False
    retry_delay_max: timedelta = DEFAULT_RETRY_DELAY_MAX
    expire_in: timedelta = DEFAULT_EXPIRE_IN
    singleton_key: str | None = None
    start_after: datetime | timedelta | None = None
    priority: int = 0
    dead_letter: str | None = None
    # Limits (docs/limits.md): the partition this job counts against, when
    # not taken from its data; what its start costs against a rate.
    partition_key: str | None = None
    cost: int = 1

    def merged(self, overrides: Mapping[str, Any]) -> JobOptions:
        """These options with ``overrides`` validated and applied."""
        return replace(self, **parse_options(overrides))


class SharedJobOptions(TypedDict, total=False):
    """Keyword options many jobs can share (``insert_many``); see :class:`JobOptions`.

    Durations are a ``timedelta`` or seconds.
    """

    retry_limit: int
    retry_delay: timedelta | float
    retry_backoff: bool
    retry_delay_max: timedelta | float
    expire_in: timedelta | float
    start_after: datetime | timedelta | float | None
    priority: int
    dead_letter: str | None
    partition_key: str | None
    cost: int


class SendOptions(SharedJobOptions, total=False):
    """Keyword options of one job (``send``): the shared ones and its ``singleton_key``.

    Typed, so a type checker catches ``retry_limt=3`` where it is written;
    at run time an unknown name is refused with :class:`InvalidInput`.
    """

    singleton_key: str | None


OPTION_NAMES = frozenset(f.name for f in fields(JobOptions))


class QueueDefaults(TypedDict, total=False):
    """Default options of every job sent to one queue (``App.handler``, ``set_queue_defaults``).

    A send that names an option keeps its own value; the others come from
    here, then from the client's defaults. A job's ``singleton_key`` and
    ``start_after`` belong to the job alone and have no queue default.
    """

    retry_limit: int
    retry_delay: timedelta | float
    retry_backoff: bool
    retry_delay_max: timedelta | float
    expire_in: timedelta | float
    priority: int
    dead_letter: str | None


# The options a queue may set defaults for, in the order of the queue_default
# table's columns (shoal/queue/migrations).
QUEUE_DEFAULT_NAMES = frozenset(QueueDefaults.__optional_keys__)
_PG_BOSS_SPELLINGS = {
    "retryLimit": "retry_limit",
    "retryDelay": "retry_delay",
    "retryBackoff": "retry_backoff",
    "expireInSeconds": "expire_in",
    "expireInMinutes": "expire_in",
    "singletonKey": "singleton_key",
    "startAfter": "start_after",
    "deadLetter": "dead_letter",
}


def check_queue_name(name: object, field: str = "queue") -> str:
    if isinstance(name, str) and name in _GOOD_NAMES:
        return name
    if not isinstance(name, str) or not QUEUE_NAME.fullmatch(name):
        raise InvalidInput(
            field,
            f"{name!r} is not a valid queue name: 1-128 letters, digits, "
            "'_', '.', '-' or '/', starting with a letter or digit",
        )
    if len(_GOOD_NAMES) < 10_000:
        _GOOD_NAMES.add(name)
    return name


# Names already checked: an insert of 10,000 jobs names one queue 10,000 times.
_GOOD_NAMES: set[str] = set()


# A JSON escape of NUL (not an escaped backslash followed by "u0000"):
# PostgreSQL's jsonb cannot hold NUL characters.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


# Built once: json.dumps with any non-default option builds an encoder per call,
# which would be half the cost of validating a 10,000-job insert.
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)


def encode_payload(data: object, *, max_bytes: int, field: str = "data") -> str:
    """``data`` as JSON text, or InvalidInput naming why it cannot be a payload."""
    try:
        text = _ENCODER.encode(data)
        # ASCII text (the usual payload) is its own UTF-8, and holds no lone
        # surrogate: only other text is encoded to be measured and checked.
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError (lone surrogates) is one
        raise InvalidInput(field, f"payload is not JSON: {exc}") from None
    except RecursionError:
        raise InvalidInput(field, "payload is nested too deeply") from None
    if "\\u0000" in text and _JSON_NUL.search(text):
        raise InvalidInput(field, "payload strings may not contain NUL characters")
    if size > max_bytes:
        raise InvalidInput(
            field,
            f"payload is {size} bytes, over the {max_bytes}-byte cap; "
            "send ids and load the documents in the handler",
        )
    return text


def shown(value: object) -> str:
    """``repr(value)`` for an error message, short for an integer too long to print.

    repr() of an integer past 4,300 digits raises ValueError, and one of
    hundreds of digits says less than its size.
    """
    if isinstance(value, int) and value.bit_length() > 256:
        return f"an integer of {value.bit_length()} bits"
    return repr(value)


def _duration(name: str, value: object, *, minimum: timedelta | None = None) -> timedelta:
    """A duration option as a timedelta, from 0 (or ``minimum``, above 0) to MAX_DURATION.

    Checked as seconds before the timedelta is built: timedelta(seconds=1e308)
    raises OverflowError and timedelta(seconds=1e-9) rounds to zero.
    """
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise InvalidInput(name, f"expected a timedelta or seconds, got {shown(value)}")
    # An int stays an int: float(10**400) itself overflows.
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, float) and math.isnan(seconds):
        raise InvalidInput(name, f"must be a number of seconds, got {value!r}")
    if seconds < 0 or (minimum is not None and seconds == 0):
        raise InvalidInput(
            name, f"must be {'>= 0' if minimum is None else '> 0'}, got {shown(value)}"
        )
    if minimum is not None and seconds < minimum.total_seconds():
        raise InvalidInput(
            name, f"must be at least {minimum.total_seconds():g} seconds, got {value!r}"
        )
    if seconds > MAX_DURATION_S:
        raise InvalidInput(
            name, f"must be at most {MAX_DURATION_S} seconds (100 years), got {shown(value)}"
        )
    return value if isinstance(value, timedelta) else timedelta(seconds=value)


def _start_time(name: str, value: datetime) -> datetime:
    """A start_after time: timezone-aware, from 1970 to 100 years from now."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInput(name, "a datetime must be timezone-aware")
    if not EARLIEST_START <= value <= _WALL_CLOCK.now() + MAX_DURATION:
        raise InvalidInput(
            name,
            "must be from 1970-01-01T00:00:00+00:00 to 100 years from now, "
            f"got {value.isoformat()}",
        )
    return value


def parse_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Validate option overrides; each error names the option and its value."""
    parsed: dict[str, Any] = {}
    for name, value in options.items():
        if name not in OPTION_NAMES:
            hint = _PG_BOSS_SPELLINGS.get(name)
            extra = (
                f"; did you mean {hint!r}?"
                if hint
                else f"; known: {', '.join(sorted(OPTION_NAMES))}"
            )
            raise InvalidInput(name, f"unknown job option{extra}")
        if name == "retry_limit":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidInput(name, f"must be an integer >= 0, got {value!r}")
            if value > MAX_RETRY_LIMIT:
                raise InvalidInput(
                    name, f"must be an integer from 0 to {MAX_RETRY_LIMIT}, got {shown(value)}"
                )
        elif name in ("retry_delay", "retry_delay_max"):
            value = _duration(name, value)
        elif name == "expire_in":
            value = _duration(name, value, minimum=MIN_EXPIRE_IN)
        elif name == "retry_backoff":
            if not isinstance(value, bool):
                raise InvalidInput(name, f"must be true or false, got {value!r}")
        elif name == "singleton_key":
            if value is not None and (
                not isinstance(value, str)
                or not value
                or len(value) > MAX_SINGLETON_KEY_LEN
                or "\x00" in value
            ):
                raise InvalidInput(
                    name,
                    f"must be a non-empty string of at most {MAX_SINGLETON_KEY_LEN} characters",
                )
        elif name == "start_after":
            if isinstance(value, datetime):
                value = _start_time(name, value)
            elif value is not None:
                value = _duration(name, value)
        elif name == "priority":
            if isinstance(value, bool) or not isinstance(value, int) or abs(value) > MAX_PRIORITY:
                raise InvalidInput(
                    name, f"must be an integer within ±{MAX_PRIORITY}, got {shown(value)}"
                )
        elif name == "dead_letter" and value is not None:
            check_queue_name(value, field=name)
        elif name == "partition_key" and value is not None:
            value = partition_key_of(value, field=name)
        elif name == "cost" and (
            isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COST
        ):
            raise InvalidInput(name, f"must be an integer from 1 to {MAX_COST}, got {shown(value)}")
        parsed[name] = value
    return parsed


def parse_queue_defaults(options: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a queue's default options: job options, less the ones only a job can have."""
    for name in options:
        if name in OPTION_NAMES and name not in QUEUE_DEFAULT_NAMES:
            raise InvalidInput(
                name, "is an option of one job and has no queue default; give it on each send"
            )
    return parse_options(options)
