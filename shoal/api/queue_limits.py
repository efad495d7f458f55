"""``GET /v1/limits``: each limited queue's partitions, running against their limits.

The same read as :meth:`Shoal.limits`, for the console and scripts.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from shoal.api.errors import ErrorBody
from shoal.queue.client import Shoal
from shoal.queue.limits import LimitState

# Most partitions one answer lists (busiest first).
MAX_LIMIT_ROWS = 10_000
DEFAULT_LIMIT_ROWS = 1000


class LimitRow(BaseModel):
    queue: str
    partition_key: str | None = Field(
        description="The partition ('' when the queue is not partitioned); "
        "null for a limited queue with no jobs."
    )
    partition_by: str | None = Field(description="The data field or function keying partitions.")
    global_concurrency: int | None = Field(description="Most active jobs per partition.")
    running: int = Field(description="Active jobs of the partition now.")
    waiting: int = Field(description="Jobs of the partition waiting to run (due or not).")
    rate_count: int | None = None
    rate_per_s: float | None = Field(default=None, description="The rate's period, in seconds.")
    rate_burst: int | None = None
    tokens: float | None = Field(description="What the partition's bucket holds now.")
    paused_until: str | None = Field(description="Held back by a handler's RetryAfter until then.")


class LimitList(BaseModel):
    limits: list[LimitRow]


def limit_row(state: LimitState) -> dict[str, Any]:
    rate = state.rate
    return {
        "queue": state.queue,
        "partition_key": state.partition_key,
        "partition_by": state.partition_by,
        "global_concurrency": state.global_concurrency,
        "running": state.running,
        "waiting": state.waiting,
        "rate_count": None if rate is None else rate.count,
        "rate_per_s": None if rate is None else rate.per.total_seconds(),
        "rate_burst": None if rate is None else rate.burst,
        "tokens": state.tokens,
        "paused_until": None if state.paused_until is None else state.paused_until.isoformat(),
    }


def limits_router(boss: Shoal) -> APIRouter:
    router = APIRouter(tags=["queues"])

    @router.get(
        "/limits",
        response_model=LimitList,
        responses={401: {"model": ErrorBody}, 422: {"model": ErrorBody}},
    )
    async def list_limits(
        queue: Annotated[str | None, Query(description="One queue (default: all).")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT_ROWS)] = DEFAULT_LIMIT_ROWS,
    ) -> dict[str, Any]:
        """Each limited queue's partitions: running against the limit, tokens, pauses."""
        return {"limits": [limit_row(s) for s in await boss.limits(queue, limit=limit)]}

    return router


__all__ = ["limits_router"]
