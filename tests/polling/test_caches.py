"""The poll step's read caches (D9): values live for their TTL, failed loads are not cached."""

from __future__ import annotations

from datetime import timedelta

import pytest

from shoal import FakeClock
from shoal_polling.caches import TtlCache


async def test_a_value_is_served_from_the_cache_until_its_ttl_passes() -> None:
    clock = FakeClock()
    cache: TtlCache[str, int] = TtlCache(timedelta(minutes=1), clock)
    loads: list[str] = []

    async def load(key: str) -> int:
        loads.append(key)
        return len(loads)

    assert await cache.get("a", load) == 1
    clock.advance(timedelta(seconds=59))
    assert await cache.get("a", load) == 1
    clock.advance(timedelta(seconds=1))
    assert await cache.get("a", load) == 2
    cache.invalidate("a")
    assert await cache.get("a", load) == 3
    assert loads == ["a", "a", "a"]


async def test_a_failed_load_is_not_cached() -> None:
    cache: TtlCache[str, int] = TtlCache(timedelta(minutes=1), FakeClock())
    calls = 0

    async def flaky(key: str) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise TimeoutError("database busy")
        return 7

    with pytest.raises(TimeoutError):
        await cache.get("reset_day", flaky)
    assert await cache.get("reset_day", flaky) == 7
    assert calls == 2
