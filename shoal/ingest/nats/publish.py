"""Publishing: every envelope stored (its PubAck arrived), in atomic batches where possible.

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
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext

from shoal.errors import TransientError
from shoal.ingest.message import Envelope
from shoal.ingest.nats.connection import CONNECTION_ERRORS
from shoal.ingest.nats.streams import Streams, subject_for
from shoal.ingest.transport import PublishError

log = logging.getLogger("shoal.ingest.nats")

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
# Single-message publishes of one call awaiting their PubAck at once (used
# only where an atomic batch cannot be: see Publisher.publish). Enough to
# keep the connection busy; bounded so a huge call does not park tens of
# thousands of reply futures at once.
DEFAULT_MAX_ACK_PENDING = 1024

# A publish fails on any of these: a refusal (stream limits, wrong stream)
# is as much "not stored" as a lost connection.
PUBLISH_ERRORS: tuple[type[BaseException], ...] = (
    *CONNECTION_ERRORS,
    nats.errors.Error,
    TransientError,
)


@dataclass(slots=True)
class _Progress:
    """Messages of one publish call confirmed so far, for its error message."""

    confirmed: int = 0


class Publisher:
    """Publishes envelopes to the topics' streams of one connection.

    ``connected`` gives the client and its JetStream context (raising
    :class:`~shoal.errors.TransientError` while there is none).
    """

    def __init__(
        self,
        connected: Callable[[], tuple[NatsClient, JetStreamContext]],
        streams: Streams,
        *,
        max_batch: int,
        max_ack_pending: int,
    ) -> None:
        self._connected = connected
        self._streams = streams
        self._max_batch = max_batch
        self._max_ack_pending = max_ack_pending
        self._batch_slots = asyncio.Semaphore(MAX_BATCHES_IN_FLIGHT)

    async def publish(self, topic: str, envelopes: Sequence[Envelope], within: timedelta) -> None:
        """Store every envelope, or raise :class:`PublishError`, ``within`` that long.

        Envelopes go out in atomic batches of up to ``max_batch``: the server
        stores a whole batch with one fsync and one PubAck, or none of it.
        Batches are independent, so on an error some batches of the call may
        be stored and others not: the caller publishes the whole call again.
        A batch that holds an id the stream already has (such a retry, within
        its duplicate window) is refused whole by the server; it is then
        published one message at a time, which stores the missing messages
        and drops the rest as duplicates.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within.total_seconds()
        nc, _ = self._connected()
        if not nc.is_connected:
            raise PublishError(f"nats: not connected (publishing to {topic!r}); nothing was sent")
        progress = _Progress()
        try:
            async with asyncio.timeout_at(deadline):
                stream = await self._streams.ensure(topic)
                if stream.atomic:
                    await self._publish_batches(topic, stream.name, envelopes, progress, deadline)
                else:
                    await self._publish_each(topic, stream.name, envelopes, progress, deadline)
        except PUBLISH_ERRORS as exc:
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
            self._streams.forget(topic)
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


async def _all_or_none(work: Iterable[Coroutine[Any, Any, None]]) -> None:
    """Run ``work`` together; at the first error cancel the rest, wait for them, raise it."""
    tasks = [asyncio.create_task(w) for w in work]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _parse_reply(data: bytes, stream: str) -> dict[str, Any]:
    """A JetStream publish reply (PubAck or error) as a dict; a refusal if unreadable."""
    try:
        reply = json.loads(data)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise PublishError(f"nats: unreadable reply from {stream}: {data[:200]!r}")
    return reply
