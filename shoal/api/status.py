"""Liveness and readiness: what load balancers and orchestrators poll."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from shoal.api.contract import Health
from shoal.api.errors import ErrorBody, error_response
from shoal.db.writes import CachedWriteCheck


def health_router() -> APIRouter:
    """``/healthz``: the process is up and serving. Never touches the database."""
    router = APIRouter(tags=["health"])

    @router.get("/healthz", response_model=Health)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return router


def ready_router(writes: CachedWriteCheck) -> APIRouter:
    """``/readyz``: the database commits a write within
    :data:`~shoal.db.writes.WRITE_TIMEOUT`.

    A read alone is not enough: a primary whose synchronous standby is gone
    answers reads while every commit waits. The probe's answer is reused for
    :data:`~shoal.db.writes.CHECK_MAX_AGE`, so a burst of probes makes one write.
    """
    router = APIRouter(tags=["health"])

    @router.get("/readyz", response_model=Health, responses={503: {"model": ErrorBody}})
    async def readyz() -> Any:
        check = await writes.get()
        if not check.is_writable:
            return error_response(503, check.message, field="database", code="not_ready")
        return {"status": "ready"}

    return router


__all__ = ["health_router", "ready_router"]
