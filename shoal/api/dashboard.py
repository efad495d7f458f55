"""``/``: the dashboard, one static HTML page with inline JS and CSS (no build step).

The page polls ``/v1/tasks`` every second (the reference polls with React
Query) and draws a progress bar per task; it reads failed items from
``/v1/tasks/{id}/items?status=error`` and offers cancel and retry-failed. The
page itself holds no data, so it is served without auth; when the API answers
401 it asks for the token, keeps it in the tab's ``sessionStorage`` and sends it
as ``Authorization: Bearer`` from then on.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

PAGE = "dashboard.html"


@cache
def page() -> str:
    return resources.files("shoal.api").joinpath("static", PAGE).read_text("utf-8")


def dashboard_router() -> APIRouter:
    router = APIRouter()

    @router.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def dashboard() -> HTMLResponse:
        return HTMLResponse(
            page(),
            headers={
                # Everything the page needs is inline or same-origin.
                "Content-Security-Policy": (
                    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                    "connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'"
                ),
                "Cache-Control": "no-cache",
            },
        )

    return router


__all__ = ["dashboard_router", "page"]
