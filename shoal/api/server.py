"""The HTTP protocol under ``shoal api``: uvicorn's h11 with a deadline on each
request head, and a lingering close (:mod:`shoal.api.linger`).

uvicorn's h11 protocol bounds a request head's *size* but not its *time*: its
keep-alive timer starts only after a response, and the first byte of the next
request stops it. A client trickling header bytes could hold a connection (a
file descriptor, a slot under any connection limit) for as long as it liked.

Here each request head must be complete within ``header_timeout_s`` of the
connection opening, or of the previous request's end on a kept-alive
connection, however its bytes arrive. Past that a connection holding part of a
head is answered 408 (shoal's JSON error body, ``field`` ``headers``) and
closed; one holding nothing of a new request is just closed, as an idle
keep-alive connection would be. Once the head is in, the body is
:class:`~shoal.api.limits.RequestLimits`' to bound.

A head h11 refuses (a ``Content-Length`` that is not a number, conflicting
lengths, an illegal header) never reaches the app; it is answered 400 here
with the same JSON error body, ``field`` naming the header at fault, instead
of uvicorn's plain text.

>>> uvicorn.Server(api_config(create_api(boss, batches), port=8000))  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from typing import Any, ClassVar

import h11
import uvicorn

from shoal.api.defaults import DEFAULT_HEADER_TIMEOUT_S
from shoal.api.errors import error_body
from shoal.api.linger import LingeringH11Protocol
from shoal.errors import InvalidInput

log = logging.getLogger("shoal.api")


def _answer(status: int, code: str, message: str, field: str) -> bytes:
    """A complete HTTP/1.1 response with shoal's error body that closes the connection."""
    body = json.dumps(error_body(code, message, field)).encode()
    reason = {400: "Bad Request", 408: "Request Timeout"}[status]
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def _blamed_header(reason: str) -> str:
    """The ``field`` of a head h11 refused: the header its message names, else ``headers``."""
    lowered = reason.lower()
    for header in ("content-length", "transfer-encoding", "host"):
        if header in lowered:
            return header
    if "request line" in lowered or "method" in lowered or "target" in lowered:
        return "request_line"
    return "headers"


class BoundedHeadProtocol(LingeringH11Protocol):
    """uvicorn's h11 protocol with a deadline on each request head and a lingering
    close; see the module docstring.

    Use :func:`bounded_head_protocol` to get one with a given deadline.
    """

    header_timeout_s: ClassVar[float] = DEFAULT_HEADER_TIMEOUT_S
    # Set by the head timer, cleared when the head is in or the connection goes.
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(  # type: ignore[override]  # uvicorn's own signature (a Transport)
        self, transport: asyncio.Transport
    ) -> None:
        super().connection_made(transport)
        self._watch_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_head()

    def _watch_head(self) -> None:
        """Run the head timer exactly while h11 waits for a request head.

        h11's peer state is IDLE from the connection's start, and again from
        the moment both sides finished the previous request (which may be in
        ``data_received``, when a body ends after its early answer, or in
        ``on_response_complete``), until a whole head has been parsed. The
        timer is armed once per head: bytes arriving do not restart it.
        """
        waiting = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
        if waiting and self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)
        elif not waiting:
            self._stop_head_timer()

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        partial, _ = self.conn.trailing_data
        if partial:
            log.debug(
                "closing a connection from %s: its request head did not arrive within %g s",
                self.client,
                self.header_timeout_s,
            )
            message = (
                f"headers: the request head did not arrive within {self.header_timeout_s:g} s "
                f"({len(partial)} bytes came)"
            )
            self.transport.write(_answer(408, "request_timeout", message, "headers"))
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """Answer a head h11 refused with shoal's JSON error body, naming the header."""
        # uvicorn calls this from inside its `except h11.RemoteProtocolError`,
        # so the error being handled is h11's, with its reason.
        exc = sys.exception()
        reason = str(exc) if isinstance(exc, h11.RemoteProtocolError) else msg
        field = _blamed_header(reason)
        self.transport.write(_answer(400, "bad_request", f"{field}: {reason}", field))
        self.transport.close()


def bounded_head_protocol(header_timeout_s: float) -> type[BoundedHeadProtocol]:
    """A :class:`BoundedHeadProtocol` class whose request heads must arrive within
    ``header_timeout_s``; pass it as ``uvicorn.Config(http=...)``."""
    if not header_timeout_s > 0:
        raise InvalidInput("header_timeout_s", f"must be > 0, got {header_timeout_s!r}")
    timeout_s = header_timeout_s

    class Protocol(BoundedHeadProtocol):
        header_timeout_s = timeout_s

    return Protocol


def api_config(
    app: Any, *, header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S, **options: Any
) -> uvicorn.Config:
    """A uvicorn config that serves ``app`` the way ``shoal api`` does: h11 (never
    httptools), each request head bounded by ``header_timeout_s``, lingering close."""
    return uvicorn.Config(app, http=bounded_head_protocol(header_timeout_s), **options)


__all__ = ["DEFAULT_HEADER_TIMEOUT_S", "BoundedHeadProtocol", "api_config", "bounded_head_protocol"]
