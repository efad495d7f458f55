"""Request limits as pure ASGI middleware: a body size cap and a whole-body deadline.

Two ways a client can hold a server's memory or a worker slot hostage:

- **A huge body.** A declared ``Content-Length`` over the cap is answered 413
  before the body reaches the app; a body without one (chunked) is counted as
  it streams in and refused with 413 the moment it passes the cap, so a lying
  or absent header buys nothing. Nothing past the cap is ever kept in memory.
- **A slow body.** A per-read timeout does not stop a client that trickles one
  byte every few seconds. The deadline here covers the whole body: from the
  moment the request reaches the app until its last byte, however the bytes
  arrive. Past it the request is answered 408 and the connection closed.

Slow *headers* are bounded before the app is called, by the protocol
``shoal api`` runs (:mod:`shoal.api.server`); once the body
is in, later ``receive`` calls (a streaming response listening for the client
to go away) pass through untouched, so a long export is never cut by this.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.exceptions import HTTPException

from shoal.api.defaults import DEFAULT_MAX_BODY_BYTES, DEFAULT_REQUEST_DEADLINE_S
from shoal.api.errors import error_body
from shoal.errors import InvalidInput

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# How much of a refused body is read and discarded so the client sees the 413
# (see _drain). Past it, or past the deadline, the connection is just closed.
DRAIN_MAX_BYTES = 64 * 1024 * 1024


class LimitExceeded(HTTPException):
    """Raised from ``receive`` when the body passes a limit; FastAPI answers it as is."""

    def __init__(self, status: int, message: str) -> None:
        # The body was not read to its end: the connection cannot carry another request.
        super().__init__(status, message, headers={"Connection": "close"})
        self.field = "body"
        self.message = message


def _content_length(scope: Scope) -> int | str | None:
    """The declared length, None when absent, the raw text when it is not a length."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            text = value.decode("latin-1").strip()
            # isdigit alone also accepts '²' (a latin-1 byte) that int() refuses.
            return int(text) if text.isascii() and text.isdigit() and len(text) < 20 else text
    return None


async def _answer(send: Send, status: int, message: str) -> None:
    body = json.dumps(error_body(_code(status), message, "body")).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _expects_continue(scope: Scope) -> bool:
    return any(
        name.lower() == b"expect" and value.lower().strip() == b"100-continue"
        for name, value in scope.get("headers", ())
    )


async def _drain(receive: Receive, deadline: float, budget: int) -> None:
    """Read and discard the rest of the body, within ``deadline`` and ``budget`` bytes.

    Closing a socket that still has unread request bytes makes the kernel send
    a reset, and most clients then lose the answer already sent to them: they
    report "connection reset" instead of the 413. Reading the rest first (as
    nginx's lingering close does) lets them see it. Nothing read is kept.
    """
    drained = 0
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout_at(deadline):
            while drained <= budget:
                message = await receive()
                if message["type"] != "http.request":
                    return
                drained += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return


def _code(status: int) -> str:
    return {400: "bad_request", 408: "request_timeout", 413: "payload_too_large"}[status]


class RequestLimits:
    """Cap the request body at ``max_body_bytes`` and its arrival at ``request_deadline_s``.

    >>> app = RequestLimits(inner, max_body_bytes=1 << 20, request_deadline_s=10)  # doctest: +SKIP
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        request_deadline_s: float = DEFAULT_REQUEST_DEADLINE_S,
    ) -> None:
        if max_body_bytes < 1:
            raise InvalidInput("max_body_bytes", f"must be >= 1, got {max_body_bytes!r}")
        if not request_deadline_s > 0:
            raise InvalidInput("request_deadline_s", f"must be > 0, got {request_deadline_s!r}")
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.request_deadline_s = request_deadline_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if isinstance(declared, str):
            await _answer(send, 400, f"body: Content-Length {declared!r:.40} is not a length")
            return
        loop = asyncio.get_running_loop()
        # Real time, not shoal's injectable clock: this bounds a socket wait.
        deadline = loop.time() + self.request_deadline_s
        if declared is not None and declared > self.max_body_bytes:
            # A client waiting for "100 Continue" has sent nothing yet: answer
            # at once and it never sends the body. Any other is already sending.
            if not _expects_continue(scope) and declared <= DRAIN_MAX_BYTES:
                await _drain(receive, deadline, DRAIN_MAX_BYTES)
            await _answer(send, 413, self._too_large(f"{declared} bytes are declared"))
            return

        received = 0
        body_done = False
        response_started = False

        async def limited_receive() -> Message:
            nonlocal received, body_done
            if body_done:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise LimitExceeded(
                    408,
                    f"body: not received within {self.request_deadline_s:g} s "
                    f"({received} bytes arrived); send it faster or in smaller requests",
                ) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    if message.get("more_body", False):
                        await _drain(receive, deadline, DRAIN_MAX_BYTES)
                    body_done = True
                    raise LimitExceeded(413, self._too_large(f"over {received} bytes arrived"))
                body_done = not message.get("more_body", False)
            else:
                body_done = True  # disconnected: nothing more will come
            return message

        async def watched_send(message: Message) -> None:
            nonlocal response_started
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, watched_send)
        except LimitExceeded as exc:
            # The app let it through (a route that reads the body by hand, say).
            if response_started:
                raise
            await _answer(send, exc.status_code, exc.message)

    def _too_large(self, what: str) -> str:
        return (
            f"body: {what}, over the cap of {self.max_body_bytes} bytes; "
            "split the items over several tasks"
        )


__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_REQUEST_DEADLINE_S",
    "LimitExceeded",
    "RequestLimits",
]
