"""The worker's last guard: a consumer that ends on an error is logged at once and run again."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import pytest

from shoal.clock import FakeClock
from shoal.ingest.supervisor import RESTART_PAUSE, _keep_running
from tests.conftest import wait_for


class BrokenOnce:
    """A consumer with a bug on its first run: ``run`` raises, the second run consumes."""

    def __init__(self) -> None:
        self.runs = 0
        self.running_again = asyncio.Event()

    async def run(self, stop: asyncio.Event, *, grace: timedelta) -> None:
        self.runs += 1
        if self.runs == 1:
            raise RuntimeError("a bug in the fetch loop")
        self.running_again.set()
        await stop.wait()


async def test_a_consumer_that_ends_on_an_error_is_logged_and_run_again(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="shoal.ingest")
    consumer = BrokenOnce()
    stop = asyncio.Event()
    kept: Any = consumer
    task = asyncio.create_task(
        _keep_running("consumer of t", kept, stop, grace=timedelta(seconds=1), clock=clock)
    )
    # Logged before the pause, not when the worker stops.
    await wait_for(lambda: "RuntimeError: a bug in the fetch loop" in caplog.text)  # the traceback
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "consumer of t stopped on an error" in record.getMessage()
    assert consumer.runs == 1
    clock.advance(RESTART_PAUSE)
    await asyncio.wait_for(consumer.running_again.wait(), 30)
    stop.set()
    await asyncio.wait_for(task, 30)
    assert consumer.runs == 2
