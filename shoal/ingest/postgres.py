"""The ``postgres`` transport: topics in shoal's database, in a table of their own.

A message is a row of ``topic_message`` (migration 0012 of this layer): its
topic, its delivery count, when it is next due, and its envelope.
Publishing is an INSERT that commits before ``publish`` returns (so it is as
durable as the database), in the caller's transaction when one is given. A
delivery is a claim: the row's attempt counter is the delivery count and its
fencing token, and the claim leases the message for the claiming consumer's
``ack_wait`` (a touch extends it by as much), whatever it was published
with. ``ack`` deletes the message, ``nak`` makes it due again after the given
delay, ``term`` deletes it (its dead letter, written first, holds it). A
consumer that dies leaves its lease to run out, after which the next claim
takes the message again: no sweep is needed. A subscription claims after the
id of the last message it claimed, and from the head of the topic only now
and then, as a worker claims its queue (shoal.queue.cursor): the entries that
claimed messages leave in the claim index are not stepped over again on every
claim. There is one consumer group per topic; the group name is checked as
nats checks it and otherwise unused. Idle consumers are woken by the queue
notifier's NOTIFY on the name ``topic.<name>``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from datetime import timedelta

from shoal.clock import work_seconds
from shoal.db.coalesce import Coalescer
from shoal.db.pool import AsyncConn
from shoal.errors import InvalidInput, ShoalError
from shoal.ingest.dedupe import DoneStore, PostgresDoneStore
from shoal.ingest.message import Envelope, check_group_name, check_topic_name
from shoal.ingest.store import ClaimedMessage, IngestStore
from shoal.ingest.transport import (
    DEFAULT_ACK_WAIT,
    DEFAULT_PUBLISH_TIMEOUT,
    Delivery,
    Depth,
    PublishError,
    mark_first,
)
from shoal.queue.client import Shoal
from shoal.queue.cursor import ClaimCursor, Position, job_order

# A topic's name as the notifier and the worker registry know it (and, until
# 0.2.0, the queue that held its messages as jobs).
QUEUE_PREFIX = "topic."
# (message row id, attempt, (message id, TTL) of the done-marker to write, or None)
Ack = tuple[int, int, tuple[str, timedelta] | None]
# (topic, encoded envelopes)
Publish = tuple[str, list[str]]


def topic_queue(topic: str) -> str:
    return QUEUE_PREFIX + check_topic_name(topic)


def marker_ttl(boss: Shoal, done: DoneStore) -> timedelta | None:
    """The markers' TTL when ``done`` keeps them in ``boss``'s database, else None.

    An ack then writes the done-marker in its own statement
    (:meth:`PgDelivery.ack_done`) instead of a statement for each.
    """
    if not isinstance(done, PostgresDoneStore):
        return None
    ours, theirs = boss.db, done.store.db
    if ours is theirs or (ours.url, ours.schema) == (theirs.url, theirs.schema):
        return done.ttl
    return None


class PgDelivery:
    __slots__ = ("_claim", "_envelope", "_sub")

    def __init__(self, sub: PgSubscription, claim: ClaimedMessage) -> None:
        self._sub = sub
        self._claim = claim
        self._envelope: Envelope | None = None

    @property
    def envelope(self) -> Envelope:
        if self._envelope is None:
            self._envelope = Envelope.decode(self._claim.envelope_json)
        return self._envelope

    @property
    def attempt(self) -> int:
        return self._claim.attempt

    async def ack(self) -> None:
        await self._sub.acks.submit((self._claim.id, self._claim.attempt, None))

    async def ack_done(self, done: DoneStore) -> None:
        """Ack, with the done-marker in the same statement when ``done`` is in this database."""
        ttl = self._sub.marker_ttl(done)
        if ttl is None:
            await done.mark(self.envelope.id)
            await self.ack()
            return
        mark = (self.envelope.id, ttl)
        await self._sub.acks.submit((self._claim.id, self._claim.attempt, mark))

    async def nak(self, delay: timedelta) -> None:
        await self._sub.settle(self._claim, delay)

    async def term(self) -> None:
        await self._sub.settle(self._claim, None)

    async def touch(self) -> None:
        sub = self._sub
        claim = (self._claim.id, self._claim.attempt)
        await sub.store.touch(sub.topic, claim, ack_wait=sub.ack_wait, now=sub.boss.clock.sql_now())


class PgSubscription:
    def __init__(self, boss: Shoal, store: IngestStore, topic: str, *, ack_wait: timedelta) -> None:
        self.boss = boss
        self.store = store
        self.topic = topic
        self.queue = topic_queue(topic)  # the notifier's name for it
        # The lease of every delivery this subscription claims (and of each touch).
        self.ack_wait = ack_wait
        # Acks of many deliveries go out as one statement, with their markers.
        self.acks: Coalescer[Ack, None] = Coalescer(self._ack_many, name=f"shoal-acks-{topic}")
        self._wake = boss.notifier.subscribe(self.queue) if boss.notifier is not None else None
        self._cursor: ClaimCursor[Position] = ClaimCursor(job_order)
        # The done store last acked with, and its markers' TTL on ack (a
        # subscription's consumer has one store: worked out once).
        self._done: tuple[DoneStore, timedelta | None] | None = None

    def marker_ttl(self, done: DoneStore) -> timedelta | None:
        if self._done is None or self._done[0] is not done:
            self._done = (done, marker_ttl(self.boss, done))
        return self._done[1]

    async def _ack_many(self, acks: Sequence[Ack]) -> list[None]:
        await self.store.ack(
            self.topic,
            [(job, attempt) for job, attempt, _ in acks],
            marks={mark[0]: mark[1] for _, _, mark in acks if mark is not None},
            now=self.boss.clock.sql_now(),
        )
        return [None] * len(acks)

    async def ack_many(
        self, deliveries: Sequence[Delivery], *, done: DoneStore | None = None
    ) -> list[BaseException | None]:
        """One statement for all of them, with their done-markers when ``done``
        keeps its markers in this database (else those are written first)."""
        claims = [self._own(d) for d in deliveries]
        ttl = None if done is None else self.marker_ttl(done)
        outcomes: list[BaseException | None] = (
            [None] * len(claims) if ttl is not None else await mark_first(deliveries, done)
        )
        acked = [c for c, outcome in zip(claims, outcomes, strict=True) if outcome is None]
        if not acked:
            return outcomes
        marks = {} if ttl is None else {d.envelope.id: ttl for d in deliveries}
        try:
            await self.store.ack(
                self.topic,
                [(c.id, c.attempt) for c in acked],
                marks=marks,
                now=self.boss.clock.sql_now(),
            )
        except Exception as exc:
            return [exc if outcome is None else outcome for outcome in outcomes]
        return outcomes

    def _own(self, delivery: Delivery) -> ClaimedMessage:
        if not isinstance(delivery, PgDelivery) or delivery._sub is not self:
            raise InvalidInput("deliveries", f"{delivery!r} was not fetched by this subscription")
        return delivery._claim

    async def settle(self, claim: ClaimedMessage, delay: timedelta | None) -> None:
        """Nak (due again after ``delay``) or, with None, term (deleted) the delivery."""
        if delay is not None and delay < timedelta(0):
            raise InvalidInput("delay", f"{delay}: must not be negative")
        now = self.boss.clock.sql_now()
        await self.store.settle(self.topic, (claim.id, claim.attempt), delay=delay, now=now)

    async def fetch(self, limit: int, *, wait: timedelta) -> Sequence[Delivery]:
        if limit < 1:
            raise InvalidInput("limit", f"{limit}: at least 1")
        # Cleared before the claim: a NOTIFY during the claim must still end the wait.
        if self._wake is not None:
            self._wake.clear()
        patient = wait > timedelta(0)
        claims = await self._claim(limit, patient=patient)
        if not claims and patient:
            await self._idle(wait)
            claims = await self._claim(limit, patient=False)
        return [PgDelivery(self, claim) for claim in claims]

    async def _idle(self, wait: timedelta) -> None:
        """Until a NOTIFY about the topic, ``wait``, or a claim from the head falls due.

        A claim from the head is owed when one from the position came back
        empty while the head was too dear to claim from (shoal.queue.cursor):
        a message behind the position (nakked, expired, committed late) may
        be all that waits. Its time is real seconds, whatever the clock: it
        paces claims by what they cost the database.
        """
        seconds = wait.total_seconds()
        due = self._cursor.head_due_in(work_seconds())
        if self._wake is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds if due is None else min(due, seconds)):
                    await self._wake.wait()
        elif due is not None and due < seconds:
            await asyncio.sleep(due)
        else:
            await self.boss.clock.sleep(seconds)

    async def _claim(self, limit: int, *, patient: bool) -> list[ClaimedMessage]:
        """Claim where the cursor says; if that was after the position and found
        nothing, from the head as well, at once unless ``patient`` and the head
        is too dear yet (the fetch then waits for it): a fetch comes back
        empty only after a claim from the head found nothing."""
        after = self._cursor.start(work_seconds())
        claims = await self._claim_at(limit, after)
        if claims or after is None:
            return claims
        if not patient or self._cursor.head_due_in(work_seconds()) == 0:
            claims = await self._claim_at(limit, None)
        return claims

    async def _claim_at(self, limit: int, after: Position | None) -> list[ClaimedMessage]:
        """One claim, from the head or after ``after``, recorded in the cursor."""
        claims, cost_s = await self.store.claim(
            self.topic, limit, ack_wait=self.ack_wait, now=self.boss.clock.sql_now(), after=after
        )
        self._cursor.advance(after, claims, limit=limit, ended=work_seconds(), cost_s=cost_s)
        return claims

    async def close(self) -> None:
        await self.acks.close()
        if self._wake is not None and self.boss.notifier is not None:
            self.boss.notifier.unsubscribe(self.queue, self._wake)


class PostgresTransport:
    """Topics in shoal's database: nothing else to run, as durable as the database."""

    name = "postgres"
    in_database = True

    def __init__(self, boss: Shoal) -> None:
        self.boss = boss
        self.store = IngestStore(boss.db)
        # Small publishes of concurrent producers go out together, one statement
        # and one commit for many (hundreds of polls each publishing one message).
        self._publishes: Coalescer[Publish, None] = Coalescer(
            self._publish_together, name="shoal-publishes"
        )

    async def start(self) -> None:
        if self.boss.notifier is not None:
            self.boss.notifier.start()

    async def close(self) -> None:
        await self._publishes.close()

    async def publish(
        self,
        topic: str,
        envelopes: Sequence[Envelope],
        *,
        timeout: timedelta = DEFAULT_PUBLISH_TIMEOUT,  # noqa: ASYNC109 - a deadline the transport owns
        conn: AsyncConn | None = None,
    ) -> None:
        """Insert the messages; with ``conn``, inside the caller's transaction.

        Stored whole or not at all. Up to :data:`COALESCE_UP_TO` messages
        without ``conn`` share a statement with other producers' publishes.
        """
        check_topic_name(topic)
        texts = [e.encode().decode() for e in envelopes]
        try:
            # Checked here: one producer's bad message must not fail the others'.
            self.boss.check_payload_sizes(texts)
            async with asyncio.timeout(timeout.total_seconds()):
                if conn is None and len(texts) <= COALESCE_UP_TO:
                    await self._publishes.submit((topic, texts))
                else:
                    await self._insert([(topic, texts)], conn)
        except TimeoutError as exc:
            raise PublishError(f"publish to {topic!r} not confirmed within {timeout}") from exc
        except ShoalError as exc:
            if isinstance(exc, PublishError):
                raise
            raise PublishError(f"publish to {topic!r} failed: {exc}") from exc

    async def _publish_together(self, publishes: Sequence[Publish]) -> list[None]:
        await self._insert(publishes, None)
        return [None] * len(publishes)

    async def _insert(self, publishes: Sequence[Publish], conn: AsyncConn | None) -> None:
        messages = [(topic, text) for topic, texts in publishes for text in texts]
        if not messages:
            return
        queues = sorted({topic_queue(topic) for topic, _ in publishes})
        now = self.boss.clock.sql_now()
        channel = self.boss.store.channel

        async def insert(c: AsyncConn) -> None:
            for start in range(0, len(messages), PUBLISH_CHUNK):
                chunk = messages[start : start + PUBLISH_CHUNK]
                await self.store.publish(chunk, channel=channel, queues=queues, now=now, conn=c)

        # One transaction: a publish is stored whole or not at all.
        await self.boss.db.on(conn, insert, transaction=len(messages) > PUBLISH_CHUNK)

    async def subscribe(
        self, topic: str, group: str, *, max_in_flight: int, ack_wait: timedelta = DEFAULT_ACK_WAIT
    ) -> PgSubscription:
        """Take ``topic``'s messages, each under a lease of ``ack_wait`` from its claim.

        A delivery neither acked nor nakked within ``ack_wait`` (its consumer
        died, or hung without ``touch``) is delivered again by a claim after
        the lease ends: the lease is this subscriber's, whatever the
        publisher's settings.
        """
        if max_in_flight < 1:
            raise InvalidInput("max_in_flight", f"{max_in_flight}: at least 1")
        if ack_wait <= timedelta(0):
            raise InvalidInput("ack_wait", f"{ack_wait}: must be positive")
        check_group_name(group)  # unused here, but refused where nats would refuse it
        return PgSubscription(self.boss, self.store, check_topic_name(topic), ack_wait=ack_wait)

    async def depth(self, topic: str, group: str) -> Depth:
        check_group_name(group)
        return await self.store.topic_depth(check_topic_name(topic), now=self.boss.clock.sql_now())


# Large publishes go out in statements of this many messages.
PUBLISH_CHUNK = 5000
# Publishes of at most this many messages are coalesced with concurrent ones.
COALESCE_UP_TO = 50
