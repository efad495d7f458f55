"""The simulated carrier gateway: its own HTTP process, deterministic under a seed.

    shoal-polling gateway --port 8900 --seed 7 --latency-ms 40 --error-rate 0.02

It answers, per account and card, the three queries a poll step makes
(traffic, network status, real-name status), each after a latency drawn from
a log-normal distribution, failing with 503 at ``error_rate``, and with 429
past an account's rate limit (a token bucket per account). Every draw for a
card comes from that card's own generator, seeded by ``(seed, card, kind)``:
the n-th answer about a card is the same in every run, however the polls
interleave. The write endpoint (suspend) answers 403 while the read-only
switch is on, as in the reference's test environment.

An operator action on a card (suspend, reactivate: ``POST
/v1/accounts/{account}/cards/{card}/actions``) is not final when answered: the
gateway answers ``pending`` (202) and confirms it ``--confirm-after-s`` later
(never with ``--never-confirm``). The app learns of the confirmation by a
callback (a POST of the confirmation to the URL the request named, sent by
the gateway's delivery loop once the time has come) or by polling ``GET
/v1/actions/{request}``; once it has taken it, it acknowledges it (``POST
/v1/actions/{request}/ack``). A confirmed action sets the card's network
status, which later ``network-status`` answers carry.

Every successful answer is kept in the served log (``GET /v1/served``), which
``shoal-polling reconcile`` compares with what was recorded and applied.
With ``--served-log FILE`` the log is also appended to that file (JSON lines)
before each answer is sent, failures included (``"failed": true``, no
observation). A gateway started again on the same file resumes from it: its
served log, each card's answer count, usage and status, and each card's
generator moved past the draws already made, so it serves new observation ids
and carries on as if it had never stopped, and ``reconcile`` (by the gateway or
by the file) still covers what the earlier process served.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from fastapi import Body, FastAPI, HTTPException, Query
from fastapi.responses import JSONResponse

from shoal import Clock, InvalidInput, SystemClock
from shoal_polling.domain import ACTIONS, KINDS, NETWORK_STATUSES, RISK_STATUSES, Kind

log = logging.getLogger("shoal_polling.gateway")

DEFAULT_PORT = 8900
DEFAULT_RATE_LIMIT = 200.0  # queries per second per account
DEFAULT_LATENCY_MS = 20.0
SERVED_PAGE = 10_000
DEFAULT_CONFIRM_AFTER_S = 30.0
# How often the gateway process delivers the callbacks of confirmed actions,
# and how long after a failed one it tries that callback again.
DELIVERY_INTERVAL_S = 0.2
CALLBACK_RETRY_S = 5.0
PATHS: dict[str, Kind] = {
    "traffic": "traffic",
    "network-status": "card_status",
    "real-name": "real_name",
}


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    seed: int = 1
    latency_ms: float = DEFAULT_LATENCY_MS  # the median
    latency_sigma: float = 0.5  # of the log-normal: 0 means always latency_ms
    latency_range_ms: tuple[float, float] | None = None  # drawn latencies clipped to it
    error_rate: float = 0.0
    rate_limit: float = DEFAULT_RATE_LIMIT  # per account and second; 0: unlimited
    burst: float = 0.0  # bucket size; 0 means one second's worth
    read_only: bool = True
    risk_rate: float = 0.0  # chance a status answer is a risk block (sticky)
    status_change_rate: float = 0.05
    id_prefix: str = ""
    served_log: Path | None = None
    # How long an operator action stays pending; None: it is never confirmed.
    confirm_after_s: float | None = DEFAULT_CONFIRM_AFTER_S


@dataclass(slots=True)
class _Action:
    """An operator action the gateway took (pending until ``confirm_at``)."""

    request: str
    account: str
    card: str
    action: str
    callback: str | None
    submitted_at: datetime
    confirmed_at: datetime | None = None
    delivered: bool = False  # its callback was answered 2xx
    acknowledged: bool = False
    retry_at: float = 0.0  # a failed callback is sent again from then (monotonic)

    def view(self) -> dict[str, Any]:
        confirmed = self.confirmed_at is not None
        return {
            "request": self.request,
            "account_id": self.account,
            "card_id": self.card,
            "action": self.action,
            "status": "confirmed" if confirmed else "pending",
            "network_status": ACTIONS[self.action] if confirmed else None,
            "confirmed_at": None if self.confirmed_at is None else self.confirmed_at.isoformat(),
            "acknowledged": self.acknowledged,
        }


class ActionRefused(Exception):
    """A request the gateway refuses: ``status`` is the HTTP status it answers."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


@dataclass(slots=True)
class _CardSim:
    rng: random.Random
    draws: int = 0  # queries that drew from rng (answered, failed or cut short)
    answers: int = 0
    used_kb: int = 0
    status: str = "active"


@dataclass(frozen=True, slots=True)
class _Draws:
    number: int  # the card's n-th query of this kind
    latency: float
    fail: float
    value: float
    change: float
    increment: int


def _draw(sim: _CardSim) -> _Draws:
    """One query's draws. Every query makes all of them, used or not, so the
    n-th answer never depends on the flags' effect."""
    sim.draws += 1
    return _Draws(
        number=sim.draws,
        latency=sim.rng.gauss(0.0, 1.0),
        fail=sim.rng.random(),
        value=sim.rng.random(),
        change=sim.rng.random(),
        increment=sim.rng.randint(0, 400),
    )


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


@dataclass(slots=True)
class GatewayStats:
    answered: int = 0
    failed: int = 0
    limited: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)


class Gateway:
    """The simulation, separate from HTTP so tests can drive it directly."""

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        clock: Clock | None = None,
        callback_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self.actions: dict[str, _Action] = {}
        # Callbacks go out through this transport (tests: the app's, in process).
        self.callback_transport = callback_transport
        self.prefix = settings.id_prefix or f"s{settings.seed}"
        self.cards: dict[tuple[str, Kind], _CardSim] = {}
        self.buckets: dict[str, _Bucket] = {}
        self.served: list[dict[str, Any]] = []
        self.stats = GatewayStats()
        if settings.served_log is not None and settings.served_log.exists():
            self._resume(settings.served_log)

    def _sim(self, card: str, kind: Kind) -> _CardSim:
        sim = self.cards.get((card, kind))
        if sim is None:
            sim = _CardSim(random.Random(f"{self.settings.seed}:{card}:{kind}"))
            if kind == "real_name":
                sim.status = "verified" if sim.rng.random() < 0.9 else "unverified"
            self.cards[(card, kind)] = sim
        return sim

    def admit(self, account: str) -> bool:
        """The account's token bucket: False past its rate limit."""
        rate = self.settings.rate_limit
        if rate <= 0:
            return True
        size = self.settings.burst or rate
        now = self.clock.monotonic()
        bucket = self.buckets.get(account)
        if bucket is None:
            bucket = self.buckets[account] = _Bucket(size, now)
        bucket.tokens = min(size, bucket.tokens + (now - bucket.at) * rate)
        bucket.at = now
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True

    def retry_after(self, account: str) -> int:
        """Whole seconds until ``account``'s bucket holds a token again (at least 1)."""
        bucket = self.buckets.get(account)
        rate = self.settings.rate_limit
        if bucket is None or rate <= 0:
            return 1
        return max(1, math.ceil((1 - bucket.tokens) / rate))

    async def query(self, account: str, card: str, kind: Kind) -> dict[str, Any] | None:
        """One answer about ``card``, after its latency; None for a simulated failure."""
        sim = self._sim(card, kind)
        s = self.settings
        draws = _draw(sim)
        latency_ms = s.latency_ms * math.exp(s.latency_sigma * draws.latency)
        if s.latency_range_ms is not None:
            low, high = s.latency_range_ms
            latency_ms = min(max(latency_ms, low), high)
        await self.clock.sleep(latency_ms / 1000.0)
        if draws.fail < s.error_rate:
            self.stats.failed += 1
            self._persist(
                {"account_id": account, "card_id": card, "kind": kind, "failed": True}, draws
            )
            return None
        sim.answers += 1
        if kind == "traffic":
            sim.used_kb += draws.increment
            value: dict[str, Any] = {"used_kb": sim.used_kb}
        elif kind == "card_status":
            if sim.status not in ("deactivated", "risk_blocked"):
                if draws.value < s.risk_rate:
                    sim.status = "risk_blocked"
                elif draws.change < s.status_change_rate:
                    sim.status = NETWORK_STATUSES[1] if sim.status == "active" else "active"
            value = {"status": sim.status}
        else:
            if draws.change < s.status_change_rate / 5:
                sim.status = "unverified" if sim.status == "verified" else "verified"
            value = {"status": sim.status}
        answer = {
            "observation_id": f"{self.prefix}-{card}-{kind}-{sim.answers}",
            "account_id": account,
            "card_id": card,
            "kind": kind,
            "observed_at": self.clock.now().isoformat(),
            **value,
        }
        # On disk before it is answered: a gateway killed after answering
        # still has it in the log its successor resumes from.
        self._persist(answer, draws)
        self._served(answer)
        return answer

    def _served(self, answer: dict[str, Any]) -> None:
        self.served.append(answer)
        self.stats.answered += 1
        kind = answer["kind"]
        self.stats.by_kind[kind] = self.stats.by_kind.get(kind, 0) + 1

    def _persist(self, entry: dict[str, Any], draws: _Draws) -> None:
        path = self.settings.served_log
        if path is None:
            return
        with path.open("a", encoding="utf-8") as out:
            out.write(json.dumps({**entry, "draw": draws.number}) + "\n")

    def _resume(self, path: Path) -> None:
        """Pick up where the gateway that wrote ``path`` stopped."""
        drawn: dict[tuple[str, Kind], int] = {}
        for entry in read_log(path):
            card, kind = str(entry["card_id"]), entry["kind"]
            drawn[(card, kind)] = max(drawn.get((card, kind), 0), int(entry.get("draw", 0)))
            if entry.get("failed"):
                self.stats.failed += 1
                continue
            oid = str(entry["observation_id"])
            if not oid.startswith(f"{self.prefix}-"):
                raise InvalidInput(
                    "served_log",
                    f"{path} was written by a gateway with another seed or id prefix "
                    f"({oid!r} does not start with {self.prefix!r})",
                )
            sim = self._sim(card, kind)
            sim.answers += 1
            if kind == "traffic":
                sim.used_kb = int(entry["used_kb"])
            else:
                sim.status = str(entry["status"])
            entry.pop("draw", None)
            self._served(entry)
        # Each card's generator past every query the earlier process drew for,
        # answered or not, so the next answer is the one it would have served.
        for (card, kind), count in drawn.items():
            sim = self._sim(card, kind)
            while sim.draws < count:
                _draw(sim)
        if self.served or drawn:
            log.info("resumed from %s: %d answers served before", path, len(self.served))

    # -- operator actions ----------------------------------------------------

    def submit(
        self, account: str, card: str, action: str, request: str, callback: str | None
    ) -> dict[str, Any]:
        """Take an action on ``card``: pending until confirmed. Idempotent by ``request``."""
        if self.settings.read_only:
            raise ActionRefused(403, "the gateway is read-only")
        if action not in ACTIONS:
            raise ActionRefused(422, f"unknown action {action!r}; one of {', '.join(ACTIONS)}")
        if not request:
            raise ActionRefused(422, "an action names its request id")
        taken = self.actions.get(request)
        if taken is None:
            taken = _Action(request, account, card, action, callback, self.clock.now())
            self.actions[request] = taken
        elif (taken.account, taken.card, taken.action) != (account, card, action):
            raise ActionRefused(
                409, f"request {request!r} was taken for {taken.action} of card {taken.card}"
            )
        return self.action_status(request)

    def action_status(self, request: str) -> dict[str, Any]:
        """Where the action stands; confirmed once its time has come."""
        taken = self.actions.get(request)
        if taken is None:
            raise ActionRefused(404, f"no action request {request!r}")
        after = self.settings.confirm_after_s
        if taken.confirmed_at is None and after is not None:
            due = taken.submitted_at + timedelta(seconds=after)
            if self.clock.now() >= due:
                self._confirm(taken, due)
        return taken.view()

    def acknowledge(self, request: str) -> dict[str, Any]:
        """The app took the confirmation: no callback for it is sent again."""
        taken = self.actions.get(request)
        if taken is None:
            raise ActionRefused(404, f"no action request {request!r}")
        if taken.confirmed_at is None:
            raise ActionRefused(409, f"action request {request!r} is not confirmed yet")
        taken.acknowledged = True
        return taken.view()

    def _confirm(self, taken: _Action, at: datetime) -> None:
        taken.confirmed_at = at
        sim = self._sim(taken.card, "card_status")
        if sim.status not in RISK_STATUSES:
            sim.status = ACTIONS[taken.action]

    async def confirm(self, request: str) -> dict[str, Any]:
        """The carrier confirms ``request`` now (whatever its delay) and calls back."""
        taken = self.actions.get(request)
        if taken is None:
            raise ActionRefused(404, f"no action request {request!r}")
        if taken.confirmed_at is None:
            self._confirm(taken, self.clock.now())
        await self._call_back(taken)
        return taken.view()

    async def deliver_due(self) -> int:
        """Confirm the actions whose time has come and send their callbacks: how many went."""
        sent = 0
        for request, taken in list(self.actions.items()):
            self.action_status(request)
            due = taken.confirmed_at is not None and self.clock.monotonic() >= taken.retry_at
            if due and not (taken.delivered or taken.acknowledged):
                sent += await self._call_back(taken)
        return sent

    async def _call_back(self, taken: _Action) -> int:
        if taken.callback is None or taken.acknowledged:
            return 0
        try:
            async with httpx.AsyncClient(transport=self.callback_transport, timeout=10) as http:
                response = await http.post(taken.callback, json=taken.view())
        except httpx.HTTPError as exc:
            log.warning("callback of %s to %s failed: %s", taken.request, taken.callback, exc)
            taken.retry_at = self.clock.monotonic() + CALLBACK_RETRY_S
            return 0
        if response.status_code >= 300:
            taken.retry_at = self.clock.monotonic() + CALLBACK_RETRY_S
            log.warning(
                "callback of %s to %s answered %d",
                taken.request,
                taken.callback,
                response.status_code,
            )
            return 0
        taken.delivered = True
        return 1

    async def deliver(self) -> None:
        """Deliver callbacks until cancelled (the gateway process runs this)."""
        while True:
            try:
                await self.deliver_due()
            except Exception:
                log.exception("callback delivery failed; trying again")
            await self.clock.sleep(DELIVERY_INTERVAL_S)


def read_log(path: Path) -> Iterator[dict[str, Any]]:
    """The entries of a gateway's served-log file, failures included, in order.

    A torn last line (the gateway killed while writing it) is skipped: that
    answer was never sent.
    """
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.endswith("\n"):
                log.warning("%s:%d: torn last line skipped", path, number)
                return
            if line.strip():
                yield json.loads(line)


def read_served_log(path: Path) -> list[dict[str, Any]]:
    """What a gateway with ``--served-log path`` served (every process that wrote it)."""
    if not path.exists():
        raise InvalidInput("served_log", f"{path} does not exist")
    out = []
    for entry in read_log(path):
        if not entry.get("failed"):
            entry.pop("draw", None)
            out.append(entry)
    return out


def build_gateway_app(gateway: Gateway) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        delivery = asyncio.create_task(gateway.deliver())
        try:
            yield
        finally:
            delivery.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await delivery

    api = FastAPI(
        title="simulated carrier gateway", docs_url=None, redoc_url=None, lifespan=lifespan
    )

    @api.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"ok": True, "seed": gateway.settings.seed}

    @api.get("/v1/accounts/{account}/cards/{card}/{query}")
    async def card_query(account: str, card: str, query: str) -> Any:
        kind = PATHS.get(query)
        if kind is None:
            raise HTTPException(404, f"unknown query {query!r}; one of {', '.join(PATHS)}")
        if not gateway.admit(account):
            gateway.stats.limited += 1
            return JSONResponse(
                {"error": f"account {account} over its rate limit"},
                status_code=429,
                headers={"Retry-After": str(gateway.retry_after(account))},
            )
        answer = await gateway.query(account, card, kind)
        if answer is None:
            return JSONResponse({"error": "carrier busy"}, status_code=503)
        return answer

    @api.post("/v1/accounts/{account}/cards/{card}/suspend")
    async def suspend(account: str, card: str) -> Any:
        if gateway.settings.read_only:
            return JSONResponse({"error": "the gateway is read-only"}, status_code=403)
        return {"card_id": card, "suspended": True}

    @api.post("/v1/accounts/{account}/cards/{card}/actions")
    async def take_action(
        account: str,
        card: str,
        body: dict[str, Any] = Body(...),  # noqa: B008
    ) -> Any:
        try:
            view = gateway.submit(
                account,
                card,
                str(body.get("action", "")),
                str(body.get("request", "")),
                None if body.get("callback") is None else str(body["callback"]),
            )
        except ActionRefused as refused:
            return JSONResponse({"error": str(refused)}, status_code=refused.status)
        return JSONResponse(view, status_code=200 if view["status"] == "confirmed" else 202)

    @api.get("/v1/actions/{request}")
    async def action_status(request: str) -> Any:
        try:
            return gateway.action_status(request)
        except ActionRefused as refused:
            return JSONResponse({"error": str(refused)}, status_code=refused.status)

    @api.post("/v1/actions/{request}/ack")
    async def acknowledge(request: str) -> Any:
        try:
            return gateway.acknowledge(request)
        except ActionRefused as refused:
            return JSONResponse({"error": str(refused)}, status_code=refused.status)

    @api.get("/v1/served")
    async def served(
        offset: int = Query(0, ge=0), limit: int = Query(SERVED_PAGE, ge=1, le=SERVED_PAGE)
    ) -> dict[str, Any]:
        page = gateway.served[offset : offset + limit]
        return {"served": page, "next": offset + len(page), "total": len(gateway.served)}

    @api.get("/v1/stats")
    async def stats() -> dict[str, Any]:
        st = gateway.stats
        return {
            "answered": st.answered,
            "failed": st.failed,
            "limited": st.limited,
            "by_kind": st.by_kind,
        }

    return api


__all__ = ["KINDS", "Gateway", "GatewaySettings", "build_gateway_app", "read_served_log"]
