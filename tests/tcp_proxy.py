"""A TCP proxy for tests that can stop forwarding bytes while keeping connections open.

A stalled proxy is what a frozen peer or a broken network path looks like from
the client: the connection stays up (no RST, no FIN; the proxy's kernel still
acknowledges keepalives) but nothing comes back. ``stall()`` stops forwarding in
both directions, for connections already open and for ones opened while
stalled; ``resume()`` forwards again whatever was held back.

``hold_reply_after(marker)`` stalls at one precise moment instead: once a
client has sent ``marker``, the server's reply that ends the transaction
(PostgreSQL's ReadyForQuery, status idle) is held. The server has committed;
the client has not heard. That is the window in which a lost connection makes
an outcome ambiguous, held open for as long as a test needs.

>>> proxy = await TcpProxy.start("127.0.0.1", 5432)   # doctest: +SKIP
>>> url = make_conninfo(db_url, host="127.0.0.1", port=proxy.port)  # doctest: +SKIP
>>> proxy.stall(); ...; proxy.resume()               # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

CHUNK = 64 * 1024
# PostgreSQL's ReadyForQuery message with transaction status 'I' (idle): the
# server sends it once a transaction is over, committed or rolled back.
READY_FOR_QUERY_IDLE = b"Z\x00\x00\x00\x05I"


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to ``target_host``:``target_port``, one task per direction."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.port = 0
        # Set while bytes may flow. Cleared by stall() and by a held reply;
        # set by resume(). Every pipe waits on its event before each read and
        # again before each write, so a chunk read as a stall began is held too.
        self._to_server = asyncio.Event()
        self._to_client = asyncio.Event()
        self._to_server.set()
        self._to_client.set()
        # hold_reply_after's state. Written by the test and the pipes, read by the pipes.
        self._hold_marker: bytes | None = None
        self._hold_armed = False
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.connections = 0  # accepted so far

    @classmethod
    async def start(cls, target_host: str, target_port: int) -> TcpProxy:
        proxy = cls(target_host, target_port)
        proxy._server = await asyncio.start_server(proxy._accept, "127.0.0.1", 0)
        proxy.port = proxy._server.sockets[0].getsockname()[1]
        return proxy

    def stall(self) -> None:
        """Stop forwarding both ways; connections stay open."""
        self._to_server.clear()
        self._to_client.clear()

    def hold_reply_after(self, marker: bytes) -> None:
        """Once a client sends ``marker``, hold the server's reply that ends its transaction.

        Everything the client sends still reaches the server, so the server
        finishes (and commits) the transaction; its reply, and all later
        server-to-client bytes, wait for :meth:`resume`.
        """
        self._hold_marker = marker
        self._hold_armed = False

    def resume(self) -> None:
        self._hold_marker = None
        self._hold_armed = False
        self._to_server.set()
        self._to_client.set()

    @property
    def holding_reply(self) -> bool:
        """True once ``hold_reply_after`` has caught its reply."""
        return self._hold_marker is not None and not self._to_client.is_set()

    async def close(self) -> None:
        """Close every connection and stop listening."""
        if self._server is not None:
            self._server.close()
        # Closed transports end their pipes' reads; held pipes must be let go
        # first. Cancelling the connection tasks instead makes asyncio log
        # each one as an error (3.11's start_server callback).
        self.resume()
        for writer in list(self._writers):
            writer.close()
        if self._tasks:
            _, stuck = await asyncio.wait(self._tasks, timeout=5)
            for task in stuck:
                task.cancel()
        if self._server is not None:
            await self._server.wait_closed()

    # -- internals -------------------------------------------------------

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(client_w)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            # A connection opened while stalled gets nowhere either: its
            # server side is not even opened until the proxy resumes.
            await self._to_server.wait()
            try:
                server_r, server_w = await asyncio.open_connection(
                    self.target_host, self.target_port
                )
            except OSError:
                return
            self._writers.add(server_w)
            try:
                await asyncio.gather(
                    self._pipe(client_r, server_w, self._to_server, self._watch_request),
                    self._pipe(server_r, client_w, self._to_client, self._watch_reply),
                )
            finally:
                self._writers.discard(server_w)
                server_w.close()
        finally:
            self._writers.discard(client_w)
            client_w.close()
            self._tasks.discard(task)

    def _watch_request(self, data: bytes) -> None:
        if self._hold_marker is not None and self._hold_marker in data:
            self._hold_armed = True

    def _watch_reply(self, data: bytes) -> None:
        if self._hold_armed and READY_FOR_QUERY_IDLE in data:
            self._hold_armed = False
            self._to_client.clear()

    async def _pipe(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        flowing: asyncio.Event,
        watch: Callable[[bytes], None],
    ) -> None:
        try:
            while True:
                await flowing.wait()
                data = await src.read(CHUNK)
                if data:
                    watch(data)
                await flowing.wait()
                if not data:
                    # Pass the half-close on; the other direction ends on its own.
                    if dst.can_write_eof():
                        dst.write_eof()
                    else:
                        dst.close()
                    return
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            # One side went away: end both directions, as a real hop would.
            dst.close()
