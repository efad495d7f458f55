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

A head longer than :data:`~shoal.api.defaults.MAX_HEAD_BYTES` is answered 431
(``field`` ``headers``) and closed, whether it arrives whole or in pieces.
h11's own bound applies only to a head still incomplete after a read: one that
arrived whole in a single read (up to the 256 KiB asyncio reads at once)
went through at any size.

``shoal api`` binds its port itself (:func:`listen_socket`) before it says
it serves, so a port that is taken is one error line and no announcement;
and it logs the console's polls at DEBUG (:class:`ConsoleReadsAtDebug`).

>>> uvicorn.Server(api_config(create_api(boss, batches), port=8000))  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import sys
from typing import Any, ClassVar

import h11
import uvicorn

from shoal.api.defaults import DEFAULT_HEADER_TIMEOUT_S, MAX_HEAD_BYTES
from shoal.api.errors import error_body
from shoal.api.linger import LingeringH11Protocol
from shoal.errors import InvalidInput

log = logging.getLogger("shoal.api")


def _answer(status: int, code: str, message: str, field: str) -> bytes:
    """A complete HTTP/1.1 response with shoal's error body that closes the connection."""
    body = json.dumps(error_body(code, message, field)).encode()
    reason = {
        400: "Bad Request",
        408: "Request Timeout",
        431: "Request Header Fields Too Large",
    }[status]
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


# Where h11 ends a head: the first blank line, with or without its CR
# (h11._receivebuffer's own rule, so both agree on where the head stops).
_END_OF_HEAD = re.compile(rb"\n\r?\n")


class HeadTooLarge(h11.RemoteProtocolError):
    """Raised in place of parsing a head longer than the cap; answered 431."""


class HeadCappedConnection(h11.Connection):
    """h11's server connection refusing any request head over ``max_head_bytes``.

    The check runs each time the protocol asks for the next event while a
    head is awaited, so it covers a head arriving whole, in pieces, or
    pipelined behind the previous request (parsed from the buffer with no new
    read).
    """

    def __init__(self, *, max_head_bytes: int, max_incomplete_event_size: int) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=max_incomplete_event_size)
        self.max_head_bytes = max_head_bytes

    def next_event(self) -> Any:
        if self.their_state is h11.IDLE:
            buffered, _ = self.trailing_data
            if len(buffered) > self.max_head_bytes and not _END_OF_HEAD.search(
                buffered, 0, self.max_head_bytes
            ):
                raise HeadTooLarge(
                    f"the request head is over {self.max_head_bytes} bytes "
                    "(request line and headers)",
                    error_status_hint=431,
                )
        return super().next_event()


class BoundedHeadProtocol(LingeringH11Protocol):
    """uvicorn's h11 protocol with a deadline on each request head and a lingering
    close; see the module docstring.

    Use :func:`bounded_head_protocol` to get one with a given deadline.
    """

    header_timeout_s: ClassVar[float] = DEFAULT_HEADER_TIMEOUT_S
    max_head_bytes: ClassVar[int] = MAX_HEAD_BYTES
    # Set by the head timer, cleared when the head is in or the connection goes.
    _head_timer: asyncio.TimerHandle | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # uvicorn made its own connection; nothing has been parsed yet.
        self.conn = HeadCappedConnection(
            max_head_bytes=self.max_head_bytes,
            # What else h11 bounds this way: a chunked body's size lines.
            max_incomplete_event_size=self.config.h11_max_incomplete_event_size
            or self.max_head_bytes,
        )

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
        """Answer a head h11 refused with shoal's JSON error body, naming the header;
        a head over the cap with 431."""
        # uvicorn calls this from inside its `except h11.RemoteProtocolError`,
        # so the error being handled is h11's, with its reason.
        exc = sys.exception()
        if isinstance(exc, HeadTooLarge):
            message = (
                f"headers: the request head is over {self.max_head_bytes} bytes "
                "(request line and headers); send fewer or shorter headers"
            )
            self.transport.write(_answer(431, "headers_too_large", message, "headers"))
            self.transport.close()
            return
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


# uvicorn's own default backlog.
LISTEN_BACKLOG = 2048


def listen_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` and listening, for ``uvicorn.Server.serve(sockets=...)``.

    A port another process holds (or an address this machine does not have)
    is InvalidInput naming ``--port`` and the address, before anything is
    announced or served.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # As uvicorn does: a restart need not wait out the old connections'
    # TIME_WAIT. It never lets two processes listen on one port.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise InvalidInput("--port", f"cannot listen on {where}: {exc.strerror or exc}") from None
    return sock


# The API's read routes that the console pages poll every 2 s (console.html,
# dashboard.html): GETs of them that succeed are logged at DEBUG, not INFO, so
# an open console does not fill the log. Anything else (a write, an error, a
# health probe) keeps uvicorn's INFO line.
CONSOLE_READ_ROUTES = re.compile(
    r"(/|/tasks|/v1/(overview|queues|jobs|schedules|topics|workers|history|tasks|limits|workflows)"
    r"(/[^?]*)?)(\?.*)?"
)


def is_console_read(method: str, path: str, status: int) -> bool:
    """Whether a request is one of the console's polls (see CONSOLE_READ_ROUTES).

    >>> is_console_read("GET", "/v1/queues?internal=true", 200)
    True
    >>> is_console_read("GET", "/v1/workflows/runs/onboard-7", 200)
    True
    >>> is_console_read("POST", "/v1/queues/email/pause", 200)
    False
    """
    return method == "GET" and status < 400 and CONSOLE_READ_ROUTES.fullmatch(path) is not None


class ConsoleReadsAtDebug(logging.Filter):
    """On uvicorn's access logger: the console's polls become DEBUG records.

    A logger's filter runs after its INFO check, so the record is kept only
    when the logger also takes DEBUG (``shoal api -v``).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        # uvicorn's access record: (client, method, path and query, HTTP version, status).
        args = record.args
        if not (isinstance(args, tuple) and len(args) == 5):
            return True
        _, method, path, _, status = args
        if not (isinstance(status, int) and is_console_read(str(method), str(path), status)):
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def quiet_console_reads(logger: str = "uvicorn.access") -> None:
    """Put :class:`ConsoleReadsAtDebug` on ``logger`` (once)."""
    target = logging.getLogger(logger)
    if not any(isinstance(f, ConsoleReadsAtDebug) for f in target.filters):
        target.addFilter(ConsoleReadsAtDebug())


def api_config(
    app: Any, *, header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S, **options: Any
) -> uvicorn.Config:
    """A uvicorn config that serves ``app`` the way ``shoal api`` does: h11 (never
    httptools), each request head bounded by ``header_timeout_s``, lingering close."""
    return uvicorn.Config(app, http=bounded_head_protocol(header_timeout_s), **options)


__all__ = [
    "CONSOLE_READ_ROUTES",
    "DEFAULT_HEADER_TIMEOUT_S",
    "MAX_HEAD_BYTES",
    "BoundedHeadProtocol",
    "ConsoleReadsAtDebug",
    "HeadCappedConnection",
    "HeadTooLarge",
    "api_config",
    "bounded_head_protocol",
    "is_console_read",
    "listen_socket",
    "quiet_console_reads",
]
