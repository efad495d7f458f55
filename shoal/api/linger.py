"""Closing a connection so the client sees the answer: uvicorn's h11 with a lingering close.

A server that answers before reading the whole request (a 408 for a body that
arrives too slowly, a 413 for one too large) and then closes its socket while
request bytes are still arriving makes the kernel send a reset instead of an
orderly end. The reset can overtake the answer: most clients then report
"connection reset" and never show the 408 or 413 that was already sent. How
often depends on timing (a byte landing between the server's last read and
its close), so it shows on a busy machine.

:class:`LingeringH11Protocol` closes as nginx's lingering close does: it sends
the answer and an end-of-stream (a half close, ``shutdown(SHUT_WR)``), then
reads and discards whatever the client still sends until the client closes
its side or :data:`LINGER_S` passes, and only then closes the socket. The
client reads the whole answer and a clean end of stream either way.

``shoal.api.server`` builds the protocol ``shoal api`` serves with on this one.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

# How long a closed connection keeps draining the client's bytes: nginx's
# lingering_timeout. A client still sending after this has had the answer and
# its end of stream for that long; a reset then loses it nothing it would read.
LINGER_S = 5.0


class _Discard(asyncio.Protocol):
    """Reads and drops what the client still sends; hands the final loss to ``owner``."""

    def __init__(self, owner: asyncio.BaseProtocol, timer: asyncio.TimerHandle) -> None:
        self.owner = owner
        self.timer = timer

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool | None:
        return None  # the client closed its side: the transport closes ours

    def connection_lost(self, exc: Exception | None) -> None:
        self.timer.cancel()
        self.owner.connection_lost(exc)


class _LingeringTransport(asyncio.Transport):
    """The connection's transport as uvicorn's protocol sees it; ``close`` lingers.

    Written by uvicorn's protocol (writes, flow control, close); everything but
    ``close`` and ``is_closing`` goes straight to the real transport.
    """

    def __init__(self, transport: asyncio.Transport) -> None:
        super().__init__()
        self._transport = transport
        self._lingering = False
        # Cleared by LingeringH11Protocol.shutdown for an idle connection: no
        # request of the client's is unread, so nothing can make a reset.
        self.linger = True

    def close(self) -> None:
        t = self._transport
        if self._lingering or t.is_closing():
            return
        if not self.linger or not t.can_write_eof():
            t.close()
            return
        try:
            t.write_eof()  # after the buffered answer: the client sees it, then the end
        except OSError:  # the client is already gone: nothing to linger for
            t.close()
            return
        self._lingering = True
        timer = asyncio.get_running_loop().call_later(LINGER_S, t.close)
        t.set_protocol(_Discard(t.get_protocol(), timer))
        if not t.is_reading():
            t.resume_reading()  # uvicorn pauses reading while a body waits

    def is_closing(self) -> bool:
        return self._lingering or self._transport.is_closing()

    def abort(self) -> None:
        self._transport.abort()

    def write(self, data: bytes | bytearray | memoryview[Any]) -> None:
        self._transport.write(data)

    def writelines(self, list_of_data: Any) -> None:
        self._transport.writelines(list_of_data)

    def write_eof(self) -> None:
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()


class LingeringH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a lingering close (see the module's docstring)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override] # uvicorn's own signature narrows BaseTransport the same way
        self._lingering_transport = _LingeringTransport(transport)
        super().connection_made(self._lingering_transport)

    def shutdown(self) -> None:
        # The server is stopping: an idle keep-alive connection closes at once
        # (lingering would only hold the shutdown up); one mid-request still
        # lingers after its answer.
        if self.cycle is None or self.cycle.response_complete:
            self._lingering_transport.linger = False
        super().shutdown()


__all__ = ["LINGER_S", "LingeringH11Protocol"]
