"""How long database calls waited for a connection, and how many were slow.

A pool that is too small for the work in flight shows first as waiting:
calls queue for a connection, and an ORM that times the whole call (GORM's
slow-query log does, with its default threshold of 200 ms) reports each long
wait as a slow statement, though the server ran it in a millisecond.
:class:`CallTimes` records both views per call made through
:class:`~shoal.db.pool.Database`, when one is attached (``db.call_times``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta

SLOW_AFTER = timedelta(milliseconds=200)
SAMPLES_KEPT = 50_000


def quantile(samples: Iterable[float], q: float) -> float:
    """The ``q`` quantile of ``samples`` by nearest rank; 0.0 for none."""
    ordered = sorted(samples)
    if not ordered:
        return 0.0
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(slots=True)
class Reservoir:
    """A uniform sample of at most ``keep`` of the values added, for quantiles."""

    keep: int = SAMPLES_KEPT
    seen: int = 0
    values: list[float] = field(default_factory=list)
    _random: random.Random = field(default_factory=lambda: random.Random(0))

    def add(self, value: float) -> None:
        self.seen += 1
        if len(self.values) < self.keep:
            self.values.append(value)
            return
        slot = self._random.randrange(self.seen)
        if slot < self.keep:
            self.values[slot] = value

    def quantile(self, q: float) -> float:
        return quantile(self.values, q)


@dataclass(slots=True)
class CallTimes:
    """Per-call connection waits (a uniform sample of them) and slow-call counts.

    A call is slow when it took longer than ``slow_after`` from asking for a
    connection to giving it back: the time its caller saw.
    """

    slow_after: timedelta = SLOW_AFTER
    calls: int = 0
    slow: int = 0
    waits: Reservoir = field(default_factory=Reservoir)

    def record(self, *, wait_s: float, total_s: float) -> None:
        self.calls += 1
        if total_s > self.slow_after.total_seconds():
            self.slow += 1
        self.waits.add(wait_s)
