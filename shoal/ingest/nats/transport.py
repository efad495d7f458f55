"""``NatsTransport``: the connection, the durability check, streams, publish and groups together."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import timedelta

from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext

from shoal.clock import Clock, SystemClock
from shoal.db.pool import AsyncConn
from shoal.errors import InvalidInput, TransientError
from shoal.ingest.message import Envelope, check_topic_name
from shoal.ingest.nats.connection import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_RECONNECT_WAIT,
    DEFAULT_REQUEST_TIMEOUT,
    connect,
)
from shoal.ingest.nats.durability import check_durability
from shoal.ingest.nats.publish import DEFAULT_MAX_ACK_PENDING, DEFAULT_MAX_BATCH, Publisher
from shoal.ingest.nats.streams import (
    DEFAULT_MAX_AGE,
    DEFAULT_STREAM_PREFIX,
    STREAM_NAME_CHARS,
    Streams,
)
from shoal.ingest.nats.subscribe import NatsSubscription, consumer_name_for, group_depth, join
from shoal.ingest.transport import (
    DEFAULT_ACK_WAIT,
    DEFAULT_PUBLISH_TIMEOUT,
    Depth,
    PublishError,
)

log = logging.getLogger("shoal.ingest.nats")


class NatsTransport:
    """Ingest topics on NATS JetStream: at-least-once, file storage, durable pull consumers.

    Guarantees: :meth:`publish` returns only when every envelope is stored
    (its PubAck arrived), else raises :class:`PublishError`. Deliveries of one
    group are redelivered until acked or termed, with no attempt limit.

    :meth:`publish` sends atomic batches of up to ``max_batch`` messages
    (the server's limit, 1,000 by default); ``max_ack_pending`` bounds the
    PubAcks one call waits for at once on the one-message-at-a-time path
    that remains for streams without atomic publish. A consumer's in-flight
    limit is ``max_in_flight`` of :meth:`subscribe`. ``topics`` are created
    at :meth:`start`; any other topic on first use. See
    :mod:`shoal.ingest.nats.durability` for the server setting shoal
    requires and how it is checked.

    For a JetStream cluster, pass every server's URL in ``servers`` (the
    client moves to another when its server goes), every monitoring URL in
    ``monitor_url`` (each server's fsync setting is checked) and
    ``replicas=3``: each topic's stream is then kept on three servers, and
    :meth:`start` refuses more replicas than the cluster has servers.
    """

    name = "nats"
    in_database = False

    def __init__(
        self,
        servers: str | Sequence[str],
        *,
        stream_prefix: str = DEFAULT_STREAM_PREFIX,
        monitor_url: str | Sequence[str] | None = None,
        allow_unsafe_sync: bool = False,
        replicas: int = 1,
        max_ack_pending: int = DEFAULT_MAX_ACK_PENDING,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_age: timedelta | None = DEFAULT_MAX_AGE,
        connect_timeout: timedelta = DEFAULT_CONNECT_TIMEOUT,
        request_timeout: timedelta = DEFAULT_REQUEST_TIMEOUT,
        reconnect_wait: timedelta = DEFAULT_RECONNECT_WAIT,
        topics: Sequence[str] = (),
        clock: Clock | None = None,
    ) -> None:
        if not stream_prefix or not set(stream_prefix) <= STREAM_NAME_CHARS:
            raise InvalidInput("stream_prefix", f"{stream_prefix!r}: use A-Z a-z 0-9 _ -")
        if replicas < 1:
            raise InvalidInput("replicas", f"{replicas}: at least 1")
        if max_ack_pending < 1:
            raise InvalidInput("max_ack_pending", f"{max_ack_pending}: at least 1")
        if max_batch < 1:
            raise InvalidInput("max_batch", f"{max_batch}: at least 1")
        self._servers = [servers] if isinstance(servers, str) else list(servers)
        if not self._servers:
            raise InvalidInput("servers", "at least one nats:// URL")
        monitor_urls = [monitor_url] if isinstance(monitor_url, str) else list(monitor_url or ())
        self._monitor_urls = [url.rstrip("/") for url in monitor_urls if url]
        self._replicas = replicas
        self._allow_unsafe_sync = allow_unsafe_sync
        self._connect_timeout = connect_timeout
        self._request_timeout_s = request_timeout.total_seconds()
        self._reconnect_wait = reconnect_wait
        self._topics = [check_topic_name(topic) for topic in topics]
        self._clock: Clock = clock or SystemClock()
        self._nc: NatsClient | None = None
        self._js: JetStreamContext | None = None
        self._streams = Streams(
            lambda: self._connected()[1],
            prefix=stream_prefix,
            replicas=replicas,
            max_age=max_age,
            allow_unsafe_sync=allow_unsafe_sync,
        )
        self._publisher = Publisher(
            self._connected,
            self._streams,
            max_batch=max_batch,
            max_ack_pending=max_ack_pending,
        )

    # -- life cycle -----------------------------------------------------------

    async def start(self) -> None:
        """Check the server's fsync setting, connect, and create the configured topics' streams.

        Idempotent. Raises :class:`UnsafeDurability` when the server may lose
        acknowledged messages, :class:`~shoal.errors.Conflict` when a stream
        exists with other storage, :class:`~shoal.errors.TransientError` when
        the server cannot be reached.
        """
        if self._nc is None:
            await check_durability(
                self._monitor_urls,
                allow_unsafe_sync=self._allow_unsafe_sync,
                timeout_s=self._request_timeout_s,
                replicas=self._replicas,
            )
            self._nc = await connect(
                self._servers, within=self._connect_timeout, reconnect_wait=self._reconnect_wait
            )
            self._js = self._nc.jetstream(timeout=self._request_timeout_s)
        for topic in self._topics:
            await self._streams.ensure(topic)

    async def close(self) -> None:
        nc, self._nc, self._js = self._nc, None, None
        self._streams.clear()
        if nc is not None and not nc.is_closed:
            try:
                await nc.close()
            except asyncio.CancelledError:
                # nats-py's close waits on the socket's close waiter, which
                # asyncio cancels when the server is already gone (seen after a
                # SIGKILLed nats-server). Swallowed only when this task was not
                # itself asked to stop: a real cancellation goes on up.
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                log.warning("nats connection closed after the server was gone")

    def _connected(self) -> tuple[NatsClient, JetStreamContext]:
        if self._nc is None or self._js is None:
            raise TransientError("nats transport not started (call start() first)")
        return self._nc, self._js

    # -- publish --------------------------------------------------------------

    async def publish(
        self,
        topic: str,
        envelopes: Sequence[Envelope],
        *,
        timeout: timedelta = DEFAULT_PUBLISH_TIMEOUT,  # noqa: ASYNC109 - a deadline the transport owns
        conn: AsyncConn | None = None,
    ) -> None:
        """Store every envelope, or raise :class:`PublishError` within ``timeout``.

        ``conn`` is refused: a stream cannot join a database transaction. See
        :meth:`Publisher.publish <shoal.ingest.nats.publish.Publisher.publish>`
        for what a failed call may have stored.
        """
        if conn is not None:
            raise InvalidInput("conn", "the nats transport cannot publish in a transaction")
        if not envelopes:
            return
        if self._nc is None:
            raise PublishError(f"nats: transport not started (publishing to {topic!r})")
        await self._publisher.publish(topic, envelopes, timeout)

    # -- consume --------------------------------------------------------------

    async def subscribe(
        self, topic: str, group: str, *, max_in_flight: int, ack_wait: timedelta = DEFAULT_ACK_WAIT
    ) -> NatsSubscription:
        """Join ``group`` on ``topic``: a durable pull consumer, created or updated.

        Every group sees every message of the topic retained on the server,
        including those published before the group first subscribed.

        ``ack_wait`` is the lease of each delivery: one neither acked nor
        nakked within it is delivered again. JetStream keeps one ack wait per
        durable consumer, so the whole group shares it: a durable that exists
        with another ack wait (an earlier deployment's, another member's) is
        updated to this one, with a WARNING naming both, and the server then
        applies it to deliveries already in flight too.
        """
        if max_in_flight < 1:
            raise InvalidInput("max_in_flight", f"{max_in_flight}: at least 1")
        if ack_wait <= timedelta(0):
            raise InvalidInput("ack_wait", f"{ack_wait}: must be positive")
        durable = consumer_name_for(group)
        nc, js = self._connected()
        stream = (await self._streams.ensure(topic)).name
        return await join(
            nc,
            js,
            stream=stream,
            durable=durable,
            topic=topic,
            max_in_flight=max_in_flight,
            ack_wait=ack_wait,
        )

    async def depth(self, topic: str, group: str) -> Depth:
        """The group's backlog (see :func:`~shoal.ingest.nats.subscribe.group_depth`)."""
        durable = consumer_name_for(group)
        _, js = self._connected()
        stream = (await self._streams.ensure(topic)).name
        return await group_depth(js, stream=stream, durable=durable, topic=topic, clock=self._clock)
