"""The simulated gateway: deterministic under a seed, rate-limited per account, failing and
slow as its flags say, read-only by default; and its own process, ``shoal-polling gateway``."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import Body, FastAPI
from fastapi.responses import JSONResponse

from shoal import FakeClock
from shoal_polling.domain import KINDS
from shoal_polling.gateway import (
    CALLBACK_RETRY_S,
    Gateway,
    GatewaySettings,
    build_gateway_app,
)
from shoal_polling.gateway_client import GatewayClient, GatewayError
from tests.conftest import wait_for
from tests.polling.processes import GatewayProcess

FAST = GatewaySettings(seed=7, latency_ms=0.0, rate_limit=0.0)


def client(settings: GatewaySettings) -> tuple[Gateway, GatewayClient]:
    gateway = Gateway(settings)
    transport = httpx.ASGITransport(app=build_gateway_app(gateway))
    return gateway, GatewayClient("http://gateway", transport=transport)


async def answers(settings: GatewaySettings, order: list[str]) -> dict[str, list[Any]]:
    """Each card's answers (minus the time of answer) for queries in ``order``."""
    _, gw = client(settings)
    out: dict[str, list[Any]] = {}
    try:
        for card in order:
            for kind in KINDS:
                try:
                    a = await gw.query("acct000", card, kind)
                    out.setdefault(card, []).append((a.observation_id, a.used_kb, a.status))
                except GatewayError as exc:
                    out.setdefault(card, []).append(("error", exc.status))
    finally:
        await gw.close()
    return out


async def test_a_seed_gives_each_card_the_same_answers_in_any_interleaving() -> None:
    settings = GatewaySettings(seed=7, latency_ms=0.0, rate_limit=0.0, error_rate=0.2)
    first = await answers(settings, ["a", "b", "c"] * 5)
    second = await answers(settings, ["c"] * 5 + ["b"] * 5 + ["a"] * 5)
    assert first == second
    assert any(x[0] == "error" for xs in first.values() for x in xs)  # the error rate bites
    other = await answers(GatewaySettings(seed=8, latency_ms=0.0, rate_limit=0.0), ["a"] * 5)
    assert other["a"] != first["a"]


async def test_traffic_readings_only_grow_and_ids_are_unique() -> None:
    _, gw = client(FAST)
    try:
        readings = [await gw.query("acct000", "card1", "traffic") for _ in range(20)]
    finally:
        await gw.close()
    used = [r.used_kb or 0 for r in readings]
    assert used == sorted(used)
    assert len({r.observation_id for r in readings}) == 20
    assert readings[0].observed_at < readings[-1].observed_at


async def test_an_account_past_its_rate_limit_gets_429_others_do_not() -> None:
    _, gw = client(GatewaySettings(seed=1, latency_ms=0.0, rate_limit=1.0, burst=5))
    try:
        for _ in range(5):
            await gw.query("acct000", "c", "traffic")
        with pytest.raises(GatewayError) as limited:
            await gw.query("acct000", "c", "traffic")
        assert limited.value.status == 429
        await gw.query("acct001", "c", "traffic")
    finally:
        await gw.close()


async def test_the_read_only_switch_refuses_writes_and_the_served_log_lists_answers() -> None:
    gateway, gw = client(FAST)
    try:
        refused = await gw.http.post("/v1/accounts/acct000/cards/c/suspend")
        assert refused.status_code == 403
        await gw.query("acct000", "c", "traffic")
        await gw.query("acct000", "d", "real_name")
        served = await gw.served()
    finally:
        await gw.close()
    assert [s["observation_id"] for s in served] == [s["observation_id"] for s in gateway.served]
    assert len(served) == 2
    _, writable = client(GatewaySettings(read_only=False, latency_ms=0.0))
    try:
        assert (await writable.http.post("/v1/accounts/a/cards/c/suspend")).status_code == 200
    finally:
        await writable.close()


async def test_the_gateway_runs_as_its_own_process(tmp_path: Path) -> None:
    process = GatewayProcess(tmp_path, "--seed", "3").start()
    gw = GatewayClient(process.url)
    try:
        await wait_up(gw)
        answer = await gw.query("acct000", "c1", "card_status")
        assert answer.observation_id == "s3-c1-card_status-1"
    finally:
        await gw.close()
        process.stop()


async def wait_up(gw: GatewayClient) -> None:
    async def up() -> bool:
        try:
            return (await gw.http.get("/healthz")).status_code == 200
        except httpx.HTTPError:
            return False

    await wait_for(up, 15)


async def test_an_action_is_pending_until_its_delay_passes_then_confirmed_and_called_back() -> None:
    clock = FakeClock()
    received: list[dict[str, Any]] = []
    receiver = FastAPI()

    @receiver.post("/confirm")
    async def confirm(body: dict[str, Any] = Body(...)) -> dict[str, Any]:  # noqa: B008
        received.append(body)
        return {}

    settings = GatewaySettings(latency_ms=0.0, rate_limit=0.0, read_only=False, confirm_after_s=30)
    gateway = Gateway(settings, clock=clock, callback_transport=httpx.ASGITransport(app=receiver))
    gw = GatewayClient("http://gateway", transport=httpx.ASGITransport(build_gateway_app(gateway)))
    try:
        first = await gw.submit_action(
            "acct000", "c", "suspend", "q1", callback="http://app/confirm"
        )
        again = await gw.submit_action(
            "acct000", "c", "suspend", "q1", callback="http://app/confirm"
        )
        assert first == again and first["status"] == "pending"
        with pytest.raises(GatewayError) as taken:
            await gw.submit_action("acct000", "c", "reactivate", "q1", callback=None)
        assert taken.value.status == 409
        assert await gateway.deliver_due() == 0 and received == []
        clock.advance(timedelta(seconds=30))
        assert await gateway.deliver_due() == 1
        assert [(r["request"], r["status"], r["network_status"]) for r in received] == [
            ("q1", "confirmed", "suspended")
        ]
        # Later network-status answers carry the confirmed status.
        assert (await gw.query("acct000", "c", "card_status")).status == "suspended"
        assert (await gw.action_status("q1"))["status"] == "confirmed"
        assert (await gw.acknowledge("q1"))["acknowledged"] is True
        with pytest.raises(GatewayError) as unknown:
            await gw.action_status("nope")
        assert unknown.value.status == 404
    finally:
        await gw.close()


async def test_a_failed_callback_is_sent_again_after_its_retry_delay() -> None:
    clock = FakeClock()
    answers = [503, 200]
    receiver = FastAPI()

    @receiver.post("/confirm")
    async def confirm() -> Any:
        return JSONResponse({}, status_code=answers.pop(0))

    settings = GatewaySettings(latency_ms=0.0, rate_limit=0.0, read_only=False, confirm_after_s=0)
    gateway = Gateway(settings, clock=clock, callback_transport=httpx.ASGITransport(app=receiver))
    gateway.submit("acct000", "c", "reactivate", "q2", "http://app/confirm")
    assert await gateway.deliver_due() == 0  # answered 503
    assert await gateway.deliver_due() == 0 and answers == [200]  # not before the delay
    clock.advance(timedelta(seconds=CALLBACK_RETRY_S))
    assert await gateway.deliver_due() == 1 and answers == []
    assert await gateway.deliver_due() == 0  # delivered: sent once
