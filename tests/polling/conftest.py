"""Fixtures of the polling app's tests: the domain schema and a small fleet on a test DB."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from shoal import Shoal, SystemClock
from shoal_polling.fleet import FleetSpec, create_fleet
from shoal_polling.schema import ensure_schema
from tests.polling.rig import Rig, open_rig

SMALL_FLEET = FleetSpec(accounts=2, cards_per_account=3, quota_kb=10_000, stop_percent=100)


@pytest.fixture
async def polling(boss: Shoal) -> AsyncIterator[Shoal]:
    """``boss`` with the polling schema and :data:`SMALL_FLEET` in place."""
    await ensure_schema(boss.db, today=SystemClock().now().date())
    await create_fleet(boss.db, SMALL_FLEET)
    yield boss


@pytest.fixture
async def rig(polling: Shoal) -> AsyncIterator[Rig]:
    """Pollers, a gateway and the app's pipeline on the ``polling`` fleet, closed after the test."""
    r = await open_rig(polling)
    try:
        yield r
    finally:
        await r.close()
