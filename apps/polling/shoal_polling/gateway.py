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

Every successful answer is kept in the served log (``GET /v1/served``), which
``shoal-polling reconcile`` compares with what was recorded and applied.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Query
from fastapi.responses import JSONResponse

from shoal import Clock, SystemClock
from shoal_polling.domain import KINDS, NETWORK_STATUSES, Kind

DEFAULT_PORT = 8900
DEFAULT_RATE_LIMIT = 200.0  # queries per second per account
DEFAULT_LATENCY_MS = 20.0
SERVED_PAGE = 10_000
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


@dataclass(slots=True)
class _CardSim:
    rng: random.Random
    answers: int = 0
    used_kb: int = 0
    status: str = "active"


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

    def __init__(self, settings: GatewaySettings, *, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self.prefix = settings.id_prefix or f"s{settings.seed}"
        self.cards: dict[tuple[str, Kind], _CardSim] = {}
        self.buckets: dict[str, _Bucket] = {}
        self.served: list[dict[str, Any]] = []
        self.stats = GatewayStats()

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

    async def query(self, account: str, card: str, kind: Kind) -> dict[str, Any] | None:
        """One answer about ``card``, after its latency; None for a simulated failure."""
        sim = self._sim(card, kind)
        s = self.settings
        # Every draw, used or not, so the n-th answer never depends on the flags' effect.
        latency_draw = sim.rng.gauss(0.0, 1.0)
        fail_draw = sim.rng.random()
        value_draw = sim.rng.random()
        change_draw = sim.rng.random()
        increment = sim.rng.randint(0, 400)
        latency_ms = s.latency_ms * math.exp(s.latency_sigma * latency_draw)
        if s.latency_range_ms is not None:
            low, high = s.latency_range_ms
            latency_ms = min(max(latency_ms, low), high)
        latency_s = latency_ms / 1000.0
        await self.clock.sleep(latency_s)
        if fail_draw < s.error_rate:
            self.stats.failed += 1
            return None
        sim.answers += 1
        if kind == "traffic":
            sim.used_kb += increment
            value: dict[str, Any] = {"used_kb": sim.used_kb}
        elif kind == "card_status":
            if sim.status not in ("deactivated", "risk_blocked"):
                if value_draw < s.risk_rate:
                    sim.status = "risk_blocked"
                elif change_draw < s.status_change_rate:
                    sim.status = NETWORK_STATUSES[1] if sim.status == "active" else "active"
            value = {"status": sim.status}
        else:
            if change_draw < s.status_change_rate / 5:
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
        self.served.append(answer)
        self.stats.answered += 1
        self.stats.by_kind[kind] = self.stats.by_kind.get(kind, 0) + 1
        if s.served_log is not None:
            with s.served_log.open("a", encoding="utf-8") as out:
                out.write(json.dumps(answer) + "\n")
        return answer


def build_gateway_app(gateway: Gateway) -> FastAPI:
    api = FastAPI(title="simulated carrier gateway", docs_url=None, redoc_url=None)

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
                headers={"Retry-After": "1"},
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


__all__ = ["KINDS", "Gateway", "GatewaySettings", "build_gateway_app"]
