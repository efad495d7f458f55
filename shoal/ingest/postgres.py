"""The ``postgres`` transport: topics as queues on shoal's job table.

A topic ``t`` is the queue ``topic.t``; each message is one job whose payload
is the envelope. Publishing is an INSERT that commits before ``publish``
returns (so it is as durable as the database), in the caller's transaction
when one is given. A delivery is a claim: the job's attempt counter is the
delivery count and its fencing token, ``ack`` completes the job, ``nak``
fails it into ``retry`` with the given delay, and a consumer that dies
leaves its lease to expire, after which maintenance makes the message
deliverable again. There is one consumer group per topic (the queue itself);
the group name is accepted for the interface and otherwise unused.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from datetime import timedelta

from shoal.db.coalesce import Coalescer
from shoal.db.pool import AsyncConn
from shoal.errors import ShoalError
from shoal.ingest.message import Envelope, check_topic_name
from shoal.ingest.store import IngestStore
from shoal.ingest.transport import (
    DEFAULT_ACK_WAIT,
    DEFAULT_PUBLISH_TIMEOUT,
    Delivery,
    Depth,
    PublishError,
)
from shoal.queue.client import Shoal
from shoal.queue.job import event_entry
from shoal.queue.states import JobId, JobState
from shoal.queue.store import ClaimedJob, Failure

QUEUE_PREFIX = "topic."
# Deliveries are never capped by the queue: the consumer decides (NSQ MaxAttempts=0).
UNLIMITED_ATTEMPTS = 2**31 - 1


def topic_queue(topic: str) -> str:
    return QUEUE_PREFIX + check_topic_name(topic)


class PgDelivery:
    __slots__ = ("_claim", "_envelope", "_sub")

    def __init__(self, sub: PgSubscription, claim: ClaimedJob) -> None:
        self._sub = sub
        self._claim = claim
        self._envelope: Envelope | None = None

    @property
    def envelope(self) -> Envelope:
        if self._envelope is None:
            self._envelope = Envelope.decode(self._claim.data_json)
        return self._envelope

    @property
    def attempt(self) -> int:
        return self._claim.attempt

    async def ack(self) -> None:
        await self._sub.acks.submit((self._claim.id, self._claim.attempt))

    async def nak(self, delay: timedelta) -> None:
        await self._sub.end(self._claim, JobState.RETRY, delay, "nak", "redelivery requested")

    async def term(self) -> None:
        await self._sub.end(self._claim, JobState.FAILED, None, "term", "dead-lettered")

    async def touch(self) -> None:
        await self._sub.boss.store.extend_leases(
            [(self._claim.id, self._claim.attempt)], now=self._sub.boss.clock.sql_now()
        )


class PgSubscription:
    def __init__(self, boss: Shoal, store: IngestStore, queue: str) -> None:
        self.boss = boss
        self.store = store
        self.queue = queue
        # Acks of many deliveries go out as one statement.
        self.acks: Coalescer[tuple[JobId, int], None] = Coalescer(
            self._ack_many, name=f"shoal-acks-{queue}"
        )
        self._wake = boss.notifier.subscribe(queue) if boss.notifier is not None else None

    async def _ack_many(self, done: Sequence[tuple[JobId, int]]) -> list[None]:
        await self.store.ack(done)
        return [None] * len(done)

    async def end(
        self, claim: ClaimedJob, state: JobState, delay: timedelta | None, kind: str, why: str
    ) -> None:
        at = self.boss.clock.now().isoformat()
        failure = Failure(
            claim.id, claim.attempt, state, delay, event_entry(claim.attempt, kind, why, at)
        )
        await self.boss.store.fail([failure], now=self.boss.clock.sql_now())

    async def fetch(self, limit: int, *, wait: timedelta) -> Sequence[Delivery]:
        claims = await self.boss.store.claim(self.queue, limit, now=self.boss.clock.sql_now())
        if not claims and wait > timedelta(0):
            if self._wake is not None:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait.total_seconds()):
                        await self._wake.wait()
            else:
                await self.boss.clock.sleep(wait.total_seconds())
            claims = await self.boss.store.claim(self.queue, limit, now=self.boss.clock.sql_now())
        return [PgDelivery(self, claim) for claim in claims]

    async def close(self) -> None:
        await self.acks.close()
        if self._wake is not None and self.boss.notifier is not None:
            self.boss.notifier.unsubscribe(self.queue, self._wake)


class PostgresTransport:
    """Topics on shoal's job table: nothing else to run, as durable as the database."""

    name = "postgres"

    def __init__(self, boss: Shoal, *, ack_wait: timedelta = DEFAULT_ACK_WAIT) -> None:
        self.boss = boss
        self.ack_wait = ack_wait
        self.store = IngestStore(boss.db)

    async def start(self) -> None:
        if self.boss.notifier is not None:
            self.boss.notifier.start()

    async def close(self) -> None:
        return None

    async def publish(
        self,
        topic: str,
        envelopes: Sequence[Envelope],
        *,
        timeout: timedelta = DEFAULT_PUBLISH_TIMEOUT,  # noqa: ASYNC109 - a deadline the transport owns
        conn: AsyncConn | None = None,
    ) -> None:
        """Insert the messages; with ``conn``, inside the caller's transaction."""
        texts = [e.encode().decode() for e in envelopes]
        queue = topic_queue(topic)

        async def insert(c: AsyncConn) -> None:
            for start in range(0, len(texts), PUBLISH_CHUNK):
                await self.boss.insert_json(
                    queue,
                    texts[start : start + PUBLISH_CHUNK],
                    conn=c,
                    retry_limit=UNLIMITED_ATTEMPTS,
                    expire_in=self.ack_wait,
                )

        try:
            async with asyncio.timeout(timeout.total_seconds()):
                # One transaction: a publish is stored whole or not at all.
                await self.boss.db.on(conn, insert, transaction=len(texts) > PUBLISH_CHUNK)
        except TimeoutError as exc:
            raise PublishError(f"publish to {topic!r} not confirmed within {timeout}") from exc
        except ShoalError as exc:
            if isinstance(exc, PublishError):
                raise
            raise PublishError(f"publish to {topic!r} failed: {exc}") from exc

    async def subscribe(
        self, topic: str, group: str, *, max_in_flight: int, ack_wait: timedelta = DEFAULT_ACK_WAIT
    ) -> PgSubscription:
        return PgSubscription(self.boss, self.store, topic_queue(topic))

    async def depth(self, topic: str, group: str) -> Depth:
        return await self.store.queue_depth(topic_queue(topic), now=self.boss.clock.sql_now())


# Large publishes go out in statements of this many messages.
PUBLISH_CHUNK = 5000
