"""NATS JetStream as an ingest transport: one file-backed stream per topic.

A topic ``card.ingest`` is the subject ``shoal.card.ingest``, stored in the
stream ``SHOAL_card_ingest`` (the prefix is configurable; characters a stream
name may not hold, here ``.``, become ``_``). A consumer group is a durable
pull consumer of that stream, named for the group. Each message carries
:meth:`Envelope.encode` as its payload and the envelope id in the
``Nats-Msg-Id`` header.

What the server must guarantee, and how shoal checks it
--------------------------------------------------------
A publish counts only once the server's PubAck has arrived, and JetStream
sends the PubAck after writing the message to its file store, not after
fsync. By default the store fsyncs every two minutes (``sync_interval: 2m``),
so a machine crash or power loss can lose two minutes of acknowledged
messages. shoal therefore requires every server to run with::

    jetstream { sync_interval: always }

A smaller interval only shrinks the window: whatever was acknowledged in the
last interval is still gone after a power cut, and a single-replica stream has
no other copy. ``always`` is the only setting under which an acknowledged
message survives a machine crash. (A killed server process alone loses
nothing: what it wrote is in the operating system's page cache.)

:meth:`NatsTransport.start` reads the setting from the server's monitoring
endpoint: ``GET <monitor_url>/varz``, field ``jetstream.config.sync_always``,
which nats-server 2.15 reports as ``true`` under ``sync_interval: always`` and
leaves out otherwise (``jetstream.config.sync_interval`` then holds the
interval in nanoseconds). When it is not ``true``, ``start`` raises
:class:`UnsafeDurability`, unless ``allow_unsafe_sync=True``, which logs an
ERROR and goes on. Without a ``monitor_url`` nothing can be checked, and
``start`` logs a WARNING saying so. Only the server behind ``monitor_url`` is
checked; in a cluster every server must be configured the same. A stream
set to ``persist_mode: async`` (ADR-56) acknowledges before writing whatever
the server's setting, and is refused the same way.

Publishing in atomic batches
----------------------------
Under ``sync_interval: always`` every stored write is fsynced before its
PubAck, so publishing one message at a time costs one fsync per message. A
publish call therefore sends its envelopes as JetStream atomic batches
(ADR-50, nats-server >= 2.12; the streams have ``allow_atomic``): up to
``max_batch`` messages with ``Nats-Batch-Id`` / ``Nats-Batch-Sequence``
headers, the last with ``Nats-Batch-Commit: 1``. The server stages the
batch, writes it whole on the commit, fsyncs once and then sends one PubAck
for the batch, or refuses the batch and stores none of it. A PubAck still
means every message it covers is on disk. Streams made before this (without
``allow_atomic``) are updated in place when first used; where the server
cannot do atomic batches, the topic is published one message at a time.

Acknowledgements are not waited for
-----------------------------------
:meth:`NatsDelivery.ack` sends the ack and returns. A lost ack costs a
redelivery after the ack wait, which a consumer's done-marker (or an
idempotent sink) drops; JetStream does not fsync acks, so a confirmed ack
is no safer after a crash either.

Publishing never buffers
------------------------
nats-py queues outgoing messages in memory while it reconnects and sends them
once the connection is back. A publish that timed out could then still reach
the stream later, after its caller was told it failed. This transport connects
with ``pending_size=0``, which makes the client refuse to queue anything while
it is disconnected, and checks the connection before each publish, so a
publish during an outage fails at once with :class:`PublishError`. One narrow
window remains: bytes handed to the client in the instant before it notices a
broken connection may be written after the reconnect. Such a message is a
duplicate of one its caller will publish again (the same id), which
JetStream's own de-duplication drops within its window and shoal's
de-duplication by id drops after it.

Example::

    transport = NatsTransport("nats://127.0.0.1:4222", monitor_url="http://127.0.0.1:8222")
    await transport.start()
    await transport.publish("card.ingest", [new_envelope({"card": 7}, published_at=now)])
    sub = await transport.subscribe("card.ingest", "writer", max_in_flight=200)
    for delivery in await sub.fetch(200, wait=timedelta(seconds=1)):
        await delivery.ack()
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import urllib.request
import uuid
from collections.abc import Coroutine, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    PersistMode,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamInfo,
)

from shoal.clock import Clock, SystemClock
from shoal.errors import Conflict, InvalidInput, ShoalError, TransientError
from shoal.ingest.message import Envelope, check_topic_name
from shoal.ingest.transport import (
    DEFAULT_ACK_WAIT,
    DEFAULT_PUBLISH_TIMEOUT,
    Delivery,
    Depth,
    PublishError,
)

log = logging.getLogger("shoal.ingest.nats")

SUBJECT_PREFIX = "shoal"
DEFAULT_STREAM_PREFIX = "SHOAL"
MSG_ID_HEADER = "Nats-Msg-Id"
# Atomic batch publish (ADR-50, nats-server >= 2.12; de-duplication by
# Nats-Msg-Id inside a batch since 2.12.1).
BATCH_ID_HEADER = "Nats-Batch-Id"
BATCH_SEQUENCE_HEADER = "Nats-Batch-Sequence"
BATCH_COMMIT_HEADER = "Nats-Batch-Commit"
# The server's limit on messages per atomic batch (its default; a server
# configured lower refuses larger batches with ERR_BATCH_TOO_LARGE).
DEFAULT_MAX_BATCH = 1000
# Atomic batches one transport has open at once. nats-server allows 50 per
# stream and 1,000 per server, shared by every publisher; a few are enough to
# keep one connection busy while the server fsyncs the previous commit.
MAX_BATCHES_IN_FLIGHT = 4
# JetStream error codes (ADR-50) that publish handles rather than reports.
ERR_ATOMIC_DISABLED = 10174  # the stream's allow_atomic is off
ERR_BATCH_DUPLICATE_MSG_ID = 10201  # an id of the batch is already stored (or twice in it)
DEFAULT_CONNECT_TIMEOUT = timedelta(seconds=5)
# JetStream API calls (stream and consumer info, create).
DEFAULT_REQUEST_TIMEOUT = timedelta(seconds=5)
# Single-message publishes of one call awaiting their PubAck at once (used
# only where an atomic batch cannot be: see NatsTransport.publish). Enough to
# keep the connection busy; bounded so a huge call does not park tens of
# thousands of reply futures at once.
DEFAULT_MAX_ACK_PENDING = 1024
# Messages are kept this long whether consumed or not (JetStream "limits"
# retention; see _stream_config for why not "interest"). The backlog monitor
# alerts after 10 minutes of waiting, days before anything expires.
DEFAULT_MAX_AGE = timedelta(days=7)
# nats-py's default is 2 s between reconnect attempts to one server.
DEFAULT_RECONNECT_WAIT = timedelta(seconds=2)
# JetStream needs a positive pull expiry; a zero wait becomes this.
MIN_FETCH_WAIT = timedelta(milliseconds=10)

# Errors that mean "the server did not answer": lost or closed connection,
# reconnecting, timeout. Everything else from nats-py is a bug or a refusal.
_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
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
# A publish fails on any of these: a refusal (stream limits, wrong stream)
# is as much "not stored" as a lost connection.
_PUBLISH_ERRORS: tuple[type[BaseException], ...] = (
    *_CONNECTION_ERRORS,
    nats.errors.Error,
    TransientError,
)
_CLOSE_ERRORS: tuple[type[BaseException], ...] = (
    *_CONNECTION_ERRORS,
    nats.errors.BadSubscriptionError,
)


class UnsafeDurability(ShoalError):
    """The NATS server may lose acknowledged messages in a crash.

    Raised by :meth:`NatsTransport.start` when the server does not run with
    ``jetstream { sync_interval: always }`` (or has no JetStream at all).
    """


@dataclass(frozen=True, slots=True)
class _Stream:
    """A topic's stream as this transport found it."""

    name: str
    atomic: bool  # allow_atomic is on: publish in atomic batches


@dataclass(slots=True)
class _Progress:
    """Messages of one publish call confirmed so far, for its error message."""

    confirmed: int = 0


async def _all_or_none(work: Iterable[Coroutine[Any, Any, None]]) -> None:
    """Run ``work`` together; at the first error cancel the rest, wait for them, raise it."""
    tasks = [asyncio.create_task(w) for w in work]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def stream_name_for(prefix: str, topic: str) -> str:
    """``SHOAL`` + ``card.ingest`` -> ``SHOAL_card_ingest`` (``.`` is not allowed in a name)."""
    return f"{prefix}_{check_topic_name(topic).replace('.', '_')}"


def subject_for(topic: str) -> str:
    return f"{SUBJECT_PREFIX}.{check_topic_name(topic)}"


def consumer_name_for(group: str) -> str:
    """A durable consumer name for ``group``: the same rules as a topic, ``.`` -> ``_``."""
    try:
        check_topic_name(group)
    except InvalidInput:
        raise InvalidInput("group", f"{group!r}: use 1-100 of A-Z a-z 0-9 . _ -") from None
    return group.replace(".", "_")


def is_sync_always(varz: dict[str, Any]) -> bool:
    """Whether a server's ``/varz`` says JetStream fsyncs every write."""
    config = (varz.get("jetstream") or {}).get("config") or {}
    return config.get("sync_always") is True


def describe_sync(varz: dict[str, Any]) -> str:
    """The sync setting as an operator would write it, for error messages."""
    jetstream = varz.get("jetstream") or {}
    config = jetstream.get("config")
    if not config:
        return "JetStream not enabled"
    if config.get("sync_always") is True:
        return "sync_interval: always"
    interval_ns = config.get("sync_interval")
    if isinstance(interval_ns, int):
        return f"sync_interval: {timedelta(microseconds=interval_ns / 1000)}"
    return "sync_interval: unknown"


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
    at :meth:`start`; any other topic on first use. See the module docstring
    for the server setting shoal requires and how it is checked.
    """

    name = "nats"

    def __init__(
        self,
        servers: str | list[str],
        *,
        stream_prefix: str = DEFAULT_STREAM_PREFIX,
        monitor_url: str | None = None,
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
        if not stream_prefix or not set(stream_prefix) <= _STREAM_NAME_CHARS:
            raise InvalidInput("stream_prefix", f"{stream_prefix!r}: use A-Z a-z 0-9 _ -")
        if replicas < 1:
            raise InvalidInput("replicas", f"{replicas}: at least 1")
        if max_ack_pending < 1:
            raise InvalidInput("max_ack_pending", f"{max_ack_pending}: at least 1")
        if max_batch < 1:
            raise InvalidInput("max_batch", f"{max_batch}: at least 1")
        self._servers = [servers] if isinstance(servers, str) else list(servers)
        self._stream_prefix = stream_prefix
        self._monitor_url = monitor_url.rstrip("/") if monitor_url else None
        self._allow_unsafe_sync = allow_unsafe_sync
        self._replicas = replicas
        self._max_ack_pending = max_ack_pending
        self._max_batch = max_batch
        self._batch_slots = asyncio.Semaphore(MAX_BATCHES_IN_FLIGHT)
        self._max_age = max_age
        self._connect_timeout = connect_timeout
        self._request_timeout_s = request_timeout.total_seconds()
        self._reconnect_wait = reconnect_wait
        self._topics = [check_topic_name(topic) for topic in topics]
        self._clock: Clock = clock or SystemClock()
        self._nc: NatsClient | None = None
        self._js: JetStreamContext | None = None
        # topic -> stream, for streams checked or created by this transport.
        # Written under _streams_lock (and dropped by publish when a stream's
        # atomic publish was turned off behind shoal's back), read without it.
        self._streams: dict[str, _Stream] = {}
        self._streams_lock = asyncio.Lock()

    # -- life cycle -----------------------------------------------------------

    async def start(self) -> None:
        """Check the server's fsync setting, connect, and create the configured topics' streams.

        Idempotent. Raises :class:`UnsafeDurability` when the server may lose
        acknowledged messages, :class:`~shoal.errors.Conflict` when a stream
        exists with other storage, :class:`~shoal.errors.TransientError` when
        the server cannot be reached.
        """
        if self._nc is None:
            await self._check_durability()
            nc = NatsClient()
            try:
                # nats-py retries the first connect as long as it would retry a
                # reconnect (forever, below): the deadline is ours.
                async with asyncio.timeout(self._connect_timeout.total_seconds()):
                    await nc.connect(
                        self._servers,
                        connect_timeout=max(1, round(self._connect_timeout.total_seconds())),
                        # Refuse to queue publishes while disconnected: a caller
                        # must learn that its message was not stored.
                        pending_size=0,
                        # A worker outlives any outage; never give up reconnecting.
                        max_reconnect_attempts=-1,
                        reconnect_time_wait=self._reconnect_wait.total_seconds(),  # type: ignore[arg-type]
                        error_cb=_log_error,
                        disconnected_cb=_log_disconnected,
                        reconnected_cb=_log_reconnected,
                    )
            except _CONNECTION_ERRORS as exc:
                await nc.close()
                raise TransientError(f"nats: cannot connect to {self._servers}: {exc}") from exc
            self._nc = nc
            self._js = self._nc.jetstream(timeout=self._request_timeout_s)
        for topic in self._topics:
            await self._ensure_stream(topic)

    async def close(self) -> None:
        nc, self._nc, self._js = self._nc, None, None
        self._streams.clear()
        if nc is not None and not nc.is_closed:
            await nc.close()

    async def _check_durability(self) -> None:
        if self._monitor_url is None:
            log.warning(
                "nats: durability not verified: no monitor_url given, so shoal cannot check "
                "that the server runs with 'jetstream { sync_interval: always }'; without it "
                "a machine crash can lose acknowledged messages"
            )
            return
        url = f"{self._monitor_url}/varz"
        try:
            varz = await asyncio.to_thread(_get_json, url, self._request_timeout_s)
        except (OSError, ValueError) as exc:
            raise TransientError(f"nats: cannot read {url} to check durability: {exc}") from exc
        if is_sync_always(varz):
            return
        message = (
            f"nats server at {self._monitor_url} reports '{describe_sync(varz)}' "
            "(/varz jetstream.config.sync_always is not true): a machine crash or power loss "
            "can lose acknowledged messages. Set 'jetstream { sync_interval: always }' in the "
            "server config"
        )
        if not self._allow_unsafe_sync:
            raise UnsafeDurability(message + ", or pass allow_unsafe_sync=True to accept the risk")
        log.error("%s; going on because allow_unsafe_sync=True", message)

    def _connected(self) -> tuple[NatsClient, JetStreamContext]:
        if self._nc is None or self._js is None:
            raise TransientError("nats transport not started (call start() first)")
        return self._nc, self._js

    # -- streams --------------------------------------------------------------

    def _stream_config(self, topic: str) -> StreamConfig:
        return StreamConfig(
            name=stream_name_for(self._stream_prefix, topic),
            subjects=[subject_for(topic)],
            # "limits", not "interest": an interest stream with no consumer yet
            # drops every message as soon as it is stored (checked on 2.15),
            # while NSQ holds a topic's messages until a channel appears.
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            num_replicas=self._replicas,
            max_age=self._max_age.total_seconds() if self._max_age else None,
            # Past a size limit, refuse new messages (the publisher hears it)
            # rather than silently dropping the oldest.
            discard=DiscardPolicy.NEW,
            # Lets publish store a whole batch with one fsync (see publish).
            allow_atomic=True,
        )

    async def _ensure_stream(self, topic: str) -> _Stream:
        """The topic's stream, created if missing, checked, with atomic publish enabled."""
        stream = self._streams.get(topic)
        if stream is not None:
            return stream
        _, js = self._connected()
        config = self._stream_config(topic)
        assert config.name is not None
        async with self._streams_lock:
            stream = self._streams.get(topic)
            if stream is not None:
                return stream
            try:
                try:
                    info = await js.stream_info(config.name)
                except nats.js.errors.NotFoundError:
                    try:
                        info = await js.add_stream(config)
                    except nats.js.errors.BadRequestError:
                        # Created meanwhile by another process, maybe differently:
                        # read what is there and judge that.
                        info = await js.stream_info(config.name)
                self._check_stream(topic, info)
                atomic = info.config.allow_atomic is True or await self._enable_atomic(info)
            except _CONNECTION_ERRORS as exc:
                raise TransientError(f"nats: stream {config.name}: {exc}") from exc
            stream = _Stream(config.name, atomic)
            self._streams[topic] = stream
            return stream

    async def _enable_atomic(self, info: StreamInfo) -> bool:
        """Turn on atomic publish for a stream made without it (by a shoal before it used it).

        Only ``allow_atomic`` changes; messages, consumers and every other
        setting stay. False when the server refuses or ignores it (a server
        older than 2.12, a stream in async persist mode, no permission to
        update streams): the topic is then published one message at a time.
        """
        _, js = self._connected()
        name = info.config.name
        try:
            updated = await js.update_stream(dataclasses.replace(info.config, allow_atomic=True))
        except nats.js.errors.APIError as exc:
            if isinstance(exc, _CONNECTION_ERRORS):
                raise
            log.warning(
                "nats: stream %s has no atomic publish and cannot get it (%s); its topic is "
                "published one message at a time, which is slower but as safe",
                name,
                exc,
            )
            return False
        if updated.config.allow_atomic is not True:
            log.warning(
                "nats: the server ignored allow_atomic for stream %s (nats-server < 2.12?); its "
                "topic is published one message at a time, which is slower but as safe",
                name,
            )
            return False
        log.info("nats: enabled atomic batch publish on existing stream %s", name)
        return True

    def _check_stream(self, topic: str, info: StreamInfo) -> None:
        name = info.config.name
        storage = info.config.storage
        if storage != StorageType.FILE:
            raise Conflict(
                f"nats stream {name} (topic {topic!r}) uses {storage} storage; shoal needs "
                "file storage, which survives a server restart. Move its messages and recreate "
                "it with file storage, or choose another stream_prefix"
            )
        subject = subject_for(topic)
        subjects = info.config.subjects or []
        if subject not in subjects:
            raise Conflict(
                f"nats stream {name} carries {subjects}, not {subject!r}: another topic maps to "
                f"the same stream name as {topic!r} ('.' and '_' both become '_'); rename one"
            )
        if info.config.persist_mode == PersistMode.ASYNC:
            # ADR-56: the PubAck goes out before the write is flushed, whatever
            # sync_interval says: the hole sync_interval: always closes.
            message = (
                f"nats stream {name} (topic {topic!r}) has persist_mode 'async': it acknowledges "
                "messages before they are on disk, so a crash can lose them. Set it back to "
                "'default'"
            )
            if not self._allow_unsafe_sync:
                raise UnsafeDurability(message + ", or pass allow_unsafe_sync=True")
            log.error("%s; going on because allow_unsafe_sync=True", message)

    # -- publish --------------------------------------------------------------

    async def publish(
        self,
        topic: str,
        envelopes: Sequence[Envelope],
        *,
        timeout: timedelta = DEFAULT_PUBLISH_TIMEOUT,  # noqa: ASYNC109 - a deadline the transport owns
    ) -> None:
        """Store every envelope, or raise :class:`PublishError` within ``timeout``.

        Envelopes go out in atomic batches of up to ``max_batch`` (JetStream
        atomic batch publish, ADR-50): the server stores a whole batch with
        one fsync and one PubAck, or none of it. Batches are independent, so
        on an error some batches of the call may be stored and others not:
        the caller publishes the whole call again. A batch that holds an id
        the stream already has (such a retry, within its duplicate window)
        is refused whole by the server; it is then published one message at
        a time, which stores the missing messages and drops the rest as
        duplicates.
        """
        if not envelopes:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout.total_seconds()
        if self._nc is None:
            raise PublishError(f"nats: transport not started (publishing to {topic!r})")
        nc, _ = self._connected()
        if not nc.is_connected:
            raise PublishError(f"nats: not connected (publishing to {topic!r}); nothing was sent")
        progress = _Progress()
        try:
            async with asyncio.timeout_at(deadline):
                stream = await self._ensure_stream(topic)
                if stream.atomic:
                    await self._publish_batches(topic, stream.name, envelopes, progress, deadline)
                else:
                    await self._publish_each(topic, stream.name, envelopes, progress, deadline)
        except _PUBLISH_ERRORS as exc:
            reason = "timed out" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}"
            raise PublishError(
                f"nats: publish to {topic!r} {reason} ({exc}) after {progress.confirmed} of "
                f"{len(envelopes)} messages were confirmed; the rest may or may not be stored"
            ) from exc

    async def _publish_batches(
        self,
        topic: str,
        stream: str,
        envelopes: Sequence[Envelope],
        progress: _Progress,
        deadline: float,
    ) -> None:
        size = self._max_batch
        chunks = [envelopes[i : i + size] for i in range(0, len(envelopes), size)]
        if len(chunks) == 1:
            await self._publish_batch(topic, stream, chunks[0], progress, deadline)
            return
        await _all_or_none(
            self._publish_batch(topic, stream, chunk, progress, deadline) for chunk in chunks
        )

    async def _publish_batch(
        self,
        topic: str,
        stream: str,
        chunk: Sequence[Envelope],
        progress: _Progress,
        deadline: float,
    ) -> None:
        """One atomic batch: stored whole (its PubAck arrived) or an exception."""
        async with self._batch_slots:
            reply = await self._send_batch(topic, stream, chunk, deadline)
        error = reply.get("error")
        if error is None:
            if reply.get("stream") != stream or reply.get("count") != len(chunk):
                raise PublishError(
                    f"nats: batch PubAck {reply} does not confirm {len(chunk)} messages in {stream}"
                )
            progress.confirmed += len(chunk)
            return
        code = error.get("err_code") if isinstance(error, dict) else None
        if code == ERR_BATCH_DUPLICATE_MSG_ID:
            log.info(
                "nats: %r: a batch holds ids already stored (a retried publish); "
                "publishing its %d messages one at a time",
                topic,
                len(chunk),
            )
            await self._publish_each(topic, stream, chunk, progress, deadline)
            return
        if code == ERR_ATOMIC_DISABLED:
            # Turned off since start(): check the stream again on the next call.
            self._streams.pop(topic, None)
            log.warning("nats: atomic publish was disabled on stream %s; %s", stream, error)
            await self._publish_each(topic, stream, chunk, progress, deadline)
            return
        # The server refused the batch (a limit, a gap after a dropped
        # message, too many open batches): nothing of it was stored.
        raise PublishError(f"nats: batch of {len(chunk)} refused by {stream}: {error}")

    async def _send_batch(
        self, topic: str, stream: str, chunk: Sequence[Envelope], deadline: float
    ) -> dict[str, Any]:
        """Send one atomic batch in order on the connection; the server's answer to it.

        The first message is a request, answered at once: empty when the
        server opened the batch, an error (say, atomic publish disabled)
        otherwise, so a refused batch is not sent whole for nothing. The
        rest are plain publishes; the last carries ``Nats-Batch-Commit`` and
        is a request, answered by the PubAck (or the error) of the batch.
        Should a message be lost on the way, the server sees a gap in
        ``Nats-Batch-Sequence`` and refuses the batch; should the call stop
        before the commit, the server abandons the batch after 10 s. Either
        way nothing of it is stored.
        """
        nc, _ = self._connected()
        loop = asyncio.get_running_loop()
        subject = subject_for(topic)
        batch_id = uuid.uuid4().hex
        last = len(chunk)
        for seq, envelope in enumerate(chunk, start=1):
            headers = {
                BATCH_ID_HEADER: batch_id,
                BATCH_SEQUENCE_HEADER: str(seq),
                MSG_ID_HEADER: envelope.id,
            }
            if seq == last:
                headers[BATCH_COMMIT_HEADER] = "1"
            if seq == 1 or seq == last:
                # pending_size=0 makes nats-py refuse a request while it
                # reconnects, but only after registering a reply future that
                # nothing ever removes: refuse before that.
                if not nc.is_connected:
                    raise nats.errors.ConnectionReconnectingError
                reply = await nc.request(
                    subject,
                    envelope.encode(),
                    timeout=max(0.001, deadline - loop.time()),
                    headers=headers,
                )
                if seq == last or reply.data:
                    return _parse_reply(reply.data, stream)
            else:
                await nc.publish(subject, envelope.encode(), headers=headers)
        raise AssertionError("unreachable: the last message returns")

    async def _publish_each(
        self,
        topic: str,
        stream: str,
        envelopes: Sequence[Envelope],
        progress: _Progress,
        deadline: float,
    ) -> None:
        """One JetStream publish per envelope, pipelined: one fsync and one PubAck each."""
        nc, js = self._connected()
        loop = asyncio.get_running_loop()
        subject = subject_for(topic)
        window = asyncio.Semaphore(self._max_ack_pending)

        async def publish_one(envelope: Envelope) -> None:
            async with window:
                # As in _send_batch: refuse before nats-py registers a future.
                if not nc.is_connected:
                    raise nats.errors.ConnectionReconnectingError
                ack = await js.publish(
                    subject,
                    envelope.encode(),
                    timeout=max(0.001, deadline - loop.time()),
                    stream=stream,
                    headers={MSG_ID_HEADER: envelope.id},
                )
            if ack.stream != stream:  # the Nats-Expected-Stream header makes this a refusal
                raise PublishError(f"nats: stored in {ack.stream}, expected {stream}")
            progress.confirmed += 1

        await _all_or_none(publish_one(e) for e in envelopes)

    # -- consume --------------------------------------------------------------

    async def subscribe(
        self, topic: str, group: str, *, max_in_flight: int, ack_wait: timedelta = DEFAULT_ACK_WAIT
    ) -> NatsSubscription:
        """Join ``group`` on ``topic``: a durable pull consumer, created or updated.

        Every group sees every message of the topic retained on the server,
        including those published before the group first subscribed.
        """
        if max_in_flight < 1:
            raise InvalidInput("max_in_flight", f"{max_in_flight}: at least 1")
        if ack_wait <= timedelta(0):
            raise InvalidInput("ack_wait", f"{ack_wait}: must be positive")
        durable = consumer_name_for(group)
        _, js = self._connected()
        stream = (await self._ensure_stream(topic)).name
        config = ConsumerConfig(
            durable_name=durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            max_deliver=-1,  # NSQ MaxAttempts=0: shoal's retry ladder decides, never the server
            max_ack_pending=max_in_flight,
            ack_wait=ack_wait.total_seconds(),
        )
        nc, _ = self._connected()
        try:
            await js.add_consumer(stream, config)
            return await NatsSubscription(nc, stream=stream, durable=durable, topic=topic).open()
        except _CONNECTION_ERRORS as exc:
            raise TransientError(f"nats: consumer {durable} on {stream}: {exc}") from exc

    async def depth(self, topic: str, group: str) -> Depth:
        """The group's backlog, from the consumer's info (one API call, two when not empty).

        ``ready`` is JetStream's ``num_pending``: messages never yet delivered
        to the group. ``in_flight`` is ``num_ack_pending``: every delivered,
        unacknowledged message, which includes messages nakked with a delay
        and not yet due, and messages whose ack wait ran out and that await
        redelivery. JetStream does not report those apart, so ``delayed`` is
        always 0 here; ``total`` is right. ``oldest_age`` is read from the
        first unacknowledged message (the one after the consumer's ack floor).
        A group that has not subscribed yet reports the whole stream as ready.
        """
        durable = consumer_name_for(group)
        _, js = self._connected()
        stream = (await self._ensure_stream(topic)).name
        try:
            try:
                info = await js.consumer_info(stream, durable)
            except nats.js.errors.NotFoundError:
                state = (await js.stream_info(stream)).state
                first = state.first_seq if state.messages else None
                return Depth(
                    ready=state.messages,
                    in_flight=0,
                    delayed=0,
                    oldest_age=await self._age_from(stream, topic, first),
                )
            ready = info.num_pending or 0
            in_flight = info.num_ack_pending or 0
            floor = info.ack_floor.stream_seq if info.ack_floor else 0
            oldest = floor + 1 if ready + in_flight else None
            return Depth(
                ready=ready,
                in_flight=in_flight,
                delayed=0,
                oldest_age=await self._age_from(stream, topic, oldest),
            )
        except _CONNECTION_ERRORS as exc:
            raise TransientError(f"nats: depth of {stream}/{durable}: {exc}") from exc

    async def _age_from(self, stream: str, topic: str, seq: int | None) -> timedelta | None:
        """Age of the first message at or after ``seq`` (gaps are expired or deleted ones)."""
        if seq is None:
            return None
        _, js = self._connected()
        try:
            raw = await js.get_msg(stream, seq=seq, subject=subject_for(topic), next=True)
        except nats.js.errors.NotFoundError:
            return None  # acknowledged or expired between the two calls
        try:
            published_at = Envelope.decode(raw.data or b"").published_at
        except (ValueError, InvalidInput):
            if raw.time is None:
                return None
            published_at = raw.time  # not a shoal envelope: the server's store time
        return max(timedelta(0), self._clock.now() - published_at)


class NatsDelivery:
    """One delivery of one JetStream message (see :class:`~shoal.ingest.transport.Delivery`)."""

    __slots__ = ("_attempt", "_envelope", "_msg")

    def __init__(self, msg: Msg, envelope: Envelope) -> None:
        self._msg = msg
        self._envelope = envelope
        self._attempt: int | None = None

    @property
    def envelope(self) -> Envelope:
        return self._envelope

    @property
    def attempt(self) -> int:
        if self._attempt is None:  # parsed from the reply subject: once
            self._attempt = self._msg.metadata.num_delivered or 1
        return self._attempt

    async def ack(self) -> None:
        """Acknowledge, without waiting for the server to confirm it.

        Raises :class:`~shoal.errors.TransientError` when the connection is
        known to be down (nothing is queued while disconnected). An ack lost
        on the way costs a redelivery after the ack wait, which the consumer's
        done-marker (or an idempotent sink) drops; waiting for a confirmation
        (``ack_sync``) would only report that loss, at one round trip and one
        reply to parse per message. JetStream does not fsync a consumer's
        acks either way, so a confirmed ack is no more durable.
        """
        try:
            await self._msg.ack()
        except _CONNECTION_ERRORS as exc:
            raise TransientError(f"nats: ack of {self._envelope.id} not sent: {exc}") from exc

    async def nak(self, delay: timedelta) -> None:
        """Deliver again, not before ``delay``; counts a delivery (NSQ REQ)."""
        try:
            await self._msg.nak(delay=max(0.0, delay.total_seconds()))
        except _CONNECTION_ERRORS as exc:
            raise TransientError(f"nats: nak of {self._envelope.id}: {exc}") from exc

    async def term(self) -> None:
        """Never deliver again."""
        try:
            await self._msg.term()
        except _CONNECTION_ERRORS as exc:
            raise TransientError(f"nats: term of {self._envelope.id}: {exc}") from exc

    async def touch(self) -> None:
        """Restart the ack wait (JetStream "in progress", NSQ TOUCH)."""
        try:
            await self._msg.in_progress()
        except _CONNECTION_ERRORS as exc:
            raise TransientError(f"nats: touch of {self._envelope.id}: {exc}") from exc


class NatsSubscription:
    """A group's durable pull consumer, pulled through a subscription of shoal's own.

    A fetch sends one pull request (``$JS.API.CONSUMER.MSG.NEXT``) with a
    reply inbox this subscription listens on, and takes what has arrived.
    nats-py's own ``PullSubscription.fetch`` spends a task, a ``wait_for``
    and a ``uuid4`` on every message; here a message costs a queue put and
    get. The server's status answers end a pull: 404 (nothing waiting), 408
    (the request expired), 409 (refused: too many pulls waiting, the consumer
    deleted, a leader change). A pull that ends with fewer messages than asked
    may still deliver more later (its request stays open until it expires):
    they wait in the queue for the next fetch, their ack wait running, and
    the server's ``max_ack_pending`` bounds them like any delivery.
    """

    def __init__(self, nc: NatsClient, *, stream: str, durable: str, topic: str) -> None:
        self._nc = nc
        self._topic = topic
        self._next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._inbox = nc.new_inbox()
        self._arrived: asyncio.Queue[Msg] = asyncio.Queue()
        self._sub: Any = None

    async def open(self) -> NatsSubscription:
        async def arrived(msg: Msg) -> None:
            self._arrived.put_nowait(msg)

        self._sub = await self._nc.subscribe(self._inbox, cb=arrived)
        return self

    async def fetch(self, limit: int, *, wait: timedelta) -> Sequence[Delivery]:
        """Up to ``limit`` deliveries; an empty list when none came within ``wait``."""
        if limit < 1:
            raise InvalidInput("limit", f"{limit}: at least 1")
        wait_s = max(wait, MIN_FETCH_WAIT).total_seconds()
        msgs = self._take(limit)  # delivered for an earlier pull, after it returned
        if msgs:
            return await self._deliveries(msgs)
        # The request expires a little before this wait ends, so its 408
        # usually arrives while this fetch still listens.
        request = {"batch": limit, "expires": int(wait_s * 1e9 * 0.9)}
        try:
            await self._nc.publish(
                self._next_subject, json.dumps(request).encode(), reply=self._inbox
            )
        except _CONNECTION_ERRORS as exc:
            raise TransientError(f"nats: fetch from {self._topic!r}: {exc}") from exc
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while len(msgs) < limit:
            if self._arrived.empty():
                if msgs:
                    break  # return what came; later ones wait for the next fetch
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    async with asyncio.timeout(remaining):
                        msg = await self._arrived.get()
                except TimeoutError:
                    break
            else:
                msg = self._arrived.get_nowait()
            status = _status(msg)
            if status is None:
                msgs.append(msg)
            elif status in ("404", "408"):
                break
            elif status == "409":
                description = (msg.headers or {}).get("Description", "")
                if "deleted" in description.lower():
                    raise TransientError(f"nats: fetch from {self._topic!r}: 409 {description}")
                log.info("nats: %r: pull refused: 409 %s", self._topic, description)
                break
            # 100 (a heartbeat or flow control) and anything else: skip.
        return await self._deliveries(msgs)

    def _take(self, limit: int) -> list[Msg]:
        """Messages already here (status answers of earlier pulls are dropped)."""
        msgs: list[Msg] = []
        while len(msgs) < limit and not self._arrived.empty():
            msg = self._arrived.get_nowait()
            if _status(msg) is None:
                msgs.append(msg)
        return msgs

    async def _deliveries(self, msgs: list[Msg]) -> list[Delivery]:
        deliveries: list[Delivery] = []
        for msg in msgs:
            try:
                envelope = Envelope.decode(msg.data)
            except (ValueError, InvalidInput) as exc:
                # It can never decode, so redelivering it would loop forever.
                log.error(
                    "nats: %r: message %s is not a shoal envelope (%s); terminated",
                    self._topic,
                    msg.metadata.sequence.stream if msg.metadata.sequence else "?",
                    exc,
                )
                # If the term is lost, the message comes back after its ack
                # wait and is terminated then.
                with contextlib.suppress(*_CONNECTION_ERRORS):
                    await msg.term()
                continue
            deliveries.append(NatsDelivery(msg, envelope))
        return deliveries

    async def close(self) -> None:
        """Stop fetching; the durable consumer and its position stay on the server.

        Messages that arrive for an open pull after this are redelivered after
        their ack wait.
        """
        # A lost connection has taken the subscription with it.
        if self._sub is not None:
            with contextlib.suppress(*_CLOSE_ERRORS):
                await self._sub.unsubscribe()


def _status(msg: Msg) -> str | None:
    """The status code of a server answer on a pull inbox; None for a message."""
    if msg.data or not msg.headers:
        return None
    status = msg.headers.get("Status")
    return None if status is None else str(status)


_STREAM_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def _parse_reply(data: bytes, stream: str) -> dict[str, Any]:
    """A JetStream publish reply (PubAck or error) as a dict; a refusal if unreadable."""
    try:
        reply = json.loads(data)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise PublishError(f"nats: unreadable reply from {stream}: {data[:200]!r}")
    return reply


def _get_json(url: str, timeout_s: float) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        doc = json.loads(response.read())
    if not isinstance(doc, dict):
        raise ValueError(f"{url}: not a JSON object")
    return doc


async def _log_error(exc: Exception) -> None:
    log.warning("nats: %s: %s", type(exc).__name__, exc)


async def _log_disconnected() -> None:
    log.warning("nats: disconnected; publishes fail until the connection is back")


async def _log_reconnected() -> None:
    log.info("nats: reconnected")
