"""A 429 with Retry-After holds the whole account in the poller, on a fake clock.

The gateway limits each account to one call a second (a bucket of one) and
its clock, like the poller's, moves only when the test advances it. Each
account's first call is answered and its second (the next round's) gets a 429 with
``Retry-After: 1``: from then on no call of that account reaches the gateway
until the clock has passed that second (without the hold, every remaining
step of the account would be called, and refused, at once). The refused poll
calls again after the hold, so no observation is lost to the limit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import timedelta

import httpx

from shoal import FakeClock, Pipeline, Shoal, SystemClock
from shoal_polling.domain import MODE_KEY
from shoal_polling.gateway import Gateway, GatewaySettings, build_gateway_app
from shoal_polling.gateway_client import GatewayClient
from shoal_polling.ingest import PollingIngest
from shoal_polling.poller import Poller
from tests.conftest import wait_for
from tests.polling.conftest import SMALL_FLEET
from tests.polling.rig import ONCE

SECOND = timedelta(seconds=1)


@dataclass(frozen=True)
class Call:
    account: str
    at: float  # the gateway's clock
    retry_after: int | None  # a 429's, else None


class RecordingGateway(Gateway):
    """The simulator, keeping each call's account, time and (for a 429) Retry-After."""

    calls: list[Call]

    def admit(self, account: str) -> bool:
        admitted = super().admit(account)
        retry = None if admitted else self.retry_after(account)
        self.calls.append(Call(account, self.clock.monotonic(), retry))
        return admitted


async def test_a_429_holds_every_call_of_its_account_until_retry_after(polling: Shoal) -> None:
    clock = FakeClock(SystemClock().now())  # the fleet's steps are due at the real now
    sim = RecordingGateway(GatewaySettings(latency_ms=0.0, rate_limit=1.0, burst=1.0), clock=clock)
    sim.calls = []
    client = GatewayClient(
        "http://gateway", transport=httpx.ASGITransport(app=build_gateway_app(sim))
    )
    pipeline = Pipeline(polling, mode_key=MODE_KEY)
    await pipeline.start()
    ingest = PollingIngest(polling.db, pipeline, plan_interval=ONCE.plan_interval)
    # One call per account at a time, so "the account's next call" is well defined.
    settings = dataclasses.replace(ONCE, account_concurrency=1)
    poller = Poller(polling.db, pipeline, ingest, client, settings=settings, clock=clock)
    accounts = SMALL_FLEET.accounts
    try:
        # One step per account at a time (the account's limit), each a call.
        await polling.db.run(
            lambda conn: conn.execute(
                "UPDATE shoal_polling.due SET due_at = %s + interval '1 day' WHERE step = 'plan'",
                (clock.now(),),
            )
        )
        assert await poller.run_once() == accounts
        await wait_for(lambda: not poller.in_flight, 30)
        assert await poller.run_once() == accounts
        # Each account: one answer, one 429, then its next poll waits for the hold.
        await wait_for(lambda: poller.account_waits == accounts, 30)
        assert sorted(c.retry_after or 0 for c in sim.calls) == [0] * accounts + [1] * accounts
        assert sim.stats.limited == accounts and sim.stats.answered == accounts
        assert len(poller.held_accounts()) == accounts
        assert poller.stats.rate_limited == accounts and poller.stats.gateway_errors == 0

        # While held, the claim takes no step of a held account, even one due now.
        await polling.db.run(
            lambda conn: conn.execute("UPDATE shoal_polling.due SET due_at = %s", (clock.now(),))
        )
        assert await poller.run_once() == 0

        # The clock moves a second at a time, a round each; every poll ends in an observation.
        for _ in range(200):
            await poller.run_once()
            if not poller.in_flight:
                break
            await wait_for(lambda: not poller.in_flight or poller.account_waits > 0, 30)
            calls = len(sim.calls)
            clock.advance(SECOND)
            # A held poll woke and called (or the last polls finished).
            await wait_for(lambda: len(sim.calls) > calls or not poller.in_flight, 30)  # noqa: B023
        assert not poller.in_flight, "polls still waiting after 200 s of fake time"
        await poller.drain()
    finally:
        await client.close()
        await pipeline.close()

    # No call of an account came before a 429's Retry-After had passed.
    for account in {c.account for c in sim.calls}:
        of_account = [c for c in sim.calls if c.account == account]
        for i, refused in enumerate(of_account):
            if refused.retry_after is not None:
                later = of_account[i + 1 :]
                early = [c for c in later if c.at < refused.at + refused.retry_after]
                assert not early, f"{account}: called during the hold: {early}"
    # Every refused poll called again and got its observation: none failed.
    assert poller.stats.gateway_errors == 0
    assert poller.stats.observations == sim.stats.answered
    assert poller.stats.rate_limited == sim.stats.limited >= accounts
    sample = poller.metrics.registry.get_sample_value
    for account in {c.account for c in sim.calls}:
        limited = sum(1 for c in sim.calls if c.account == account and c.retry_after)
        labels = {"account": account}
        assert sample("shoal_polling_gateway_rate_limited_total", labels) == limited
        assert sample("shoal_polling_account_pauses_total", labels) == limited
