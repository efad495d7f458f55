"""Liveness and readiness: what load balancers and orchestrators poll."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

from fastapi import APIRouter

from shoal.api.contract import Health
from shoal.api.errors import ErrorBody, error_response
from shoal.db.pool import AsyncConn
from shoal.queue.client import Shoal

log = logging.getLogger("shoal.api")

# A readiness probe must answer before the prober gives up (often 1-5 s); a
# database that cannot say "1" in this long is not ready, whatever the cause.
READY_TIMEOUT_S = 2.0


def health_router() -> APIRouter:
    """``/healthz``: the process is up and serving. Never touches the database."""
    router = APIRouter(tags=["health"])

    @router.get("/healthz", response_model=Health)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return router


def ready_router(boss: Shoal) -> APIRouter:
    """``/readyz``: the database answers a query within :data:`READY_TIMEOUT_S`."""
    router = APIRouter(tags=["health"])

    async def ping(conn: AsyncConn) -> None:
        await conn.execute("SELECT 1")

    @router.get("/readyz", response_model=Health, responses={503: {"model": ErrorBody}})
    async def readyz() -> Any:
        try:
            async with asyncio.timeout(READY_TIMEOUT_S):
                await boss.db.run(
                    ping, deadline=timedelta(seconds=READY_TIMEOUT_S), transaction=False
                )
        except Exception as exc:  # any failure means "not ready"; the reason goes to the log
            log.warning("readiness check failed: %s: %s", type(exc).__name__, exc)
            return error_response(
                503,
                f"database: not answering ({type(exc).__name__})",
                field="database",
                code="not_ready",
            )
        return {"status": "ready"}

    return router


__all__ = ["READY_TIMEOUT_S", "health_router", "ready_router"]
