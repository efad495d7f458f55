"""The per-account limit and a 429's hold hold across pollers, not only inside one.

Two pollers share the schedule in the database, each with its own claim, as
two processes would. The gateway keeps every call waiting until the test lets
them go, so the polls in flight at each moment are known exactly: with a
limit of 2 per account, the second poller finds no room while the first
holds both slots of each account (a per-process limit would let it start 2
more of each), and the gateway never has 3 calls of one account at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from datetime import timedelta
from typing import Any

import httpx

from shoal import FakeClock, Pipeline, Shoal, SystemClock
from shoal_polling.domain import MODE_KEY, Kind
from shoal_polling.gateway import Gateway, GatewaySettings, build_gateway_app
from shoal_polling.gateway_client import GatewayClient
from shoal_polling.ingest import PollingIngest
from shoal_polling.poller import Poller, PollerSettings
from tests.conftest import wait_for
from tests.polling.conftest import SMALL_FLEET
from tests.polling.rig import ONCE, scalar

LIMIT = 2


class GatedGateway(Gateway):
    """The simulator, holding every call until ``gate`` is open, counting calls per account."""

    def __init__(self, settings: GatewaySettings, **kwargs: Any) -> None:
        super().__init__(settings, **kwargs)
        self.gate = asyncio.Event()
        self.in_flight: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.refuse: dict[str, int] = {}  # account -> Retry-After of its next call, once

    def admit(self, account: str) -> bool:
        return account not in self.refuse and super().admit(account)

    def retry_after(self, account: str) -> int:
        return self.refuse.pop(account, None) or super().retry_after(account)

    async def query(self, account: str, card: str, kind: Kind) -> dict[str, Any] | None:
        self.in_flight[account] += 1
        self.peak[account] = max(self.peak[account], self.in_flight[account])
        try:
            await self.gate.wait()
            return await super().query(account, card, kind)
        finally:
            self.in_flight[account] -= 1


async def in_flight_by_account(boss: Shoal) -> dict[str, int]:
    async def run(conn: Any) -> dict[str, int]:
        cur = await conn.execute(
            "SELECT c.account_id, count(*) FROM shoal_polling.due d"
            " JOIN shoal_polling.card c ON c.id = d.card_id"
            " WHERE d.leased_until > now() GROUP BY c.account_id"
        )
        return {row[0]: row[1] for row in await cur.fetchall()}

    return await boss.db.run(run, transaction=False)


async def two_pollers(
    boss: Shoal, sim: Gateway, settings: PollerSettings, clock: FakeClock | None = None
) -> tuple[Poller, Poller, GatewayClient, Pipeline]:
    client = GatewayClient(
        "http://gateway", transport=httpx.ASGITransport(app=build_gateway_app(sim))
    )
    pipeline = Pipeline(boss, mode_key=MODE_KEY)
    await pipeline.start()
    ingest = PollingIngest(boss.db, pipeline, plan_interval=settings.plan_interval)
    first, second = (
        Poller(boss.db, pipeline, ingest, client, settings=settings, clock=clock) for _ in range(2)
    )
    return first, second, client, pipeline


async def test_a_second_poller_finds_no_room_in_an_account_the_first_fills(
    polling: Shoal,
) -> None:
    sim = GatedGateway(GatewaySettings(latency_ms=0.0, rate_limit=0.0))
    settings = dataclasses.replace(ONCE, account_concurrency=LIMIT)
    first, second, client, pipeline = await two_pollers(polling, sim, settings)
    accounts = SMALL_FLEET.accounts
    steps = accounts * SMALL_FLEET.cards_per_account * 4
    try:
        assert await first.run_once() == LIMIT * accounts
        assert sorted((await in_flight_by_account(polling)).values()) == [LIMIT] * accounts
        # Every slot of every account is the first poller's: none for the second.
        assert await second.run_once() == 0

        # Open the gate; as slots come back, both pollers take turns until all are done.
        sim.gate.set()
        polled = LIMIT * accounts
        for _ in range(steps):
            if polled == steps:
                break
            for poller in (first, second):
                await poller.drain()
            for poller in (second, first):
                polled += await poller.run_once()
        await first.drain()
        await second.drain()
        assert polled == steps
        assert await in_flight_by_account(polling) == {}
    finally:
        await client.close()
        await pipeline.close()

    assert max(sim.peak.values()) <= LIMIT, f"more than {LIMIT} calls of an account: {sim.peak}"
    assert first.stats.polls + second.stats.polls == steps
    assert second.stats.polls > 0
    done = await scalar(polling, "SELECT count(*) FROM shoal_polling.due WHERE due_at > now()")
    assert done == steps


async def test_a_429_one_poller_gets_holds_the_account_for_every_poller(polling: Shoal) -> None:
    clock = FakeClock(SystemClock().now())  # the fleet's steps are due at the real now
    sim = GatedGateway(GatewaySettings(latency_ms=0.0, rate_limit=0.0), clock=clock)
    sim.gate.set()
    settings = dataclasses.replace(ONCE, max_in_flight=1)
    first, second, client, pipeline = await two_pollers(polling, sim, settings, clock)
    held, other = await scalar(
        polling, "SELECT array_agg(id ORDER BY id) FROM shoal_polling.account"
    )
    # The held account's steps are due first, so an unheld claim would take them first.
    await scalar(
        polling,
        "UPDATE shoal_polling.due d SET due_at = due_at - interval '1 hour'"
        " FROM shoal_polling.card c"
        " WHERE c.id = d.card_id AND c.account_id = %s AND d.step <> 'plan'",
        (held,),
    )
    sim.refuse[held] = 30
    try:
        assert await first.run_once() == 1
        # Its call is refused with Retry-After: 30, and the poll waits out the hold.
        await wait_for(lambda: first.account_waits == 1, 30)
        until = await scalar(
            polling, "SELECT held_until FROM shoal_polling.account WHERE id = %s", (held,)
        )
        assert until == clock.now() + timedelta(seconds=30)

        # The second poller has never seen a 429, yet takes only the other account's steps.
        claimed = await second.run_once()
        assert claimed == 1
        assert await in_flight_by_account(polling) == {held: 1, other: 1}
        await wait_for(lambda: second.in_flight == 0, 30)
        await second.flush()
        while await second.run_once():
            await wait_for(lambda: second.in_flight == 0, 30)
            await second.flush()
        assert await in_flight_by_account(polling) == {held: 1}

        # Once the hold has passed, the held account's steps are claimed again.
        clock.advance(timedelta(seconds=31))
        assert await second.run_once() == 1
        assert (await in_flight_by_account(polling)).get(held) == 2
        await first.drain()
        await second.drain()
    finally:
        await client.close()
        await pipeline.close()
    assert first.stats.rate_limited == 1 and second.stats.rate_limited == 0
