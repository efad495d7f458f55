"""The connection to nats-server: how it is opened, and which errors mean "no answer".

The client connects with ``pending_size=0``: nats-py then refuses to queue
anything while it is disconnected, so a publish during an outage fails at
once instead of reaching the stream later, after its caller was told it
failed (the package docstring says what remains of that window).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient

from shoal.errors import TransientError

log = logging.getLogger("shoal.ingest.nats")

DEFAULT_CONNECT_TIMEOUT = timedelta(seconds=5)
# JetStream API calls (stream and consumer info, create).
DEFAULT_REQUEST_TIMEOUT = timedelta(seconds=5)
# nats-py's default is 2 s between reconnect attempts to one server.
DEFAULT_RECONNECT_WAIT = timedelta(seconds=2)

# Errors that mean "the server did not answer": lost or closed connection,
# reconnecting, timeout. Everything else from nats-py is a bug or a refusal.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    TimeoutError,  # nats.errors.TimeoutError is one too
    OSError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionDrainingError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
    nats.errors.NoRespondersError,
    nats.errors.NoServersError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
)


async def connect(
    servers: list[str], *, within: timedelta, reconnect_wait: timedelta
) -> NatsClient:
    """A connected client that never gives up reconnecting and never queues while away.

    Raises :class:`~shoal.errors.TransientError` when no server answers
    ``within`` that long.
    """
    nc = NatsClient()
    # nats-py retries the first connect as long as it would retry a reconnect
    # (forever, below): the deadline is ours. The attempt is a task of its own,
    # cancelled until it ends: on Python 3.11 the asyncio.wait_for inside
    # nats-py's connect swallows a cancellation that lands as a connection
    # attempt fails, and its retry loop then went on past our deadline (seen
    # on a loaded machine: a 1 s deadline still connecting after 30 s).
    attempt = asyncio.ensure_future(
        nc.connect(
            servers,
            connect_timeout=max(1, round(within.total_seconds())),
            # Refuse to queue publishes while disconnected: a caller
            # must learn that its message was not stored.
            pending_size=0,
            # A worker outlives any outage; never give up reconnecting.
            max_reconnect_attempts=-1,
            reconnect_time_wait=reconnect_wait.total_seconds(),  # type: ignore[arg-type]
            error_cb=_log_error,
            disconnected_cb=_log_disconnected,
            reconnected_cb=_log_reconnected,
        )
    )
    try:
        done, _ = await asyncio.wait({attempt}, timeout=within.total_seconds())
    except BaseException:  # this task cancelled: the attempt goes with it
        await _stop(attempt)
        await nc.close()
        raise
    if not done:
        await _stop(attempt)
        await nc.close()
        raise TransientError(
            f"nats: cannot connect to {servers} within {within.total_seconds():g} s"
        )
    try:
        attempt.result()
    except CONNECTION_ERRORS as exc:
        await nc.close()
        raise TransientError(f"nats: cannot connect to {servers}: {exc}") from exc
    return nc


async def _stop(task: asyncio.Future[None]) -> None:
    """Cancel ``task`` until it has ended (one cancellation may be swallowed, above)."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.1)
    if not task.cancelled():
        task.exception()  # retrieved: an attempt's error is not worth a warning


async def _log_error(exc: Exception) -> None:
    log.warning("nats: %s: %s", type(exc).__name__, exc)


async def _log_disconnected() -> None:
    log.warning("nats: disconnected; publishes fail until the connection is back")


async def _log_reconnected() -> None:
    log.info("nats: reconnected")
