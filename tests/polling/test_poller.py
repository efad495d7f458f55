"""The poller: due steps polled once per round, per-account concurrency, sync and async
ingest through the same apply, priority items on the sync path, risk stops, the plan
step's skip, backpressure and the read caches."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, cast

from shoal import PublishError, Shoal
from shoal.ingest.postgres import PostgresTransport
from shoal.ingest.transport import Transport
from shoal_polling.domain import ACCOUNT_CONCURRENCY, OBSERVATIONS, Kind
from shoal_polling.fleet import FleetSpec, create_fleet
from shoal_polling.gateway import GatewaySettings
from shoal_polling.poller import add_priority_item
from tests.conftest import wait_for
from tests.polling.conftest import SMALL_FLEET
from tests.polling.rig import Rig, open_rig, scalar

CARDS = SMALL_FLEET.accounts * SMALL_FLEET.cards_per_account
STATUS_STEPS = 3  # traffic, card status, real-name: one observation each per round


async def applied(boss: Shoal) -> int:
    return int(await scalar(boss, "SELECT count(*) FROM shoal_polling.applied_observation"))


async def records(boss: Shoal) -> int:
    return int(await scalar(boss, "SELECT count(*) FROM shoal_polling.collection_record"))


async def test_sync_mode_applies_every_observation_within_the_poll(rig: Rig) -> None:
    assert await rig.round() == CARDS * 4
    assert await applied(rig.boss) == CARDS * STATUS_STEPS
    assert rig.poller.stats.observations == CARDS * STATUS_STEPS
    # Nothing is due again before its interval.
    assert await rig.round() == 0
    # The collection records went through the topic: the sink writes them.
    rig.start_consumers()
    await wait_for(lambda: _at_least(records(rig.boss), CARDS * STATUS_STEPS), 15)


async def test_async_mode_publishes_and_the_consumer_applies_with_the_same_code(
    rig: Rig,
) -> None:
    await rig.set_mode("async")
    await rig.round()
    assert await applied(rig.boss) == 0, "async mode only calls the gateway and publishes"
    depth = await rig.pipeline.transport.depth(OBSERVATIONS.name, "shoal")
    assert depth.total == CARDS * STATUS_STEPS
    rig.start_consumers()
    await wait_for(lambda: _at_least(applied(rig.boss), CARDS * STATUS_STEPS), 15)
    await wait_for(lambda: _at_least(records(rig.boss), CARDS * STATUS_STEPS), 15)


async def test_a_priority_item_is_applied_synchronously_even_in_async_mode(rig: Rig) -> None:
    await rig.set_mode("async")
    card = "8986000" + "00000001"
    item = await add_priority_item(rig.boss.db, card, "traffic")
    await rig.poller.refresh_priority()
    await rig.round()
    assert rig.poller.stats.priority_applied == 1
    assert await applied(rig.boss) == 1
    row = await scalar(
        rig.boss,
        "SELECT state || ':' || observation_id FROM shoal_polling.priority_item WHERE id = %s",
        (item,),
    )
    assert row == f"done:s1-{card}-traffic-1"


async def test_a_risk_answer_stops_polling_the_card_at_once(polling: Shoal) -> None:
    rig = await open_rig(polling, GatewaySettings(latency_ms=0.0, rate_limit=0.0, risk_rate=1.0))
    try:
        await rig.set_mode("async")  # the stop does not wait for the ingest
        await rig.round()
        assert rig.poller.stats.risk_stops == CARDS
        assert await scalar(polling, "SELECT count(*) FROM shoal_polling.due") == 0
        rig.start_consumers()
        await wait_for(lambda: _at_least(applied(polling), CARDS * STATUS_STEPS), 15)
        assert (
            await scalar(polling, "SELECT count(*) FROM shoal_polling.card WHERE polling_enabled")
            == 0
        )
    finally:
        await rig.close()


async def test_the_plan_step_skips_while_the_flow_evaluated_marker_is_fresh(rig: Rig) -> None:
    rig.tasks.append(asyncio.create_task(rig.poller.invalidator.run(rig.stop)))
    await asyncio.wait_for(rig.poller.invalidator.listening.wait(), 10)
    await scalar(rig.boss, "UPDATE shoal_polling.due SET due_at = now() + interval '1 hour'")
    await scalar(
        rig.boss,
        "UPDATE shoal_polling.due SET due_at = now() WHERE step <> 'plan'",
    )
    await rig.round()  # caches every card, then the traffic applies invalidate them
    await wait_for(lambda: rig.poller.invalidator.invalidated >= CARDS * STATUS_STEPS, 10)
    await scalar(rig.boss, "UPDATE shoal_polling.due SET due_at = now() WHERE step = 'plan'")
    await rig.round()
    assert rig.poller.stats.plan_skipped == CARDS
    assert rig.poller.stats.plan_evaluated == 0


async def test_producers_hold_off_while_the_backlog_monitor_pauses_the_topic(rig: Rig) -> None:
    await rig.set_mode("async")
    await rig.round()
    monitor = rig.pipeline.monitor([(OBSERVATIONS.name, "shoal")], pause_depth=CARDS)
    (reading,) = await monitor.check()
    assert reading.paused
    await scalar(rig.boss, "UPDATE shoal_polling.due SET due_at = now()")
    rig.pipeline._admit.clear()  # the producers' 1 s cache of the flag
    assert await rig.poller.run_once() == 0
    assert rig.poller.stats.paused_rounds == 1


async def test_gateway_failures_are_recorded_and_backed_off(polling: Shoal) -> None:
    rig = await open_rig(polling, GatewaySettings(latency_ms=0.0, rate_limit=0.0, error_rate=1.0))
    try:
        await rig.round()
        assert rig.poller.stats.gateway_errors == CARDS * STATUS_STEPS
        rig.start_consumers()
        await wait_for(lambda: _at_least(records(polling), CARDS * STATUS_STEPS), 15)
        failed = await scalar(
            polling, "SELECT count(*) FROM shoal_polling.collection_record WHERE NOT ok"
        )
        assert failed == CARDS * STATUS_STEPS
        assert await rig.round() == 0  # backed off, not due again at once
    finally:
        await rig.close()


async def test_at_most_twenty_polls_of_one_account_call_the_gateway_at_once(
    polling: Shoal,
) -> None:
    await create_fleet(polling.db, FleetSpec(accounts=1, cards_per_account=60))
    # Plan steps make no gateway call: out of the way, so a round's claim (at
    # most the account's limit) is all calls.
    await scalar(
        polling,
        "UPDATE shoal_polling.due SET due_at = now() + interval '1 day' WHERE step = 'plan'",
    )
    rig = await open_rig(polling, GatewaySettings(latency_ms=30.0, latency_sigma=0.0, rate_limit=0))
    active: dict[str, int] = {}
    peak: dict[str, int] = {}
    full = asyncio.Event()  # the limit's worth of calls are in flight at once
    inner = rig.gateway.query

    async def counting(account: str, card: str, kind: Kind) -> dict[str, Any] | None:
        active[account] = active.get(account, 0) + 1
        peak[account] = max(peak.get(account, 0), active[account])
        if active[account] >= ACCOUNT_CONCURRENCY:
            full.set()
        try:
            # Calls wait until the limit's worth are in at once, so on a slow
            # machine early calls cannot finish before later ones start; a limit
            # that leaked lets more in meanwhile. The timeout only ends a hang.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(30):
                    await full.wait()
            return await inner(account, card, kind)
        finally:
            active[account] -= 1

    rig.gateway.query = counting  # type: ignore[method-assign]  # counting calls in place
    try:
        # The claim takes the account's limit's worth of its steps; the calls fill it.
        await rig.round()
    finally:
        await rig.close()
    assert peak["acct000"] == ACCOUNT_CONCURRENCY


async def _at_least(count: object, n: int) -> bool:
    return bool(await count >= n)  # type: ignore[misc,operator]  # an awaitable of int


class _PublishFails:
    """The postgres transport with publishing down (an outage of the transport)."""

    def __init__(self, inner: PostgresTransport) -> None:
        self.inner = inner
        self.name = inner.name

    async def publish(self, topic: str, envelopes: Any, **_: Any) -> None:
        raise PublishError(f"publish to {topic!r}: transport down")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_async_mode_degrades_to_sync_when_the_transport_cannot_publish(
    polling: Shoal,
) -> None:
    def failing(boss: Shoal) -> Transport:
        return cast(Transport, _PublishFails(PostgresTransport(boss)))  # a wrapper, duck-typed

    rig = await open_rig(polling, transport=failing)
    try:
        await rig.set_mode("async")
        await rig.round()
        assert rig.poller.stats.apply_errors == 0
        assert await applied(polling) == CARDS * STATUS_STEPS
        # Their collection records could not be published either: written directly.
        assert rig.ingest.counts.records_written_directly == CARDS * STATUS_STEPS
        assert await records(polling) == CARDS * STATUS_STEPS
    finally:
        await rig.close()
