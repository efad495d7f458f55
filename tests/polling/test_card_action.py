"""An operator's action on a card, confirmed later by the gateway (``polling.card_action``).

The gateway runs in process on the test's FakeClock, as does the app's
callback receiver it posts confirmations to: a timeout or a delayed
confirmation comes when the test moves the clock, never by waiting.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import psycopg
import pytest

from shoal import FakeClock, Shoal, SystemClock
from shoal.workflow import RunStatus, RunView, StepKind, Workflows
from shoal_polling.actions import CALL_RETRIES, CARD_ACTION, ActionRequest, use_gateway
from shoal_polling.app import app
from shoal_polling.callbacks import build_callback_app
from shoal_polling.cli import main
from shoal_polling.fleet import card_id, create_fleet
from shoal_polling.gateway import ActionRefused, Gateway, GatewaySettings, build_gateway_app
from shoal_polling.gateway_client import GatewayClient
from shoal_polling.schema import ensure_schema
from tests.conftest import wait_for
from tests.polling.conftest import SMALL_FLEET

CARD = card_id(0, 1)
GATEWAY = "http://gateway"
CALLBACK = "http://app/v1/confirmations"
MINUTE = timedelta(minutes=1)


@dataclass
class ActionRig:
    boss: Shoal
    clock: FakeClock
    api: Workflows
    gateway: Gateway

    async def start(self, request: str, *, callback: str | None = CALLBACK) -> str:
        data = ActionRequest(
            request=request,
            account="acct000",
            card=CARD,
            action="suspend",
            gateway=GATEWAY,
            callback=callback,
            wait_s=60,
            poll_interval_s=60,
            polls=3,
        )
        return (await self.api.start(CARD_ACTION, data.to_json(), id=request)).id

    async def reached(
        self, run: str, status: RunStatus, steps: int | None = None, attempts: int = 0
    ) -> RunView:
        """The run once it is in ``status`` (with ``steps`` steps recorded, and its last
        step's ``attempts``, if given)."""

        async def there() -> bool:
            view = await self.api.get(run)
            return (
                view.status is status
                and (steps is None or len(view.steps) == steps)
                and (not attempts or view.steps[-1].attempts == attempts)
            )

        await wait_for(there)
        return await self.api.get(run)

    async def card(self) -> tuple[Any, ...]:
        async def read(conn: Any) -> tuple[Any, ...]:
            cur = await conn.execute(
                "SELECT network_status, last_card_status_check_at,"
                " (SELECT count(*) FROM shoal_polling.audit_log"
                "   WHERE card_id = c.id AND action = 'action_confirmed'),"
                " (SELECT count(*) FROM shoal_polling.outbox"
                "   WHERE card_id = c.id AND kind = 'card_status.changed')"
                " FROM shoal_polling.card c WHERE id = %s",
                (CARD,),
            )
            return tuple(await cur.fetchone())

        return await self.boss.db.run(read, transaction=False)


def settings(confirm_after_s: float | None) -> GatewaySettings:
    return GatewaySettings(
        latency_ms=0.0, rate_limit=0.0, read_only=False, confirm_after_s=confirm_after_s
    )


async def open_action_rig(
    fake_boss: Shoal, clock: FakeClock, confirm_after_s: float | None
) -> AsyncIterator[ActionRig]:
    await ensure_schema(fake_boss.db, today=SystemClock().now().date())
    await create_fleet(fake_boss.db, SMALL_FLEET)
    api = app.workflows(fake_boss)
    gateway = Gateway(
        settings(confirm_after_s),
        clock=clock,
        callback_transport=httpx.ASGITransport(app=build_callback_app(api)),
    )
    client = GatewayClient(GATEWAY, transport=httpx.ASGITransport(app=build_gateway_app(gateway)))
    use_gateway(GATEWAY, client)
    api.work(CARD_ACTION)
    try:
        yield ActionRig(fake_boss, clock, api, gateway)
    finally:
        await fake_boss.stop_workers(timedelta(seconds=5))
        await client.close()


@pytest.fixture
async def rig(fake_boss: Shoal, clock: FakeClock) -> AsyncIterator[ActionRig]:
    """A gateway confirming actions 90 s after they were taken."""
    async for r in open_action_rig(fake_boss, clock, 90.0):
        yield r


@pytest.fixture
async def never(fake_boss: Shoal, clock: FakeClock) -> AsyncIterator[ActionRig]:
    """A gateway that leaves every action pending."""
    async for r in open_action_rig(fake_boss, clock, None):
        yield r


async def test_a_callback_confirmation_resumes_the_run_at_once(rig: ActionRig) -> None:
    before = rig.clock.now()
    run = await rig.start("r-callback")
    await rig.reached(run, RunStatus.WAITING)
    assert rig.gateway.actions["r-callback"].view()["status"] == "pending"
    # The carrier confirms early and calls back: no clock move, no poll.
    await rig.gateway.confirm("r-callback")
    view = await rig.reached(run, RunStatus.COMPLETED)
    assert rig.clock.now() == before
    assert view.result["network_status"] == "suspended" and view.result["polls"] == 0
    assert [(s.kind, s.name) for s in view.steps] == [
        (StepKind.STEP, "submit"),
        (StepKind.WAIT, "confirm:r-callback"),
        (StepKind.STEP, "apply"),
        (StepKind.STEP, "acknowledge"),
    ]
    assert await rig.card() == ("suspended", before, 1, 1)
    assert rig.gateway.actions["r-callback"].acknowledged


async def test_without_a_callback_the_timed_poll_finds_the_confirmation(rig: ActionRig) -> None:
    taken = rig.clock.now()
    run = await rig.start("r-poll", callback=None)
    await rig.reached(run, RunStatus.WAITING)
    rig.clock.advance(MINUTE)  # the wait times out; the first poll finds it pending (60 s < 90 s)
    view = await rig.reached(run, RunStatus.SLEEPING)
    assert view.steps[1].result == {"timed_out": True}
    assert view.steps[2].name == "poll status" and view.steps[2].result is None
    assert await rig.card() == (None, None, 0, 0)
    rig.clock.advance(MINUTE)  # the second poll, at 120 s, finds it confirmed (at 90 s)
    view = await rig.reached(run, RunStatus.COMPLETED)
    assert view.result["polls"] == 2
    assert [s.kind for s in view.steps] == [
        StepKind.STEP,
        StepKind.WAIT,
        StepKind.STEP,
        StepKind.SLEEP,
        StepKind.STEP,
        StepKind.STEP,
        StepKind.STEP,
    ]
    assert await rig.card() == ("suspended", taken + timedelta(seconds=90), 1, 1)


async def test_the_apply_happens_once_however_often_the_run_resumes(
    rig: ActionRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    def busy(request: str) -> dict[str, Any]:
        raise ActionRefused(503, "carrier busy")

    # The acknowledgement, after the apply's commit, fails every attempt.
    monkeypatch.setattr(rig.gateway, "acknowledge", busy)
    run = await rig.start("r-once")
    await rig.reached(run, RunStatus.WAITING)
    await rig.gateway.confirm("r-once")
    for attempt in range(1, CALL_RETRIES + 1):  # each failed attempt: a durable retry delay
        view = await rig.reached(run, RunStatus.SLEEPING, 4, attempt)
        assert view.steps[3].name == "acknowledge"
        rig.clock.advance(timedelta(hours=1))
    failed = await rig.reached(run, RunStatus.FAILED)
    assert "'acknowledge'" in (failed.error or "") and "503" in (failed.error or "")
    assert await rig.card() == ("suspended", rig.clock.now() - 3 * timedelta(hours=1), 1, 1)
    monkeypatch.undo()  # the gateway answers again; the operator retries the run
    assert await rig.api.retry(run)
    view = await rig.reached(run, RunStatus.COMPLETED)
    assert view.steps[2].name == "apply" and view.steps[2].attempts == 1
    # Resumed five times after the apply committed: the card changed once.
    _, _, audited, events = await rig.card()
    assert (audited, events) == (1, 1)
    assert rig.gateway.actions["r-once"].acknowledged


async def test_a_gateway_that_never_confirms_fails_the_run_after_the_polls(
    never: ActionRig,
) -> None:
    run = await never.start("r-never", callback=None)
    await never.reached(run, RunStatus.WAITING)
    for steps in (4, 6):  # submit, wait, poll, sleep; then poll, sleep again
        never.clock.advance(MINUTE)
        await never.reached(run, RunStatus.SLEEPING, steps)
    never.clock.advance(MINUTE)
    view = await never.reached(run, RunStatus.FAILED)
    assert "NotConfirmed: the gateway did not confirm suspend of card" in (view.error or "")
    assert "still pending after 3 status polls 60 s apart" in (view.error or "")
    assert [s.name for s in view.steps if s.kind is StepKind.STEP] == [
        "submit",
        "poll status",
        "poll status",
        "poll status",
    ]
    assert await never.card() == (None, None, 0, 0)


async def test_a_read_only_gateway_refuses_the_action_and_the_run_fails_at_once(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    async for rig in open_action_rig(fake_boss, clock, 90.0):
        rig.gateway.settings = GatewaySettings(latency_ms=0.0, rate_limit=0.0, read_only=True)
        run = await rig.start("r-refused")
        view = await rig.reached(run, RunStatus.FAILED)
        assert "the gateway refused suspend of" in (view.error or "")
        assert "read-only" in (view.error or "")
        assert view.steps[0].attempts == 1  # a refusal is not retried


def test_the_action_command_starts_a_run(db_url: str) -> None:
    db = ["--database-url", db_url]
    assert main([*db, "seed", "--accounts", "1", "--cards", "2"]) == 0
    card = card_id(0, 0)
    args = ["action", "suspend", card, "--gateway", "http://127.0.0.1:1", "--request", "op-1"]
    assert main([*db, *args]) == 0
    assert main([*db, "action", "suspend", "no-such-card"]) == 2
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT name, status, input FROM shoal.workflow_run").fetchone()
    assert row is not None
    name, status, data = row
    assert (name, status) == (CARD_ACTION, "pending")
    assert (data["request"], data["card"], data["action"]) == ("op-1", card, "suspend")
