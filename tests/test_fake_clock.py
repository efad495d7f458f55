"""FakeClock: sleepers wake when the test moves the time, and a test can await a loop's wait."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from shoal import FakeClock

from .conftest import wait_for


async def test_wait_for_sleepers_returns_once_a_loop_waits_and_advance_wakes_it() -> None:
    clock = FakeClock()
    rounds: list[float] = []

    async def loop() -> None:
        for _ in range(2):
            rounds.append(clock.monotonic())
            await clock.sleep(10)

    waiter = asyncio.create_task(clock.wait_for_sleepers())  # runs first: nothing sleeps yet
    running = asyncio.create_task(loop())
    await asyncio.wait_for(waiter, 5)
    assert rounds == [0.0]
    clock.advance(timedelta(seconds=9))  # short of the deadline: it sleeps on
    clock.advance(timedelta(seconds=1))
    await wait_for(lambda: len(rounds) == 2)
    await asyncio.wait_for(clock.wait_for_sleepers(), 5)
    assert rounds == [0.0, 10.0]
    clock.advance(timedelta(seconds=10))
    await asyncio.wait_for(running, 5)


async def test_wait_for_sleepers_counts_the_sleepers() -> None:
    clock = FakeClock()
    both = asyncio.create_task(clock.wait_for_sleepers(2))
    first = asyncio.create_task(clock.sleep(5))
    await asyncio.wait_for(
        clock.wait_for_sleepers(1), 5
    )  # the first sleeps; `both` has looked again
    assert not both.done()
    second = asyncio.create_task(clock.sleep(5))
    await asyncio.wait_for(both, 5)
    clock.advance(timedelta(seconds=5))
    await asyncio.wait_for(asyncio.gather(first, second), 5)
