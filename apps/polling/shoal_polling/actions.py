"""An operator's action on a card, confirmed later by the gateway: workflow ``polling.card_action``.

    shoal-polling action suspend c000-0001 --gateway http://127.0.0.1:8900 \\
        [--callback http://127.0.0.1:8950/v1/confirmations]

The gateway answers an action (suspend, reactivate) ``pending`` and confirms
it later. A run of the workflow, one per request (the run's id is the
request's id), does:

1. ``submit``, a step: the request to the gateway (idempotent by request id);
2. ``wf.wait_for("confirm:<request>", timeout=wait)``: the gateway's callback,
   which ``shoal-polling callbacks`` turns into ``Workflows.signal``, ends the
   wait at once; no process is held meanwhile;
3. if no callback came in time: up to ``polls`` polls of the gateway's status
   (a step each), with a durable ``wf.sleep(poll_interval)`` between two; when
   the last one still finds it pending the run fails with :class:`NotConfirmed`;
4. ``apply``, a step with ``transaction=True``: the confirmed network status
   applied to the card (the status apply of D6: a newer poll answer wins) and
   an ``action_confirmed`` audit row, committed with the step's checkpoint, so
   the card changes once whatever resumes the run;
5. ``acknowledge``, a step retried on failure: the gateway is told the
   confirmation was taken.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from shoal import InvalidInput, PermanentError
from shoal.workflow import Workflow
from shoal_polling.apply import apply_confirmed_status
from shoal_polling.domain import ACTIONS, AsyncConn, Observation
from shoal_polling.gateway_client import GatewayClient, GatewayError

CARD_ACTION = "polling.card_action"
DEFAULT_WAIT = timedelta(minutes=2)
DEFAULT_POLL_INTERVAL = timedelta(minutes=1)
DEFAULT_POLLS = 5
# A gateway call that fails (5xx, 429, a timeout) is tried again this often,
# this long apart (doubling); a 4xx refusal is not.
CALL_RETRIES = 3
CALL_RETRY_DELAY = timedelta(seconds=5)


def confirmation_key(request: str) -> str:
    """The event a confirmation of ``request`` is sent to (``Workflows.signal``)."""
    return f"confirm:{request}"


class NotConfirmed(Exception):
    """The gateway did not confirm the action after every status poll."""


@dataclass(frozen=True, slots=True)
class ActionRequest:
    """A run's input: the action, the gateway to ask, and how long to wait for it."""

    request: str
    account: str
    card: str
    action: str
    gateway: str
    callback: str | None = None
    wait_s: float = DEFAULT_WAIT.total_seconds()
    poll_interval_s: float = DEFAULT_POLL_INTERVAL.total_seconds()
    polls: int = DEFAULT_POLLS

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise InvalidInput(
                "action", f"must be one of {', '.join(ACTIONS)}, got {self.action!r}"
            )
        for name in ("request", "account", "card", "gateway"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise InvalidInput(name, f"must be a non-empty string, got {getattr(self, name)!r}")
        if self.wait_s < 0 or self.poll_interval_s < 0:
            raise InvalidInput("wait_s", "the wait and the poll interval are 0 s or more")
        if isinstance(self.polls, bool) or not isinstance(self.polls, int) or self.polls < 1:
            raise InvalidInput("polls", f"must be an integer of 1 or more, got {self.polls!r}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Any) -> ActionRequest:
        if not isinstance(doc, dict):
            raise InvalidInput("input", f"an action request is a JSON object, got {doc!r}")
        try:
            return cls(**doc)
        except TypeError as exc:
            raise InvalidInput("input", f"malformed action request: {exc}") from None


_gateways: dict[str, GatewayClient] = {}


def use_gateway(url: str, client: GatewayClient) -> None:
    """Make the steps call the gateway at ``url`` through ``client`` (tests: one in process)."""
    _gateways[url] = client


def _gateway(url: str) -> GatewayClient:
    client = _gateways.get(url)
    if client is None:
        client = _gateways[url] = GatewayClient(url)
    return client


def _refused(exc: GatewayError) -> bool:
    return exc.status is not None and 400 <= exc.status < 500 and exc.status != 429


async def submit(data: dict[str, Any]) -> dict[str, Any]:
    """Ask the gateway for the action: its answer (``pending``, or already ``confirmed``)."""
    req = ActionRequest.from_json(data)
    try:
        return await _gateway(req.gateway).submit_action(
            req.account, req.card, req.action, req.request, callback=req.callback
        )
    except GatewayError as exc:
        if _refused(exc):
            raise PermanentError(f"the gateway refused {req.action} of {req.card}: {exc}") from exc
        raise


async def poll_status(data: dict[str, Any]) -> dict[str, Any] | None:
    """The gateway's confirmation of the request, or None while it is pending."""
    req = ActionRequest.from_json(data)
    try:
        view = await _gateway(req.gateway).action_status(req.request)
    except GatewayError as exc:
        if _refused(exc):
            raise PermanentError(f"the gateway has no request {req.request}: {exc}") from exc
        raise
    return view if view.get("status") == "confirmed" else None


async def apply_confirmation(
    conn: AsyncConn, data: dict[str, Any], confirmation: dict[str, Any]
) -> dict[str, Any]:
    """In the checkpoint's transaction: the confirmed status on the card, and its audit row."""
    req = ActionRequest.from_json(data)
    status = ACTIONS[req.action]
    if (
        confirmation.get("request") != req.request
        or confirmation.get("card_id") != req.card
        or confirmation.get("status") != "confirmed"
        or confirmation.get("network_status") != status
        or not isinstance(confirmation.get("confirmed_at"), str)
    ):
        raise PermanentError(
            f"{confirmation!r} does not confirm {req.action} of card {req.card}"
            f" (request {req.request})"
        )
    confirmed_at = datetime.fromisoformat(confirmation["confirmed_at"])
    observation = Observation(
        f"confirm:{req.request}",
        req.card,
        req.account,
        "card_status",
        confirmed_at,
        status=status,
        raw=json.dumps(confirmation),
    )
    applied = await apply_confirmed_status(conn, observation)
    detail = {
        "request": req.request,
        "action": req.action,
        "network_status": status,
        "confirmed_at": confirmation["confirmed_at"],
        "changed": applied.changed,
    }
    await conn.execute(
        "INSERT INTO shoal_polling.audit_log (card_id, observation_id, action, detail)"
        " VALUES (%s, %s, 'action_confirmed', %s)",
        (req.card, observation.observation_id, json.dumps(detail)),
    )
    return detail


async def acknowledge(data: dict[str, Any]) -> bool:
    """Tell the gateway the confirmation was taken; False if it no longer knows the request."""
    req = ActionRequest.from_json(data)
    try:
        await _gateway(req.gateway).acknowledge(req.request)
    except GatewayError as exc:
        if exc.status == 404:  # a restarted gateway forgot it: it sends no callback either
            return False
        if _refused(exc):
            raise PermanentError(f"the gateway refused the acknowledgement: {exc}") from exc
        raise
    return True


async def card_action(wf: Workflow, data: dict[str, Any]) -> dict[str, Any]:
    """Submit the action, wait for its confirmation (callback or polls), apply it once."""
    req = ActionRequest.from_json(data)
    retried: dict[str, Any] = {
        "retry_limit": CALL_RETRIES,
        "retry_delay": CALL_RETRY_DELAY,
        "retry_backoff": True,
    }
    answer = await wf.step(submit, data, name="submit", **retried)
    confirmation = answer if answer.get("status") == "confirmed" else None
    if confirmation is None:
        confirmation = await wf.wait_for(
            confirmation_key(req.request), timeout=timedelta(seconds=req.wait_s)
        )
    polls = 0
    while confirmation is None:
        if polls == req.polls:
            raise NotConfirmed(
                f"the gateway did not confirm {req.action} of card {req.card} (request"
                f" {req.request}): no callback within {req.wait_s:g} s, and still pending"
                f" after {polls} status poll{'s' if polls != 1 else ''}"
                f" {req.poll_interval_s:g} s apart"
            )
        if polls:
            await wf.sleep(timedelta(seconds=req.poll_interval_s))
        polls += 1
        confirmation = await wf.step(poll_status, data, name="poll status", **retried)
    applied = await wf.step(apply_confirmation, data, confirmation, name="apply", transaction=True)
    await wf.step(acknowledge, data, name="acknowledge", **retried)
    return {**applied, "polls": polls}
