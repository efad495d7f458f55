"""Time, as shoal sees it: the one module allowed to read the real clock.

Every periodic duty and every time-dependent query takes a :class:`Clock`. In
production that is :class:`SystemClock`, whose ``sql_now()`` is ``None`` so the
database's own clock decides (one clock for every process, no skew between
hosts). Tests pass a :class:`FakeClock`; its time reaches the database through
the ``now`` parameter each such query takes, and it moves only when the test
calls :meth:`FakeClock.advance`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from shoal.errors import InvalidInput


class Clock(Protocol):
    """The seam through which shoal reads and waits on time."""

    def now(self) -> datetime:
        """The current time, timezone-aware."""
        ...

    def sql_now(self) -> datetime | None:
        """The time to bind into SQL, or ``None`` to let the database decide."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (for deadlines)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time."""
        ...


class SystemClock:
    """Real time. SQL uses the database clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def sql_now(self) -> datetime | None:
        return None

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class FakeClock:
    """A clock that moves only when told to.

    ``sleep`` waits until :meth:`advance` has moved the time past the sleeper's
    deadline, so a test drives periodic loops step by step without real waits;
    :meth:`wait_for_sleepers` awaits a loop reaching its wait.

    >>> clock = FakeClock(datetime(2026, 1, 1, tzinfo=UTC))
    >>> clock.advance(timedelta(seconds=5))
    >>> clock.now().second
    5
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._start = self._now
        # Notified by advance() and by each sleep as it starts; each sleeper
        # re-checks its deadline, each wait_for_sleepers() the number of sleepers.
        self._moved: asyncio.Condition | None = None
        self._sleepers = 0

    def now(self) -> datetime:
        return self._now

    def sql_now(self) -> datetime | None:
        return self._now

    def monotonic(self) -> float:
        return (self._now - self._start).total_seconds()

    def advance(self, delta: timedelta) -> None:
        if delta < timedelta(0):
            raise InvalidInput("delta", f"a clock does not go backwards, got {delta}")
        self._now += delta
        if self._moved is not None:
            moved = self._moved

            async def notify() -> None:
                async with moved:
                    moved.notify_all()

            asyncio.get_running_loop().create_task(notify())

    def sleep(self, seconds: float) -> Coroutine[Any, Any, None]:
        # The deadline counts from the call, not from when the coroutine first
        # runs: a sleep wrapped in a task (asyncio.ensure_future, as a worker's
        # idle wait does) starts later, and an advance() in between must not
        # push its deadline back (the sleeper would then wait past it).
        return self._sleep_until(self._now + timedelta(seconds=max(0.0, seconds)))

    async def wait_for_sleepers(self, count: int = 1) -> None:
        """Return once ``count`` coroutines wait in :meth:`sleep` (a loop has reached its wait)."""
        moved = self._condition()
        async with moved:
            await moved.wait_for(lambda: self._sleepers >= count)

    async def _sleep_until(self, deadline: datetime) -> None:
        moved = self._condition()
        async with moved:
            self._sleepers += 1
            moved.notify_all()
            try:
                await moved.wait_for(lambda: self._now >= deadline)
            finally:
                self._sleepers -= 1

    def _condition(self) -> asyncio.Condition:
        if self._moved is None:
            self._moved = asyncio.Condition()
        return self._moved


SYSTEM_CLOCK = SystemClock()


def work_seconds() -> float:
    """Seconds on the real monotonic clock, whichever :class:`Clock` is in use.

    For how long a piece of work took, and for pacing by that cost (how much
    of a worker's time its claims from the head of the queue may take), never
    for when something is due. A :class:`FakeClock` moved while a claim ran
    is not time the database spent on it: measured on that clock, one
    ``advance()`` of six minutes during a claim made the claim look six
    minutes dear, and the worker then held off claiming from the head for two
    hours of the test's time.
    """
    return time.monotonic()
