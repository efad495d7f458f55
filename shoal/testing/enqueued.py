"""Assertions on what a queue holds: ``assert_enqueued`` and ``refute_enqueued``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from shoal.errors import InvalidInput
from shoal.queue.client import Shoal
from shoal.queue.rows import JobRecord
from shoal.queue.states import JobState

# Most jobs a failure message lists.
SHOWN_JOBS = 20

_WAITING = (JobState.CREATED, JobState.RETRY)
# Most jobs read from a queue to check, or to show in a failure message.
ENQUEUED_SCAN = 1000


def _data_matches(expected: Any, actual: Any) -> bool:
    """Equal; for mappings, every expected key present with a matching value."""
    if isinstance(expected, Mapping) and isinstance(actual, Mapping):
        return all(k in actual and _data_matches(v, actual[k]) for k, v in expected.items())
    return bool(expected == actual)


async def _enqueued(client: Shoal, queue: str, states: Iterable[JobState | str]) -> list[JobRecord]:
    jobs: list[JobRecord] = []
    for state in states:
        jobs.extend(await client.jobs(queue, state=state, limit=ENQUEUED_SCAN))
    return sorted(jobs, key=lambda j: j.id)


def _matching(jobs: Sequence[JobRecord], data: Any, options: Mapping[str, Any]) -> list[JobRecord]:
    found = []
    for job in jobs:
        if data is not _ANY and not _data_matches(data, job.data):
            continue
        if any(_option(job, name) != value for name, value in options.items()):
            continue
        found.append(job)
    return found


def _option(job: JobRecord, name: str) -> Any:
    if name in ("retry_limit", "retry_delay", "retry_backoff", "retry_delay_max"):
        return getattr(job.policy, name)
    if name in ("priority", "singleton_key", "dead_letter", "expire_in", "start_after"):
        return getattr(job, name)
    raise InvalidInput(
        name,
        f"cannot match on {name!r}; use priority, singleton_key, dead_letter, expire_in, "
        "start_after or a retry_* option",
    )


_ANY: Any = object()


def _listing(queue: str, states: Sequence[JobState | str], jobs: Sequence[JobRecord]) -> str:
    names = "/".join(str(s) for s in states)
    if not jobs:
        return f"no {names} jobs in queue {queue!r}"
    lines = [f"{len(jobs)} {names} job(s) in queue {queue!r}:"]
    lines += [
        f"  id={j.id} state={j.state} data={j.data!r} priority={j.priority}"
        + (f" singleton_key={j.singleton_key!r}" if j.singleton_key else "")
        for j in jobs[:SHOWN_JOBS]
    ]
    if len(jobs) > SHOWN_JOBS:
        lines.append(f"  ... and {len(jobs) - SHOWN_JOBS} more")
    return "\n".join(lines)


async def assert_enqueued(
    client: Shoal,
    queue: str,
    data: Any = _ANY,
    *,
    count: int | None = None,
    states: Sequence[JobState | str] = _WAITING,
    **options: Any,
) -> list[JobRecord]:
    """Assert that ``queue`` holds a job waiting to run whose data matches; return the matches.

    ``data`` matches when equal, or for a mapping, when each of its keys is
    in the job's data with a matching value (so ``{"user_id": 7}`` matches
    ``{"user_id": 7, "locale": "fr"}``). ``options`` (``priority=``,
    ``singleton_key=``, ``retry_limit=``, ...) must equal the job's. With
    ``count``, exactly that many must match. ``states`` defaults to waiting
    (``created`` and ``retry``). On failure the message lists what was
    enqueued.

    >>> await assert_enqueued(boss, "email", {"user_id": 7}, priority=5)  # doctest: +SKIP
    """
    jobs = await _enqueued(client, queue, states)
    found = _matching(jobs, data, options)
    if (count is None and not found) or (count is not None and len(found) != count):
        want = [] if data is _ANY else [f"data={data!r}"]
        want += [f"{k}={v!r}" for k, v in options.items()]
        expected = "a job" if count is None else f"{count} job(s)"
        raise AssertionError(
            f"expected {expected} in queue {queue!r}"
            + (f" with {', '.join(want)}" if want else "")
            + f", found {len(found)}; "
            + _listing(queue, states, jobs)
        )
    return found


async def refute_enqueued(
    client: Shoal,
    queue: str,
    data: Any = _ANY,
    *,
    states: Sequence[JobState | str] = _WAITING,
    **options: Any,
) -> None:
    """Assert that ``queue`` holds no waiting job matching ``data`` and ``options``.

    Matching is as in :func:`assert_enqueued`; with no ``data`` and no
    options, the queue must hold no waiting job at all.
    """
    jobs = await _enqueued(client, queue, states)
    found = _matching(jobs, data, options)
    if found:
        want = [] if data is _ANY else [f"data={data!r}"]
        want += [f"{k}={v!r}" for k, v in options.items()]
        raise AssertionError(
            f"expected no job in queue {queue!r}"
            + (f" with {', '.join(want)}" if want else "")
            + f", found {len(found)}; "
            + _listing(queue, states, found)
        )
