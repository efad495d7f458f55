"""FakeClock: waits on it end when the test moves the time, and a test can await a loop's wait.

The waits here are the consumer loop's (sleep_or_stop: the clock's wait
raced against a stop event), so the clock is driven through code shoal runs.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from shoal import FakeClock
from shoal.ingest.consumer_base import sleep_or_stop

from .conftest import wait_for


async def test_wait_for_sleepers_returns_once_a_loop_waits_and_advance_wakes_it() -> None:
    clock = FakeClock()
    stop = asyncio.Event()
    rounds: list[float] = []

    async def loop() -> None:
        for _ in range(2):
            rounds.append(clock.monotonic())
            await sleep_or_stop(stop, 10, clock)

    waiter = asyncio.create_task(clock.wait_for_sleepers())  # runs first: nothing waits yet
    running = asyncio.create_task(loop())
    await asyncio.wait_for(waiter, 5)
    assert rounds == [0.0]
    clock.advance(timedelta(seconds=9))  # short of the deadline: it waits on
    clock.advance(timedelta(seconds=1))
    await wait_for(lambda: len(rounds) == 2)
    await asyncio.wait_for(clock.wait_for_sleepers(), 5)
    assert rounds == [0.0, 10.0]
    clock.advance(timedelta(seconds=10))
    await asyncio.wait_for(running, 5)


async def test_wait_for_sleepers_counts_the_waits() -> None:
    clock = FakeClock()
    stop = asyncio.Event()
    both = asyncio.create_task(clock.wait_for_sleepers(2))
    first = asyncio.create_task(sleep_or_stop(stop, 5, clock))
    # The first waits; `both` has looked again and still waits for a second.
    await asyncio.wait_for(clock.wait_for_sleepers(1), 5)
    assert not both.done()
    second = asyncio.create_task(sleep_or_stop(stop, 5, clock))
    await asyncio.wait_for(both, 5)
    clock.advance(timedelta(seconds=5))
    await asyncio.wait_for(asyncio.gather(first, second), 5)
