"""The console's pages: ``/`` (queues, jobs, schedules, topics, workers, charts)
and ``/tasks`` (batch tasks). Each is one static HTML page with inline JS and
CSS (no build step, nothing fetched from elsewhere: they work offline).

The pages poll the ``/v1`` API. The console at ``/`` routes by the URL's hash
(``#/jobs?queue=email&state=failed``) and draws its charts as SVG itself; the
tasks page draws a progress bar per task, reads failed items from
``/v1/tasks/{id}/items?status=error`` and offers cancel and retry-failed. The
pages hold no data, so they are served without auth; when the API answers 401
they ask for the token, keep it in the tab's ``sessionStorage`` and send it as
``Authorization: Bearer`` from then on.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

CONSOLE_PAGE = "console.html"
TASKS_PAGE = "dashboard.html"
# Everything the pages need is inline or same-origin.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'"
    ),
    "Cache-Control": "no-cache",
}


@cache
def page(name: str = TASKS_PAGE) -> str:
    return resources.files("shoal.api").joinpath("static", name).read_text("utf-8")


def dashboard_router() -> APIRouter:
    router = APIRouter()

    @router.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def console() -> HTMLResponse:
        return HTMLResponse(page(CONSOLE_PAGE), headers=HEADERS)

    @router.get("/tasks", response_class=HTMLResponse, include_in_schema=False)
    async def tasks() -> HTMLResponse:
        return HTMLResponse(page(TASKS_PAGE), headers=HEADERS)

    return router


__all__ = ["dashboard_router", "page"]
