"""The workbench over HTTP: ``/v1/extraction/...`` routes and the page at ``/extraction``.

Mounted onto the FastAPI app that :func:`shoal.api.create_api` returns, so
one server answers shoal's ``/v1`` task routes, its dashboard at ``/`` and
the workbench; shoal's error handlers give every refusal the same JSON shape
(``{"error", "message", "field"}``), and its request limits apply.

==========================================  ===========================================
route                                        answers
==========================================  ===========================================
``POST /v1/extraction/documents?filename=``  the raw file as the body: 201 stored, 200
                                             already stored (same bytes), 422 refused
``GET  /v1/extraction/documents``            ``{"documents": [...], "next_cursor"}``
``GET  /v1/extraction/documents/{id}/``      ``pages/{n}.png?scale=``: page n of a PDF,
                                             rendered; 404 no such page, 422 not a PDF
``GET  /v1/extraction/documents/{id}/``      ``pages/{n}/highlight?quote=``: the quote's
                                             boxes on the page, 0..1 from its top left
``GET  /v1/extraction/templates``            ``{"templates": [...]}`` (newest versions)
``POST /v1/extraction/templates``            201 new version, 200 unchanged, 422
``POST /v1/extraction/tasks``                ``{document_ids, template, extractor}``: 202
``GET  /v1/extraction/tasks``                ``{"tasks": [...]}``, newest first
``GET  /v1/extraction/tasks/{id}/results``   ``{"fields", "results", "next_cursor"}``
``GET  /v1/extraction/tasks/{id}/export``    ``?format=csv|jsonl``, streamed
``POST /v1/extraction/tasks/{id}/reviews``   ``{item_id, field, action, value?}``: 201
``POST /v1/extraction/tasks/{id}/rerun``     ``{documents, template?, ...}``: 202, a new task
``POST /v1/extraction/runs``                 ``{document_ids, template, extractor,``
                                             ``review_timeout_s?, run_id?}``: 202, the whole
                                             flow as one workflow run (import to export)
``GET  /v1/extraction/runs/{run_id}``        the run, its steps, its task and its result
``POST /v1/extraction/tasks/{id}/review-done``  the reviewer is done: 202, the run waiting
                                             for it exports; 409 when none waits
``GET  /v1/extraction/budget``               the model budgets: pauses, buckets
==========================================  ===========================================

A review is stored with the name of the token that sent it (``token_name``;
``local`` on an API without a token, which only this machine can reach). An
API started read-only (``shoal api --read-only``) refuses every write here
too, with shoal's 403.

Progress, cancel and retry-failed are shoal's own routes (``/v1/tasks/{id}``).
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from functools import cache
from importlib import resources
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Header, Path, Query, Request, Response
from fastapi.responses import HTMLResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from shoal import InvalidInput
from shoal.workflow import RunView, StepKind
from shoal_extract.evidence import MAX_QUOTE_CHARS
from shoal_extract.export import MEDIA_TYPES, export_lines
from shoal_extract.kinds import DEFAULT_REVIEW_TIMEOUT, MAX_REVIEW_TIMEOUT
from shoal_extract.page_view import DEFAULT_SCALE, MAX_SCALE, MIN_SCALE
from shoal_extract.templates import parse_template
from shoal_extract.workbench import MAX_TASK_DOCUMENTS, Upload, Workbench

PAGE = "workbench.html"
PAGE_PATH = "/extraction"
MAX_PAGE_LIMIT = 1000
# A stored document's bytes never change (a new upload is a new document), so
# its rendered pages may be kept; private, as the API may need a token.
PAGE_IMAGE_CACHE = "private, max-age=86400, immutable"
# The same page rules as shoal's dashboard: everything inline or same-origin; blob:
# images are the rendered pages, fetched with the token and shown from memory.
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src 'self' data: blob:; frame-ancestors 'none'"
    ),
    "Cache-Control": "no-cache",
}


class StartTask(BaseModel):
    """``POST /v1/extraction/tasks``: extract ``template`` from each document."""

    model_config = ConfigDict(extra="forbid", strict=True)

    document_ids: list[int] = Field(min_length=1, max_length=MAX_TASK_DOCUMENTS)
    template: str = Field(min_length=1, max_length=63)
    extractor: Literal["rules", "llm", "rules+llm"] = "rules"
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=255)


class StartRun(BaseModel):
    """``POST /v1/extraction/runs``: the whole flow over ``document_ids``, as one workflow run."""

    model_config = ConfigDict(extra="forbid", strict=True)

    document_ids: list[int] = Field(min_length=1, max_length=MAX_TASK_DOCUMENTS)
    template: str = Field(min_length=1, max_length=63)
    extractor: Literal["rules", "llm", "rules+llm"] = "rules"
    # How long the run waits for the reviewer's "done" before it exports without it.
    review_timeout_s: float = Field(
        default=DEFAULT_REVIEW_TIMEOUT.total_seconds(),
        gt=0,
        le=MAX_REVIEW_TIMEOUT.total_seconds(),
    )
    run_id: str | None = Field(default=None, min_length=1, max_length=200)


class ReviewValue(BaseModel):
    """``POST /v1/extraction/tasks/{id}/reviews``: accept a value, or correct it."""

    model_config = ConfigDict(extra="forbid", strict=True)

    item_id: int = Field(ge=1, le=2**63 - 1)
    field: str = Field(min_length=1, max_length=63)
    action: Literal["accept", "correct"]
    # The corrected value (null: the paper does not state it); ignored by accept.
    value: Any = None


class Rerun(BaseModel):
    """``POST /v1/extraction/tasks/{id}/rerun``: some documents again, as a new task."""

    model_config = ConfigDict(extra="forbid", strict=True)

    documents: Literal["failed"] | list[int] = Field(union_mode="left_to_right")
    template: str | None = Field(default=None, min_length=1, max_length=63)
    template_version: int | None = Field(default=None, ge=1, le=2**31 - 1)
    extractor: Literal["rules", "llm", "rules+llm"] | None = None
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=255)


# Methods that change nothing: all a read-only API answers (as shoal's own routes).
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOCAL_REVIEWER = "local"  # who reviews on an API without a token (loopback only)


class Refused(HTTPException):
    """A 401/403 in shoal's error shape (its handler reads ``field``)."""

    def __init__(
        self,
        status: int,
        message: str,
        headers: dict[str, str] | None = None,
        *,
        field: str = "authorization",
    ) -> None:
        super().__init__(status, message, headers)
        self.field = field


def refuse_writes(read_only: bool) -> Callable[..., Awaitable[None]]:
    """With ``read_only``, anything but GET, HEAD and OPTIONS is answered 403."""

    async def check(request: Request) -> None:
        if read_only and request.method not in READ_METHODS:
            raise Refused(
                403,
                f"method: this API is read-only (shoal api --read-only); "
                f"{request.method} {request.url.path!r:.200} changes state",
                field="method",
            )

    return check


def require_bearer(token: str | None) -> Callable[..., Awaitable[None]]:
    """The workbench's routes ask for the same bearer token as shoal's ``/v1``."""

    async def check(authorization: Annotated[str | None, Header()] = None) -> None:
        if token is None:
            return
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not given:
            raise Refused(
                401,
                "authorization: this API needs an 'Authorization: Bearer <token>' header",
                {"WWW-Authenticate": 'Bearer realm="shoal"'},
            )
        if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode()):
            raise Refused(403, "authorization: the bearer token is not valid for this API")

    return check


@cache
def page() -> str:
    return resources.files("shoal_extract").joinpath("static", PAGE).read_text("utf-8")


def run_as_dict(view: RunView) -> dict[str, Any]:
    """A run of the flow as the API answers it."""
    run = view.run
    task = next((s.result for s in view.steps if s.kind is StepKind.BATCH), None)
    return {
        "run_id": run.id,
        "status": run.status.value,
        "task_id": task.get("task_id") if isinstance(task, dict) else None,
        "waiting_for": run.wait_key,
        "input": run.input,
        "result": run.result,
        "error": run.error,
        "created_at": run.created_at.isoformat(),
        "finished_at": None if run.finished_at is None else run.finished_at.isoformat(),
        "steps": [
            {
                "seq": s.seq,
                "name": s.name,
                "kind": s.kind.value,
                "status": s.status.value,
                "attempts": s.attempts,
                "finished_at": None if s.finished_at is None else s.finished_at.isoformat(),
            }
            for s in view.steps
        ],
    }


def mount_workbench(
    api: FastAPI,
    workbench: Workbench,
    *,
    token: str | None,
    token_name: str | None = None,
    read_only: bool | None = None,
) -> FastAPI:
    """Add the workbench's routes and page to ``api`` (from ``create_api``); returns it.

    ``token_name`` names whoever holds ``token`` in the reviews they store
    (default ``api``); ``read_only`` defaults to what ``create_api`` was told.
    """
    if read_only is None:
        read_only = bool(getattr(api.state, "read_only", False))
    reviewer = (token_name or "api") if token is not None else LOCAL_REVIEWER
    router = APIRouter(
        prefix="/v1/extraction",
        dependencies=[Depends(require_bearer(token)), Depends(refuse_writes(read_only))],
        tags=["extraction"],
    )

    @router.post("/documents", status_code=201)
    async def upload_document(
        request: Request,
        response: Response,
        filename: Annotated[str | None, Query(max_length=1000)] = None,
    ) -> dict[str, Any]:
        """Store one file sent as the raw body; the same bytes again answer 200."""
        content = await request.body()
        (row,) = await workbench.upload([Upload(filename or "", content)])
        if not row.created:
            response.status_code = 200
        return {"document": row.as_dict(), "created": row.created}

    @router.get("/documents")
    async def list_documents(
        cursor: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE_LIMIT)] = 100,
    ) -> dict[str, Any]:
        rows = await workbench.documents(cursor=cursor, limit=limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        return {
            "documents": [r.as_dict() for r in rows],
            "next_cursor": rows[-1].id if more and rows else None,
        }

    @router.get("/documents/{document_id}/pages/{page_number}.png")
    async def page_image(
        request: Request,
        document_id: Annotated[int, Path(ge=1, le=2**63 - 1)],
        page_number: Annotated[int, Path(ge=1, le=100_000)],
        scale: Annotated[float, Query(ge=MIN_SCALE, le=MAX_SCALE)] = DEFAULT_SCALE,
    ) -> Response:
        """Page ``page_number`` of a stored PDF, rendered by PDFium, as a PNG."""
        row, png = await workbench.page_image(document_id, page_number, scale=scale)
        tag = f'"{row.sha256[:32]}-{page_number}-{scale:g}"'
        headers = {"Cache-Control": PAGE_IMAGE_CACHE, "ETag": tag}
        if request.headers.get("if-none-match") == tag:
            return Response(status_code=304, headers=headers)
        return Response(png, media_type="image/png", headers=headers)

    @router.get("/documents/{document_id}/pages/{page_number}/highlight")
    async def page_highlight(
        document_id: Annotated[int, Path(ge=1, le=2**63 - 1)],
        page_number: Annotated[int, Path(ge=1, le=100_000)],
        quote: Annotated[str, Query(min_length=1, max_length=MAX_QUOTE_CHARS)],
    ) -> dict[str, Any]:
        """The boxes of ``quote`` on the page (0..1 from its top left); none if absent."""
        found = await workbench.quote_on_page(document_id, page_number, quote)
        return {"document_id": document_id, "quote": quote, **found.as_dict()}

    @router.get("/templates")
    async def list_templates() -> dict[str, Any]:
        return {"templates": [t.as_dict() for t in await workbench.store.latest_templates()]}

    @router.post("/templates", status_code=201)
    async def save_template(request: Request, response: Response) -> dict[str, Any]:
        try:
            raw = await request.json()
        except ValueError:
            raise InvalidInput("body", "not valid JSON: send a template object") from None
        stored, created = await workbench.store.save_template(parse_template(raw, field=""))
        if not created:
            response.status_code = 200
        return {"template": stored.as_dict(), "created": created}

    @router.post("/tasks", status_code=202)
    async def start_task(body: StartTask, response: Response) -> dict[str, Any]:
        """Start one extraction task: its items and jobs are created in one transaction."""
        created = await workbench.start(
            body.document_ids,
            body.template,
            extractor=body.extractor,
            idempotency_key=body.idempotency_key,
        )
        if not created.created:
            response.status_code = 200
        return {"task_id": created.task_id, "created": created.created}

    @router.get("/tasks")
    async def list_tasks(
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
    ) -> dict[str, Any]:
        return {"tasks": [t.as_dict() for t in await workbench.tasks(limit=limit)]}

    @router.get("/tasks/{task_id}/results")
    async def results(
        task_id: str,
        cursor: Annotated[int | None, Query(ge=0, le=2**63 - 1)] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE_LIMIT)] = 100,
        status: Annotated[
            Literal["pending", "running", "completed", "error", "cancelled"] | None, Query()
        ] = None,
    ) -> dict[str, Any]:
        page_ = await workbench.results(task_id, cursor=cursor, limit=limit, status=status)
        usage = await workbench.usage(task_id)
        return {
            "fields": list(page_.fields),
            "results": [line.as_dict() for line in page_.lines],
            "next_cursor": page_.next_cursor,
            "usage": usage.as_dict(),
        }

    @router.get("/tasks/{task_id}/export")
    async def export(
        task_id: str, format: Annotated[Literal["csv", "jsonl"], Query()] = "csv"
    ) -> StreamingResponse:
        page_ = await workbench.all_results(task_id)

        async def lines() -> AsyncIterator[str]:
            for line in export_lines(page_, format):
                yield line

        return StreamingResponse(
            lines(),
            media_type=MEDIA_TYPES[format],
            headers={
                "Content-Disposition": f'attachment; filename="extraction-{task_id}.{format}"'
            },
        )

    @router.post("/tasks/{task_id}/reviews", status_code=201)
    async def review(task_id: str, body: ReviewValue) -> dict[str, Any]:
        """Accept or correct one value; stored with the token's name and the time."""
        if body.action == "accept" and "value" in body.model_fields_set:
            raise InvalidInput("value", "accept takes no value: it keeps the extracted one")
        if body.action == "correct" and "value" not in body.model_fields_set:
            raise InvalidInput(
                "value", "correct needs the value (null: the paper does not state it)"
            )
        stored = await workbench.review(
            task_id, body.item_id, body.field, body.action, reviewer=reviewer, value=body.value
        )
        return {"review": stored.as_dict()}

    @router.post("/tasks/{task_id}/rerun", status_code=202)
    async def rerun(task_id: str, body: Rerun, response: Response) -> dict[str, Any]:
        """Some documents of a task (or its failed ones) again, as a new task."""
        created, ids = await workbench.rerun(
            task_id,
            body.documents,
            template=body.template,
            template_version=body.template_version,
            extractor=body.extractor,
            idempotency_key=body.idempotency_key,
        )
        if not created.created:
            response.status_code = 200
        return {
            "task_id": created.task_id,
            "created": created.created,
            "rerun_of": task_id,
            "document_ids": ids,
        }

    @router.post("/runs", status_code=202)
    async def start_run(body: StartRun, response: Response) -> dict[str, Any]:
        """Start the flow (import, extract, wait for the review, export) as one run."""
        started = await workbench.start_run(
            body.document_ids,
            body.template,
            extractor=body.extractor,
            review_timeout=timedelta(seconds=body.review_timeout_s),
            run_id=body.run_id,
        )
        if not started.created:
            response.status_code = 200
        return {"run_id": started.id, "created": started.created}

    @router.get("/runs/{run_id}")
    async def get_run(run_id: Annotated[str, Path(min_length=1, max_length=200)]) -> dict[str, Any]:
        """A run of the flow: its status, steps, task (once created) and result."""
        return run_as_dict(await workbench.run(run_id))

    @router.post("/tasks/{task_id}/review-done", status_code=202)
    async def review_done(task_id: str) -> dict[str, Any]:
        """The reviewer is done with the task: the run waiting for it goes on to export."""
        run_id = await workbench.finish_review(task_id, reviewer=reviewer)
        return {"task_id": task_id, "run_id": run_id, "reviewer": reviewer}

    @router.get("/budget")
    async def budget() -> dict[str, Any]:
        """The model budgets shared by every worker: pauses in force, rate buckets."""
        return {"models": [state.as_dict() for state in await workbench.budget()]}

    api.include_router(router)

    @api.get(PAGE_PATH, response_class=HTMLResponse, include_in_schema=False)
    async def workbench_page() -> HTMLResponse:
        return HTMLResponse(page(), headers=PAGE_HEADERS)

    return api


__all__ = [
    "PAGE_PATH",
    "Rerun",
    "ReviewValue",
    "StartRun",
    "StartTask",
    "mount_workbench",
    "refuse_writes",
    "require_bearer",
    "run_as_dict",
]
