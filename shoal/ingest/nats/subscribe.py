"""The consumer side: a group is a durable pull consumer, fetched through shoal's own pulls.

A consumer group is a durable pull consumer of the topic's stream, named for
the group. Each message carries :meth:`Envelope.encode` as its payload and
the envelope id in the ``Nats-Msg-Id`` header.

Acknowledgements are not waited for: :meth:`NatsDelivery.ack` sends the ack
and returns. A lost ack costs a redelivery after the ack wait, which a
consumer's done-marker (or an idempotent sink) drops; JetStream does not
fsync acks, so a confirmed ack is no safer after a crash either.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from shoal.clock import Clock
from shoal.errors import InvalidInput, TransientError
from shoal.ingest.dedupe import DoneStore
from shoal.ingest.message import Envelope, check_group_name
from shoal.ingest.nats.connection import CONNECTION_ERRORS
from shoal.ingest.nats.streams import subject_for
from shoal.ingest.transport import Delivery, Depth, mark_first

log = logging.getLogger("shoal.ingest.nats")

# JetStream needs a positive pull expiry; a zero wait becomes this.
MIN_FETCH_WAIT = timedelta(milliseconds=10)
_CLOSE_ERRORS: tuple[type[BaseException], ...] = (
    *CONNECTION_ERRORS,
    nats.errors.BadSubscriptionError,
)


def consumer_name_for(group: str) -> str:
    """A durable consumer name for ``group``: the same rules as a topic, ``.`` -> ``_``."""
    return check_group_name(group).replace(".", "_")


async def join(
    nc: NatsClient,
    js: JetStreamContext,
    *,
    stream: str,
    durable: str,
    topic: str,
    max_in_flight: int,
    ack_wait: timedelta,
) -> NatsSubscription:
    """Create or update the group's durable consumer on ``stream``; a subscription to it.

    JetStream keeps one ack wait per durable consumer, so the whole group
    shares it: a durable that exists with another ack wait is updated to
    ``ack_wait``, with a WARNING naming both.
    """
    config = ConsumerConfig(
        durable_name=durable,
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        max_deliver=-1,  # NSQ MaxAttempts=0: shoal's retry ladder decides, never the server
        max_ack_pending=max_in_flight,
        ack_wait=ack_wait.total_seconds(),
    )
    try:
        await _warn_if_ack_wait_changes(js, stream, durable, ack_wait)
        await js.add_consumer(stream, config)
        return await NatsSubscription(nc, stream=stream, durable=durable, topic=topic).open()
    except CONNECTION_ERRORS as exc:
        raise TransientError(f"nats: consumer {durable} on {stream}: {exc}") from exc


async def _warn_if_ack_wait_changes(
    js: JetStreamContext, stream: str, durable: str, ack_wait: timedelta
) -> None:
    try:
        info = await js.consumer_info(stream, durable)
    except nats.js.errors.NotFoundError:
        return
    before = info.config.ack_wait
    if before is not None and abs(before - ack_wait.total_seconds()) > 1e-3:
        log.warning(
            "nats: consumer %s on %s had ack_wait %ss; now %ss, this subscriber's "
            "(the group shares one: every member should declare the same)",
            durable,
            stream,
            f"{before:g}",
            f"{ack_wait.total_seconds():g}",
        )


async def group_depth(
    js: JetStreamContext, *, stream: str, durable: str, topic: str, clock: Clock
) -> Depth:
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
                oldest_age=await _age_from(js, stream, topic, first, clock),
            )
        ready = info.num_pending or 0
        in_flight = info.num_ack_pending or 0
        floor = info.ack_floor.stream_seq if info.ack_floor else 0
        oldest = floor + 1 if ready + in_flight else None
        return Depth(
            ready=ready,
            in_flight=in_flight,
            delayed=0,
            oldest_age=await _age_from(js, stream, topic, oldest, clock),
        )
    except CONNECTION_ERRORS as exc:
        raise TransientError(f"nats: depth of {stream}/{durable}: {exc}") from exc


async def _age_from(
    js: JetStreamContext, stream: str, topic: str, seq: int | None, clock: Clock
) -> timedelta | None:
    """Age of the first message at or after ``seq`` (gaps are expired or deleted ones)."""
    if seq is None:
        return None
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
    return max(timedelta(0), clock.now() - published_at)


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
        except CONNECTION_ERRORS as exc:
            raise TransientError(f"nats: ack of {self._envelope.id} not sent: {exc}") from exc

    async def ack_done(self, done: DoneStore) -> None:
        """Mark the message done, then ack: two writes, since ``done`` is not the stream."""
        await done.mark(self._envelope.id)
        await self.ack()

    async def nak(self, delay: timedelta) -> None:
        """Deliver again, not before ``delay``; counts a delivery (NSQ REQ)."""
        try:
            await self._msg.nak(delay=max(0.0, delay.total_seconds()))
        except CONNECTION_ERRORS as exc:
            raise TransientError(f"nats: nak of {self._envelope.id}: {exc}") from exc

    async def term(self) -> None:
        """Never deliver again."""
        try:
            await self._msg.term()
        except CONNECTION_ERRORS as exc:
            raise TransientError(f"nats: term of {self._envelope.id}: {exc}") from exc

    async def touch(self) -> None:
        """Restart the ack wait (JetStream "in progress", NSQ TOUCH)."""
        try:
            await self._msg.in_progress()
        except CONNECTION_ERRORS as exc:
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
        except CONNECTION_ERRORS as exc:
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

    async def ack_many(
        self, deliveries: Sequence[Delivery], *, done: DoneStore | None = None
    ) -> list[BaseException | None]:
        """The markers first (together), then an ack per message: JetStream has no batch ack."""
        outcomes = await mark_first(deliveries, done)
        for i, delivery in enumerate(deliveries):
            if outcomes[i] is None:
                try:
                    await delivery.ack()
                except Exception as exc:
                    outcomes[i] = exc
        return outcomes

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
                with contextlib.suppress(*CONNECTION_ERRORS):
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
