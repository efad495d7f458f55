"""``/v1/workflows``: list and inspect runs, start them, cancel, retry, send events.

Every route is a thin translation of one :class:`~shoal.workflow.service.Workflows`
call; the rules (idempotent start, fencing, what a cancel takes with it) live
there. A run id may hold a ``/`` (a child run's id is ``<parent>/<seq>``): the
routes take it as the rest of the path, encoded (``%2F``) or not.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Path, Query, Request, Response

from shoal.api.errors import ErrorBody
from shoal.api.storable import check_storable
from shoal.api.workflow_contract import (
    EventSent,
    RunDetail,
    RunPage,
    RunStarted,
    RunStatusName,
    SendEvent,
    StartRun,
    WorkflowList,
)
from shoal.errors import Conflict
from shoal.workflow.service import (
    MAX_PAGE,
    MAX_RUN_ID_LENGTH,
    Workflows,
    decode_cursor,
    encode_cursor,
)

DEFAULT_LIST_LIMIT = 50
# A cursor carries a run's created_at and id (at most MAX_RUN_ID_LENGTH characters).
MAX_CURSOR_LENGTH = 4 * MAX_RUN_ID_LENGTH + 128
RUN_ID = Annotated[str, Path(min_length=1, max_length=MAX_RUN_ID_LENGTH)]


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorBody} for status in statuses}


async def _detail(workflows: Workflows, run_id: str) -> dict[str, Any]:
    view = await workflows.get(run_id)
    return {**view.run.as_dict(), "steps": [s.as_dict() for s in view.steps]}


def workflows_router(workflows: Workflows) -> APIRouter:
    """The workflow routes over ``workflows`` (mounted under ``/v1``)."""
    router = APIRouter(tags=["workflows"])

    @router.get("/workflows", response_model=WorkflowList, responses=_errors(401, 403))
    async def list_workflows() -> dict[str, Any]:
        """The workflows the API's app declares (the ones ``POST /runs`` can start)."""
        return {"workflows": sorted(workflows.specs)}

    @router.get("/workflows/runs", response_model=RunPage, responses=_errors(401, 403, 422))
    async def list_runs(
        name: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
        status: RunStatusName | None = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_LIST_LIMIT,
        cursor: Annotated[str | None, Query(min_length=1, max_length=MAX_CURSOR_LENGTH)] = None,
    ) -> dict[str, Any]:
        """Runs, newest first, of one workflow ``name`` and ``status`` when given; pass
        ``next_cursor`` back as ``cursor`` for the next page."""
        before = None if cursor is None else decode_cursor(cursor)
        # One more than asked: whether there is a next page.
        runs = await workflows.list(name=name, status=status, before=before, limit=limit + 1)
        shown = runs[:limit]
        more = len(runs) > limit
        return {
            "runs": [r.as_dict() for r in shown],
            "next_cursor": encode_cursor(shown[-1]) if more else None,
        }

    @router.post(
        "/workflows/runs",
        status_code=201,
        response_model=RunStarted,
        responses={
            200: {"model": RunStarted, "description": "A run of that id existed: nothing started."},
            **_errors(401, 403, 408, 413, 422),
        },
    )
    async def start_run(body: StartRun, request: Request, response: Response) -> dict[str, Any]:
        """Start a run (201), or answer 200 with the run of the same ``id`` that exists
        (whatever its input). An undeclared ``name`` is 422 naming the declared ones."""
        check_storable(body.name, "name")
        check_storable(body.id, "id")
        check_storable(body.input, "input")
        started = await workflows.start(body.name, body.input, id=body.id)
        response.status_code = 201 if started.created else 200
        root = request.scope.get("root_path", "")
        # Quoted: an id may hold any character, a header only ASCII.
        response.headers["Location"] = f"{root}/v1/workflows/runs/{quote(started.id, safe='/')}"
        return {"id": started.id, "created": started.created}

    @router.get(
        "/workflows/runs/{run_id:path}",
        response_model=RunDetail,
        responses=_errors(401, 403, 404, 422),
    )
    async def get_run(run_id: RUN_ID) -> dict[str, Any]:
        """A run with its steps in order: each one's kind, status, attempts, result or error,
        and times (``until``: when a sleep ends, or a wait gives up)."""
        return await _detail(workflows, run_id)

    @router.post(
        "/workflows/runs/{run_id:path}/cancel",
        response_model=RunDetail,
        responses=_errors(401, 403, 404, 409, 422),
    )
    async def cancel_run(run_id: RUN_ID) -> dict[str, Any]:
        """Cancel a run not finished: the job running its step is cancelled, a sleep or wait
        ends, the batch task or child run it waits for is cancelled too. 409 once finished."""
        if not await workflows.cancel(run_id):
            view = await _detail(workflows, run_id)
            raise Conflict(
                f"run {run_id!r:.300} is {view['status']}: only an unfinished run can be cancelled",
                field="run_id",
            )
        return await _detail(workflows, run_id)

    @router.post(
        "/workflows/runs/{run_id:path}/retry",
        response_model=RunDetail,
        responses=_errors(401, 403, 404, 409, 422),
    )
    async def retry_run(run_id: RUN_ID) -> dict[str, Any]:
        """Run a failed or cancelled run again from the step that failed (the steps it
        finished keep their results). 409 for a run that is neither."""
        if not await workflows.retry(run_id):
            view = await _detail(workflows, run_id)
            raise Conflict(
                f"run {run_id!r:.300} is {view['status']}: only a failed or cancelled run "
                "can be retried",
                field="run_id",
            )
        return await _detail(workflows, run_id)

    @router.post(
        "/workflows/events",
        status_code=201,
        response_model=EventSent,
        responses=_errors(401, 403, 408, 413, 422),
    )
    async def send_event(body: SendEvent) -> dict[str, Any]:
        """Send an event to ``key``: delivered once, to one run's ``wait_for(key)``, now or
        when a run first waits for it (as ``SELECT shoal.signal(key, payload)``)."""
        check_storable(body.key, "key")
        check_storable(body.payload, "payload")
        event = await workflows.signal(body.key, body.payload)
        return {"id": event, "key": body.key}

    return router


__all__ = ["workflows_router"]
