"""Every error the API answers, as one JSON shape naming the field at fault.

::

    {"error": "invalid_input",
     "message": "items[2].ref: duplicate ref 'a'",
     "field": "items[2].ref"}

``error`` is a stable machine code, ``message`` is for people and starts with
the field it blames when there is one, ``field`` is that field's path in the
request (``null`` when the fault is not one field's). How shoal's errors map:

=========================  ======  =====================
raised                     status  ``error``
=========================  ======  =====================
request validation         422     ``invalid_input``
``InvalidInput``           422     ``invalid_input``
``IdempotencyMismatch``    422     ``idempotency_mismatch``
``NotFound``               404     ``not_found``
``StillCreating``          409     ``still_creating``
``Conflict``               409     ``conflict``
``TransientError``         503     ``unavailable``
anything else (a bug)      500     ``internal_error``
=========================  ======  =====================
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from shoal.errors import (
    Conflict,
    IdempotencyMismatch,
    InvalidInput,
    NotFound,
    StillCreating,
    TransientError,
)

log = logging.getLogger("shoal.api")

# How long a client should wait before repeating a request answered 409
# "still creating" or 503: about one idempotency wait, the time a concurrent
# create may hold its key.
RETRY_AFTER_S = 1

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    408: "request_timeout",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_input",
    503: "unavailable",
}


class ErrorBody(BaseModel):
    """The body of every 4xx and 5xx answer."""

    error: str
    message: str
    field: str | None = None


class ApiError(Exception):
    """Raised by a route to answer ``status`` with an :class:`ErrorBody`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        field: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.code = code or _HTTP_CODES.get(status, "error")
        self.headers = dict(headers or {})


def _printable(text: str) -> str:
    # A message may quote the client's input; a lone surrogate in it would make
    # the answer itself unencodable (a 500 in place of the 4xx).
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_body(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    return {
        "error": code,
        "message": _printable(message),
        "field": None if field is None else _printable(field),
    }


def error_response(
    status: int,
    message: str,
    *,
    field: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(
        error_body(code or _HTTP_CODES.get(status, "error"), message, field),
        status_code=status,
        headers=dict(headers or {}),
    )


def field_path(loc: Sequence[str | int]) -> str:
    """``("body", "items", 3, "ref")`` -> ``items[3].ref``; ``("query", "limit")`` -> ``limit``."""
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):
        parts = parts[1:]
    path = ""
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or "body"


# Keeps a message readable when a client sends a long value: the field names it.
MAX_QUOTED_INPUT = 80


def _describe(error: Mapping[str, Any]) -> str:
    msg = str(error.get("msg", "is invalid"))
    if error.get("type") in ("missing", "extra_forbidden", "json_invalid"):
        return msg
    given = error.get("input")
    if isinstance(given, str | int | float | bool) or given is None:
        return f"{msg}, got {given!r:.{MAX_QUOTED_INPUT}}"
    return f"{msg}, got {type(given).__name__}"


def _task_field(request: Request) -> str | None:
    return "task_id" if "task_id" in request.path_params else None


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error with an :class:`ErrorBody`; shoal's families by status."""

    async def api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(
            exc.status, exc.message, field=exc.field, code=exc.code, headers=exc.headers
        )

    async def validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = list(exc.errors())
        if not errors:  # pragma: no cover - FastAPI always says what failed
            return error_response(422, "body: the request is invalid", field="body")
        first = errors[0]
        field = field_path(first.get("loc", ()))
        if first.get("type") == "json_invalid":
            field = "body"
            position = first.get("loc", ("body", "?"))[-1]
            reason = first.get("ctx", {}).get("error", "JSON decode error")
            message = f"body: not valid JSON ({reason} at character {position})"
        elif field == "body" and isinstance(first.get("input"), bytes):
            # The body arrived, but not as JSON: FastAPI parses only JSON content types.
            message = "body: send a JSON object with 'Content-Type: application/json'"
        else:
            message = f"{field}: {_describe(first)}"
        if len(errors) > 1:
            message += f" (and {len(errors) - 1} more problem(s))"
        return error_response(422, message, field=field)

    async def invalid_input(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, InvalidInput)
        return error_response(422, str(exc), field=exc.field)

    async def mismatch(request: Request, exc: Exception) -> JSONResponse:
        return error_response(422, str(exc), field="idempotency_key", code="idempotency_mismatch")

    async def still_creating(request: Request, exc: Exception) -> JSONResponse:
        return error_response(
            409,
            str(exc),
            field="idempotency_key",
            code="still_creating",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

    async def not_found(request: Request, exc: Exception) -> JSONResponse:
        field = getattr(exc, "field", None) or _task_field(request)
        message = str(exc) if field is None else f"{field}: {exc}"
        return error_response(404, message, field=field)

    async def conflict(request: Request, exc: Exception) -> JSONResponse:
        field = getattr(exc, "field", None) or _task_field(request)
        message = str(exc) if field is None else f"{field}: {exc}"
        return error_response(409, message, field=field)

    async def transient(request: Request, exc: Exception) -> JSONResponse:
        # Not the client's fault, and not a bug: the database is busy or away.
        log.warning("%s %s: %s", request.method, request.url.path, exc)
        return error_response(
            503,
            # The cause stays in the log: it names hosts and users of the database.
            "the database did not answer in time; retry shortly",
            code="unavailable",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        detail = exc.detail if isinstance(exc.detail, str) else "the request was refused"
        if exc.status_code == 404:
            message = f"path: no route {request.url.path!r:.200}"
            field: str | None = "path"
        elif exc.status_code == 405:
            message = f"method: {request.method} is not allowed on {request.url.path!r:.200}"
            field = "method"
        elif exc.status_code == 400:
            # FastAPI's answer to a body it could not parse at all.
            message, field = f"body: {detail}", "body"
        else:
            # LimitExceeded (408, 413) names the body; other refusals name nothing.
            message, field = detail, getattr(exc, "field", None)
        return error_response(exc.status_code, message, field=field, headers=exc.headers)

    async def internal(request: Request, exc: Exception) -> JSONResponse:
        # A bug, not the client's fault. Starlette still re-raises it after this
        # answer, so the server logs the traceback.
        return error_response(
            500, "internal error: the server log has the details", code="internal_error"
        )

    app.add_exception_handler(Exception, internal)
    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(InvalidInput, invalid_input)
    # Starlette picks the handler of the nearest class in the exception's MRO,
    # so these two win over the Conflict handler below.
    app.add_exception_handler(IdempotencyMismatch, mismatch)
    app.add_exception_handler(StillCreating, still_creating)
    app.add_exception_handler(NotFound, not_found)
    app.add_exception_handler(Conflict, conflict)
    app.add_exception_handler(TransientError, transient)
    app.add_exception_handler(HTTPException, http_error)


__all__ = [
    "ApiError",
    "ErrorBody",
    "error_body",
    "error_response",
    "field_path",
    "install_error_handlers",
]
