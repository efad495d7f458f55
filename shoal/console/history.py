"""The console's charts: the history samples of a queue (or of all) over a window.

The samples are written once per interval in the cluster by the queue
layer's sampler (:mod:`shoal.queue.history`, which says what each holds);
the console reads them here.

>>> resolution, samples = await History(boss).history(queue="email", window="1h")  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shoal.console.store import ConsoleStore
from shoal.errors import InvalidInput
from shoal.queue.client import Shoal
from shoal.queue.history import COARSE_S, FINE_S

# The console's windows: seconds, and the resolution drawn for each.
WINDOWS = {"15m": (900, FINE_S), "1h": (3600, FINE_S), "24h": (86400, COARSE_S)}
SERIES = (
    "completed",
    "failed",
    "waiting",
    "running",
    "retrying",
    "run_p50_s",
    "run_p95_s",
    "wait_p50_s",
    "wait_p95_s",
)
# The samples of every queue but shoal's own, and of every queue (shoal.queue.history).
ALL_QUEUES = "*"
EVERY_QUEUE = "**"


@dataclass(frozen=True, slots=True)
class Sample:
    at: datetime
    completed: int
    failed: int
    waiting: int
    running: int
    retrying: int
    run_p50_s: float | None
    run_p95_s: float | None
    wait_p50_s: float | None
    wait_p95_s: float | None

    def value(self, series: str) -> Any:
        return getattr(self, series)


def parse_window(window: str) -> tuple[int, int]:
    """``15m``, ``1h`` or ``24h`` as (seconds, resolution), or InvalidInput naming ``window``."""
    if window not in WINDOWS:
        raise InvalidInput("window", f"{window!r:.40} is not one of {', '.join(WINDOWS)}")
    return WINDOWS[window]


def parse_series(text: str | None) -> list[str]:
    """A comma-separated list of series names (all when empty), or InvalidInput."""
    if text is None or not text.strip():
        return list(SERIES)
    names = [part.strip() for part in text.split(",")]
    for name in names:
        if name not in SERIES:
            raise InvalidInput("series", f"{name!r:.40} is not one of {', '.join(SERIES)}")
    return names


class History:
    """Reads the history samples for the console's charts."""

    def __init__(self, boss: Shoal) -> None:
        self.clock = boss.clock
        self.console = ConsoleStore(boss.db)

    async def history(self, *, queue: str, window: str) -> tuple[int, list[Sample]]:
        """(resolution, samples) of ``queue`` (``*`` for all) over ``window``."""
        window_s, resolution = parse_window(window)
        rows = await self.console.history(
            queue=queue, resolution=resolution, window_s=window_s, now=self.clock.sql_now()
        )
        return resolution, [Sample(*r) for r in rows]


__all__ = [
    "ALL_QUEUES",
    "EVERY_QUEUE",
    "SERIES",
    "WINDOWS",
    "History",
    "Sample",
    "parse_series",
    "parse_window",
]
