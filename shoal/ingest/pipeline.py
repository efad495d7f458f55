"""``Pipeline``: topics, consumers, the mode switch and backpressure, over one transport.

>>> pipeline = Pipeline(boss)                      # postgres transport   # doctest: +SKIP
>>> await pipeline.publish(readings, reading)                             # doctest: +SKIP
>>> await pipeline.submit(readings, reading, apply_reading)  # sync|async  # doctest: +SKIP

``submit`` is the producer's one call for decision D11 of the reference: in
``sync`` mode it applies the message in place (the same ``apply`` the
consumer runs); in ``async`` mode it publishes, and when the publish fails
it applies that one message in place and logs a WARN, so an outage of the
transport degrades throughput, never loses an observation. The sync path
degrades too: an in-place apply that fails with a retryable error (the
reference's 3 s write timeouts) hands the message to the topic, where a
consumer retries it, instead of losing it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, TypeVar

from shoal.clock import Clock
from shoal.db.pool import AsyncConn
from shoal.errors import InvalidInput
from shoal.ingest.config import RuntimeConfig
from shoal.ingest.consumer import Apply, BatchConsumer, Consumer, WriteBatch
from shoal.ingest.dedupe import DoneStore, PostgresDoneStore
from shoal.ingest.message import Envelope, Message, Topic, new_envelope
from shoal.ingest.monitor import BacklogMonitor
from shoal.ingest.postgres import PostgresTransport
from shoal.ingest.retry import is_retryable
from shoal.ingest.store import IngestStore
from shoal.ingest.transport import PublishError, Transport
from shoal.queue.client import Shoal

T = TypeVar("T")
log = logging.getLogger("shoal.ingest")

Mode = Literal["sync", "async"]
Route = Literal["applied", "published", "handed_off", "degraded"]

DEFAULT_MODE_KEY = "ingest.mode"
DEFAULT_MODE = "sync"  # the reference's: switch to async once the deployment is confirmed
DEFAULT_CONNECTION_RESERVE = 20
# Submit: how long to keep trying when neither apply nor publish works, and the pauses.
SUBMIT_PATIENCE = timedelta(seconds=30)
SUBMIT_RETRY_FIRST = 0.25
SUBMIT_RETRY_MAX = 5.0
# How long producers may act on a pause flag they read.
ADMIT_CACHE = timedelta(seconds=1)


@dataclass(frozen=True, slots=True)
class Submitted:
    """What :meth:`Pipeline.submit` did with one message (see there)."""

    id: str
    route: Route
    error: BaseException | None = None  # the in-place apply's error, when handed off
    rounds: int = 1  # more than 1: neither path worked at first (see submit's give_up_after)


class Pipeline:
    def __init__(
        self,
        boss: Shoal,
        transport: Transport | None = None,
        *,
        dedupe: DoneStore | None = None,
        mode_key: str = DEFAULT_MODE_KEY,
        clock: Clock | None = None,
    ) -> None:
        self.boss = boss
        self.clock = clock or boss.clock
        self.transport: Transport = transport or PostgresTransport(boss)
        self.store = IngestStore(boss.db)
        self.dedupe: DoneStore = dedupe or PostgresDoneStore(self.store, clock=self.clock)
        self.config = RuntimeConfig(self.store, clock=self.clock)
        self.mode_key = mode_key
        self._admit: dict[str, tuple[bool, float]] = {}

    async def start(self) -> None:
        await self.transport.start()

    async def close(self) -> None:
        await self.dedupe.close()
        await self.transport.close()

    # -- producing -----------------------------------------------------------

    def envelope(self, topic: Topic[T], body: T, *, id: str | None = None) -> Envelope:
        return new_envelope(topic.encode(body), published_at=self.clock.now(), id=id)

    async def publish(
        self, topic: Topic[T], body: T, *, id: str | None = None, conn: AsyncConn | None = None
    ) -> str:
        """Publish one message; its id. Raises :class:`PublishError` when not stored."""
        (message_id,) = await self.publish_many(
            topic, [body], ids=None if id is None else [id], conn=conn
        )
        return message_id

    async def publish_many(
        self,
        topic: Topic[T],
        bodies: Sequence[T],
        *,
        ids: Sequence[str] | None = None,
        conn: AsyncConn | None = None,
    ) -> list[str]:
        """Publish many messages at once; all are stored or :class:`PublishError` is raised.

        ``conn`` (postgres transport only) publishes inside the caller's
        transaction: the messages exist exactly when the caller's writes do.
        """
        if ids is not None and len(ids) != len(bodies):
            raise InvalidInput("ids", f"has {len(ids)} ids for {len(bodies)} bodies")
        envelopes = [
            self.envelope(topic, body, id=None if ids is None else ids[i])
            for i, body in enumerate(bodies)
        ]
        await self._send(topic.name, envelopes, conn)
        return [e.id for e in envelopes]

    async def _send(
        self, topic: str, envelopes: Sequence[Envelope], conn: AsyncConn | None
    ) -> None:
        if conn is not None:
            if not isinstance(self.transport, PostgresTransport):
                raise InvalidInput(
                    "conn", "publishing in a transaction needs the postgres transport"
                )
            await self.transport.publish(topic, envelopes, conn=conn)
        else:
            await self.transport.publish(topic, envelopes)

    async def mode(self) -> Mode:
        mode = await self.config.get(self.mode_key, DEFAULT_MODE)
        return "async" if mode == "async" else "sync"

    async def submit(
        self,
        topic: Topic[T],
        body: T,
        apply: Apply[T],
        *,
        id: str | None = None,
        mode: Mode | None = None,
        give_up_after: timedelta = SUBMIT_PATIENCE,
    ) -> Submitted:
        """Apply in place (``sync``) or publish (``async``); never drop the message.

        ``mode`` overrides the configured mode for this one message (a priority
        item stays on the sync path). What happened comes back as
        :class:`Submitted`:

        - ``applied``: applied in place, by ``apply``;
        - ``published``: on the topic, for its consumers;
        - ``degraded``: async mode, but the publish failed, so it was applied
          in place (with a WARN);
        - ``handed_off``: the in-place apply failed with a retryable error (a
          statement timeout, no connection free in time), so the message was
          published instead and a consumer retries it on the delay ladder.
          The reference lost these writes; here they arrive late instead.

        When neither path works (the transport down and the in-place apply
        timing out), both are tried again, with pauses from 0.25 s doubling
        to 5 s, for up to ``give_up_after`` (30 s): a short outage of the
        broker during a database overload holds the producer instead of
        losing the message. After that the last error is raised, as is a
        business error of ``apply`` at once.
        """
        envelope = self.envelope(topic, body, id=id)
        give_up_at = self.clock.monotonic() + give_up_after.total_seconds()
        pause = SUBMIT_RETRY_FIRST
        rounds = 1
        while True:
            try:
                done = await self._submit_once(topic, envelope, apply, mode)
                return done if rounds == 1 else dataclasses.replace(done, rounds=rounds)
            except Exception as exc:
                if not is_retryable(exc):
                    raise
                if self.clock.monotonic() + pause > give_up_at:
                    log.error(
                        "topic %s: %s neither applied nor published for %s (%s); giving up",
                        topic.name,
                        envelope.id,
                        give_up_after,
                        exc,
                    )
                    raise
                log.warning(
                    "topic %s: %s neither applied nor published (%s); trying again in %.1f s",
                    topic.name,
                    envelope.id,
                    exc,
                    pause,
                )
            await self.clock.sleep(pause)
            pause = min(pause * 2, SUBMIT_RETRY_MAX)
            rounds += 1

    async def _submit_once(
        self, topic: Topic[T], envelope: Envelope, apply: Apply[T], mode: Mode | None
    ) -> Submitted:
        chosen = mode or await self.mode()
        if chosen == "async":
            try:
                await self._send(topic.name, [envelope], None)
                return Submitted(envelope.id, "published")
            except PublishError as exc:
                log.warning(
                    "topic %s: publish of %s failed (%s); applying it synchronously",
                    topic.name,
                    envelope.id,
                    exc,
                )
                await self.apply_now(topic, envelope, apply)
                return Submitted(envelope.id, "degraded")
        try:
            await self.apply_now(topic, envelope, apply)
            return Submitted(envelope.id, "applied")
        except Exception as exc:
            if not is_retryable(exc):
                raise
            try:
                await self._send(topic.name, [envelope], None)
            except PublishError:
                raise exc from None
            log.warning(
                "topic %s: in-place apply of %s failed (%s); handed to the topic",
                topic.name,
                envelope.id,
                exc,
            )
            return Submitted(envelope.id, "handed_off", error=exc)

    async def apply_now(self, topic: Topic[T], envelope: Envelope, apply: Apply[T]) -> None:
        """The sync path: the same apply and done-marker as a consumer, with no transport."""
        message = Message(
            id=envelope.id,
            topic=topic.name,
            body=topic.decode(envelope.body),
            published_at=envelope.published_at,
            attempt=1,
        )
        await apply(message)
        try:
            await self.dedupe.mark(envelope.id)
        except Exception as exc:
            log.warning("topic %s: done-marker of %s not written: %s", topic.name, envelope.id, exc)

    async def admit(self, topic: Topic[Any] | str) -> bool:
        """False while the backlog monitor has paused ``topic``: take no new work then."""
        name = topic if isinstance(topic, str) else topic.name
        cached = self._admit.get(name)
        now = self.clock.monotonic()
        if cached is not None and now - cached[1] < ADMIT_CACHE.total_seconds():
            return cached[0]
        try:
            admitted = not await self.store.paused(name)
        except Exception as exc:
            log.warning("topic %s: pause flag unreadable (%s); admitting", name, exc)
            admitted = True
        self._admit[name] = (admitted, now)
        return admitted

    # -- consuming -----------------------------------------------------------

    def consumer(self, topic: Topic[T], apply: Apply[T], **options: Any) -> Consumer[T]:
        options.setdefault("dedupe", self.dedupe)
        return Consumer(self.transport, topic, apply, store=self.store, clock=self.clock, **options)

    def batch_consumer(
        self, topic: Topic[T], write: WriteBatch[T], **options: Any
    ) -> BatchConsumer[T]:
        return BatchConsumer(
            self.transport, topic, write, store=self.store, clock=self.clock, **options
        )

    def monitor(self, topics: Sequence[tuple[str, str]], **options: Any) -> BacklogMonitor:
        return BacklogMonitor(self.transport, self.store, topics, clock=self.clock, **options)

    # -- operating -----------------------------------------------------------

    async def redrive(self, topic: str, *, limit: int = 10_000) -> int:
        """Publish ``topic``'s waiting dead letters again; how many.

        The letters are marked redriven in the same transaction that publishes
        them (postgres transport) or that commits only after the transport
        confirmed them (nats): a failed publish leaves them waiting.
        """

        async def run(conn: AsyncConn) -> int:
            texts = await self.store.take_dead_letters(
                conn, topic, limit=limit, now=self.clock.sql_now()
            )
            envelopes = [Envelope.decode(t) for t in texts]
            if envelopes:
                if isinstance(self.transport, PostgresTransport):
                    await self.transport.publish(topic, envelopes, conn=conn)
                else:
                    await self.transport.publish(topic, envelopes)
            return len(envelopes)

        return await self.boss.db.run(run)


def check_connection_budget(
    *, pool_size: int, consumers: int, writers: int, reserve: int = DEFAULT_CONNECTION_RESERVE
) -> bool:
    """Decision D12: consumer slots + batch writers must fit in the pool minus a reserve.

    Logs ERROR (and returns False) when they do not; the caller starts anyway.
    """
    need = consumers + writers
    if need > pool_size - reserve:
        log.error(
            "connection budget: %d consumer slots + %d batch writers = %d, over the pool of %d "
            "minus a reserve of %d (= %d); applies will queue for connections and time out",
            consumers,
            writers,
            need,
            pool_size,
            reserve,
            pool_size - reserve,
        )
        return False
    log.info(
        "connection budget: %d of %d (pool %d, reserve %d)",
        need,
        pool_size - reserve,
        pool_size,
        reserve,
    )
    return True
