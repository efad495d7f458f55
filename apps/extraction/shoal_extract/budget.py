"""The model's budget across every worker: a pause an endpoint asked for, and rates.

One row per model in ``model_budget`` holds what all workers share:

- **a pause**: an endpoint that answers 429 with ``Retry-After`` is not called
  again, by any worker, before that time (a later pause never shortens one in
  force). The call that was told to wait waits too, and calls again: the
  item keeps running, and neither fails nor spends a retry;
- **requests per minute** and **tokens per minute**: two token buckets,
  refilled lazily from the time they were last counted (nothing ticks). A call
  takes one request and its estimated tokens; when its answer says what it
  really used, the difference is charged (a bucket may go into debt, which the
  refill pays back before the next call).

Claims lock the row, so two workers never both take the last request; the
lock is held for one short transaction, never across a model call. A worker
that must wait sleeps on its clock and asks again.

Not the extraction kind's limits (partitioned by model), which hold item
starts: an item makes several calls, the budget has two buckets, a call's
tokens are known only inside the run, a pause must hold the calls of running
items, and the model is the worker's setting, not the item's
(apps/extraction/README.md, "The model budget across workers").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from shoal import Clock
from shoal_extract.schema import AsyncConn
from shoal_extract.store import ExtractStore

PER_MINUTE = 60.0


@dataclass(frozen=True, slots=True)
class Rates:
    """Requests and tokens per minute across all workers; ``None``: unlimited."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None


@dataclass(frozen=True, slots=True)
class BudgetState:
    model: str
    paused_until: datetime | None
    requests: float | None  # in the bucket when last counted (None: full)
    tokens: float | None
    paused_for_s: float  # from now; 0 when no pause is in force

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "paused_until": self.paused_until.isoformat() if self.paused_until else None,
            "paused_for_s": round(self.paused_for_s, 3),
            "requests": None if self.requests is None else round(self.requests, 3),
            "tokens": None if self.tokens is None else round(self.tokens, 3),
        }


def refill(level: float | None, per_minute: int, elapsed_s: float) -> float:
    """A bucket's level after ``elapsed_s``: full when never counted, capped at full."""
    if level is None:
        return float(per_minute)
    return min(float(per_minute), level + per_minute * max(0.0, elapsed_s) / PER_MINUTE)


class ModelGate:
    """Waits for the shared budget before each call; records pauses and real usage."""

    def __init__(self, store: ExtractStore, clock: Clock, rates: Rates | None = None) -> None:
        self.store = store
        self.clock = clock
        self.rates = rates or Rates()

    async def acquire(self, model: str, tokens: int) -> float:
        """Wait until a call of about ``tokens`` may go; the seconds waited (clock time)."""
        waited = 0.0
        while True:
            wait = await self.take(model, tokens)
            if wait <= 0:
                return waited
            await self.clock.sleep(wait)
            waited += wait

    async def take(self, model: str, tokens: int) -> float:
        """Take one call from the budget now, or say how long until one may be taken."""
        rpm, tpm = self.rates.requests_per_minute, self.rates.tokens_per_minute
        q = self.store.q
        args = {"model": model, "now": self.clock.sql_now()}

        async def claim(conn: AsyncConn) -> float:
            await conn.execute(q["budget_ensure"], args)
            cur = await conn.execute(q["budget_row"], args)
            row = await cur.fetchone()
            assert row is not None
            paused_until, requests, bucket, counted_at, now = row
            if paused_until is not None and paused_until > now:
                left: float = (paused_until - now).total_seconds()
                return max(left, 0.001)
            if rpm is None and tpm is None:
                return 0.0
            elapsed = (now - counted_at).total_seconds() if counted_at else 0.0
            req = refill(requests, rpm, elapsed) if rpm is not None else None
            tok = refill(bucket, tpm, elapsed) if tpm is not None else None
            waits = [0.0]
            if req is not None and rpm is not None and req < 1:
                waits.append((1 - req) * PER_MINUTE / rpm)
            # A call bigger than the whole bucket goes when the bucket is full.
            need = min(float(tokens), float(tpm)) if tpm is not None else 0.0
            if tok is not None and tpm is not None and tok < need:
                waits.append((need - tok) * PER_MINUTE / tpm)
            wait = max(waits)
            if wait <= 0:
                req = None if req is None else req - 1
                tok = None if tok is None else tok - tokens
            await conn.execute(
                q["budget_update"],
                {"model": model, "requests": req, "tokens": tok, "counted_at": now},
            )
            return wait

        return await self.store.db.run(claim)

    async def settle(self, model: str, estimated: int, used: int) -> None:
        """Charge the tokens bucket what the call really used beyond its estimate."""
        if self.rates.tokens_per_minute is not None and used != estimated:
            await self.store.db.fetch(
                self.store.q["budget_settle"], {"model": model, "extra": used - estimated}
            )

    async def pause(self, model: str, seconds: float) -> datetime:
        """No worker calls ``model`` for ``seconds`` from now; the end of the pause in force."""
        found = await self.store.db.fetch(
            self.store.q["budget_pause"],
            {"model": model, "seconds": max(0.0, seconds), "now": self.clock.sql_now()},
        )
        paused_until: datetime = found[0][0]
        return paused_until

    async def states(self) -> list[BudgetState]:
        found = await self.store.db.fetch(
            self.store.q["budget_state"], {"now": self.clock.sql_now()}
        )
        return [_state(r) for r in found]


def _state(row: Sequence[Any]) -> BudgetState:
    model, paused_until, requests, tokens, _counted_at, now = row
    left = (paused_until - now) if paused_until is not None else timedelta(0)
    return BudgetState(model, paused_until, requests, tokens, max(0.0, left.total_seconds()))


__all__ = ["BudgetState", "ModelGate", "Rates", "refill"]
