"""``/v1/tasks``: create, read, page items, cancel, retry failed items, export.

Every route is a thin translation of one :class:`~shoal.batch.service.Batches`
call; the rules (one transaction, idempotency, caps) live there.
"""

from __future__ import annotations

import csv
import io
import json
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import StreamingResponse

from shoal.api.contract import (
    Created,
    CreateTask,
    ItemPage,
    ItemStatusName,
    Retried,
    TaskList,
    TaskOut,
    TaskStatusName,
)
from shoal.api.errors import ErrorBody
from shoal.api.storable import check_storable
from shoal.batch.inputs import MAX_KEY_LENGTH, MAX_REF_LENGTH
from shoal.batch.rows import ItemRow
from shoal.batch.service import Batches
from shoal.batch.states import TaskStatus
from shoal.errors import InvalidInput, NotFound

DEFAULT_LIST_LIMIT = 50
MAX_LIST_LIMIT = 500
DEFAULT_PAGE_LIMIT = 100
MAX_PAGE_LIMIT = 1000
# Item ids are Postgres bigints: a larger cursor would fail in the driver.
MAX_CURSOR = 2**63 - 1
EXPORT_PAGE = 1000
CSV_COLUMNS = ("id", "ref", "status", "attempts", "result", "error", "finished_at")


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorBody} for status in statuses}


def task_id_of(raw: str) -> str:
    """The canonical form of a task id; NotFound when ``raw`` cannot be one.

    Python's ``uuid.UUID`` accepts spellings (``urn:uuid:...``, ``+`` signs)
    that Postgres' uuid type refuses; the canonical form is one it takes.
    """
    try:
        return str(uuid.UUID(raw))
    except ValueError:
        raise NotFound(f"task {raw!r:.80} does not exist") from None


def item_dict(row: ItemRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "ref": row.ref,
        "status": row.status.value,
        "attempts": row.attempts,
        "data": row.data,
        "result": row.result,
        "error": row.error,
        "errors": [dict(e) for e in row.errors],
        "started_at": None if row.started_at is None else row.started_at.isoformat(),
        "updated_at": row.updated_at.isoformat(),
        "finished_at": None if row.finished_at is None else row.finished_at.isoformat(),
    }


def _csv_line(row: ItemRow) -> str:
    out = io.StringIO()
    csv.writer(out).writerow(
        [
            row.id,
            row.ref,
            row.status.value,
            row.attempts,
            "" if row.result is None else json.dumps(row.result, ensure_ascii=False),
            row.error or "",
            "" if row.finished_at is None else row.finished_at.isoformat(),
        ]
    )
    return out.getvalue()


def tasks_router(batches: Batches) -> APIRouter:
    """The task routes over ``batches`` (mounted under ``/v1``)."""
    router = APIRouter(tags=["tasks"])

    @router.post(
        "/tasks",
        status_code=202,
        response_model=Created,
        responses={
            200: {"model": Created, "description": "An idempotent repeat: the existing task."},
            **_errors(401, 403, 408, 409, 413, 422),
        },
    )
    async def create_task(
        body: CreateTask,
        request: Request,
        response: Response,
        idempotency_key_header: Annotated[
            str | None,
            Header(alias="Idempotency-Key", max_length=MAX_KEY_LENGTH),
        ] = None,
    ) -> dict[str, Any]:
        """Create a task, its items and their jobs in one transaction (202).

        The same idempotency key with the same request answers 200 and the same
        task id; with a different request 422; while an identical request is
        still being created 409 (retry it). The kind is one of the API's App, or one
        a worker of another App stored at its start; any other is 422 naming both.
        """
        key = body.idempotency_key
        if idempotency_key_header is not None:
            if key is not None and key != idempotency_key_header:
                raise InvalidInput(
                    "idempotency_key",
                    "differs from the Idempotency-Key header; send one or make them equal",
                )
            key = idempotency_key_header
        check_storable(body.kind, "kind")
        check_storable(key, "idempotency_key")
        check_storable(body.items, "items")
        check_storable(body.params, "params")
        created = await batches.create(
            body.kind,
            body.items,
            idempotency_key=key,
            params=body.params,
            deadline=body.deadline_s,
        )
        response.status_code = 202 if created.created else 200
        # Under the API's mount prefix (or a proxy's root_path), where the task is.
        root = request.scope.get("root_path", "")
        response.headers["Location"] = f"{root}/v1/tasks/{created.task_id}"
        return {"task_id": created.task_id, "created": created.created}

    @router.get("/tasks", response_model=TaskList, responses=_errors(401, 403, 422))
    async def list_tasks(
        status: TaskStatusName | None = None,
        kind: Annotated[str | None, Query(min_length=1, max_length=128)] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT)] = DEFAULT_LIST_LIMIT,
    ) -> dict[str, Any]:
        """Tasks with their progress, elapsed time and estimate, newest first; of one
        ``status`` and ``kind`` when given (a kind with no task lists none)."""
        views = await batches.tasks(
            status=None if status is None else TaskStatus(status), kind=kind, limit=limit
        )
        return {"tasks": [v.as_dict() for v in views]}

    @router.get("/tasks/{task_id}", response_model=TaskOut, responses=_errors(401, 403, 404))
    async def get_task(task_id: str) -> dict[str, Any]:
        """A task's status, outcome and progress (one GROUP BY over its items)."""
        return (await batches.get(task_id_of(task_id))).as_dict()

    @router.get(
        "/tasks/{task_id}/items", response_model=ItemPage, responses=_errors(401, 403, 404, 422)
    )
    async def list_items(
        task_id: str,
        status: ItemStatusName | None = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE_LIMIT)] = DEFAULT_PAGE_LIMIT,
        cursor: Annotated[int | None, Query(ge=0, le=MAX_CURSOR)] = None,
        ref: Annotated[
            str | None,
            Query(min_length=1, max_length=MAX_REF_LENGTH, description="Part of the refs sought."),
        ] = None,
    ) -> dict[str, Any]:
        """A page of a task's items in id order; pass ``next_cursor`` back for the next.
        With ``ref``, only items whose ref contains it (case-sensitive)."""
        page = await batches.items(
            task_id_of(task_id), status=status, cursor=cursor, limit=limit, ref=ref
        )
        return {"items": [item_dict(r) for r in page.items], "next_cursor": page.next_cursor}

    @router.post(
        "/tasks/{task_id}/cancel", response_model=TaskOut, responses=_errors(401, 403, 404, 409)
    )
    async def cancel_task(task_id: str) -> dict[str, Any]:
        """Stop a task: pending items never start, running ones finish, then it closes."""
        return (await batches.cancel(task_id_of(task_id))).as_dict()

    @router.post(
        "/tasks/{task_id}/retry-failed",
        response_model=Retried,
        responses=_errors(401, 403, 404, 409),
    )
    async def retry_failed(task_id: str) -> dict[str, Any]:
        """Put the task's error and cancelled items back to pending with fresh attempts;
        reopens the task (a cancelled one too: the undo of a cancel). 409 if it timed out."""
        canonical = task_id_of(task_id)
        retried = await batches.retry_failed(canonical)
        view = await batches.get(canonical)
        return {"task_id": canonical, "retried": retried, "task": view.as_dict()}

    @router.get(
        "/tasks/{task_id}/export",
        response_class=StreamingResponse,
        responses={
            200: {
                "description": "Every item, one per line (JSON Lines) or one per row (CSV).",
                "content": {"application/x-ndjson": {}, "text/csv": {}},
            },
            **_errors(401, 403, 404, 422),
        },
    )
    async def export_task(
        task_id: str,
        export_format: Annotated[Literal["jsonl", "csv"], Query(alias="format")] = "jsonl",
    ) -> StreamingResponse:
        """Stream every item of the task, page by page, as JSON Lines or CSV."""
        canonical = task_id_of(task_id)
        await batches.get(canonical)  # a missing task is a 404, not an empty stream

        async def lines() -> AsyncIterator[str]:
            if export_format == "csv":
                out = io.StringIO()
                csv.writer(out).writerow(CSV_COLUMNS)
                yield out.getvalue()
            cursor: int | None = None
            while True:
                page = await batches.items(canonical, cursor=cursor, limit=EXPORT_PAGE)
                if export_format == "csv":
                    yield "".join(_csv_line(r) for r in page.items)
                else:
                    yield "".join(
                        json.dumps(item_dict(r), ensure_ascii=False) + "\n" for r in page.items
                    )
                if page.next_cursor is None:
                    return
                cursor = page.next_cursor

        media = "text/csv; charset=utf-8" if export_format == "csv" else "application/x-ndjson"
        return StreamingResponse(
            lines(),
            media_type=media,
            headers={
                "Content-Disposition": f'attachment; filename="task-{canonical}.{export_format}"'
            },
        )

    return router


__all__ = ["item_dict", "task_id_of", "tasks_router"]
