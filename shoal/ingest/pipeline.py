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
consumer retries it, instead of losing it. When neither path works for
``spool_after`` (5 s), a pipeline with a ``spool_dir`` appends the message to
its on-disk spool (fsynced) and a replayer hands it on once a path works
again; without a spool, or with the spool full, ``submit`` holds the
producer until a path works. No timeout drops a message.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, TypeVar

from shoal.clock import Clock
from shoal.db.pool import AsyncConn
from shoal.errors import InvalidInput, ShoalError
from shoal.ingest.batch_consumer import BatchConsumer
from shoal.ingest.config import DEFAULT_MODE, RuntimeConfig
from shoal.ingest.consumer import Apply, Consumer, WriteBatch
from shoal.ingest.dedupe import DoneStore, PostgresDoneStore
from shoal.ingest.message import Envelope, Message, Topic, new_envelope
from shoal.ingest.monitor import BacklogMonitor
from shoal.ingest.postgres import PostgresTransport
from shoal.ingest.retry import is_retryable
from shoal.ingest.spool import DEFAULT_SPOOL_MAX_BYTES, Spool, SpoolEntry, SpoolStats
from shoal.ingest.store import IngestStore
from shoal.ingest.transport import PublishError, Transport
from shoal.queue.client import Shoal

T = TypeVar("T")
log = logging.getLogger("shoal.ingest")

Mode = Literal["sync", "async"]
Route = Literal["applied", "published", "handed_off", "degraded", "spooled"]

DEFAULT_MODE_KEY = "ingest.mode"
# Connections kept out of the ingest budget for the worker's own loops (claims,
# completions, schedules, maintenance, the backlog monitor): a quarter of the
# pool, at least MIN_CONNECTION_RESERVE. A fixed reserve (once 20, the
# reference's for a pool of 60) exceeded the default pool of 10 by itself.
MIN_CONNECTION_RESERVE = 2
# Submit, when neither apply nor publish works: the pauses between tries of both;
SUBMIT_RETRY_FIRST = 0.25
SUBMIT_RETRY_MAX = 5.0
# how long to try before spooling the message (with a spool): long enough that a
# blip (a pool briefly exhausted, a broker reconnecting) costs no disk write, short
# enough that a producer's slot is not held through an outage;
SPOOL_AFTER = timedelta(seconds=5)
# and, without a spool or with the spool full, when holding the producer is logged
# at ERROR (once per message; the tries go on).
HELD_LOUD_AFTER = timedelta(seconds=30)
# The replayer: messages handed on per round (one publish per topic), and its pauses
# while neither path works.
REPLAY_BATCH = 200
REPLAY_RETRY_FIRST = 0.5
REPLAY_RETRY_MAX = 5.0
# How long producers may act on a pause flag they read.
ADMIT_CACHE = timedelta(seconds=1)


@dataclass(frozen=True, slots=True)
class Submitted:
    """What :meth:`Pipeline.submit` did with one message (see there)."""

    id: str
    route: Route
    error: BaseException | None = None  # the in-place apply's error (handed off, spooled)
    rounds: int = 1  # more than 1: neither path worked at first (see submit)


class PipelineClosed(ShoalError):
    """A submit held (neither path working) when its pipeline closed: not taken."""


class Pipeline:
    def __init__(
        self,
        boss: Shoal,
        transport: Transport | None = None,
        *,
        dedupe: DoneStore | None = None,
        mode_key: str = DEFAULT_MODE_KEY,
        clock: Clock | None = None,
        spool_dir: Path | str | None = None,
        spool_max_bytes: int = DEFAULT_SPOOL_MAX_BYTES,
        spool_after: timedelta = SPOOL_AFTER,
    ) -> None:
        """``spool_dir``: where :meth:`submit` keeps messages neither path took (see there).

        One process per spool directory; a producer started again on the same
        directory replays what the previous one left.
        """
        self.boss = boss
        self.clock = clock or boss.clock
        self.transport: Transport = transport or PostgresTransport(boss)
        self.store = IngestStore(boss.db)
        self.dedupe: DoneStore = dedupe or PostgresDoneStore(self.store, clock=self.clock)
        self.config = RuntimeConfig(self.store, clock=self.clock)
        self.mode_key = mode_key
        self._admit: dict[str, tuple[bool, float]] = {}
        if spool_after < timedelta(0):
            raise InvalidInput("spool_after", f"{spool_after}: must not be negative")
        self.spool_after = spool_after
        self.spool: Spool | None = (
            None
            if spool_dir is None
            else Spool(Path(spool_dir), clock=self.clock, max_bytes=spool_max_bytes)
        )
        # Topic name -> (topic, apply) of this process's submits: how the replayer
        # applies a spooled message in place while the broker is down. Written by
        # submit, read by the replayer.
        self._applies: dict[str, tuple[Topic[Any], Apply[Any]]] = {}
        self._replayer: asyncio.Task[None] | None = None
        # Submits holding their producer (neither path, nothing spooled): written by
        # submit, read by admit.
        self._held = 0
        # Set by close: a held submit stops trying (its pool is going away too).
        self._closed = False

    async def start(self) -> None:
        """Open the spool (with a ``spool_dir``), start its replayer, then the transport.

        A start that fails (the broker unreachable, say) stops the replayer and
        closes the spool before it raises: the spool's lock is not left held, so
        a later start on the same pipeline or directory opens it again.
        """
        if self.spool is not None:
            await self.spool.open()
            self._replayer = asyncio.create_task(self._replay())
        try:
            await self.transport.start()
        except BaseException:
            await self._stop_spool()
            raise

    async def _stop_spool(self) -> None:
        if self._replayer is not None:
            self._replayer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replayer
            self._replayer = None
        if self.spool is not None:
            if len(self.spool):
                log.warning(
                    "spool %s: %d messages still waiting; the next start on it replays them",
                    self.spool.directory,
                    len(self.spool),
                )
            await self.spool.close()

    async def close(self) -> None:
        self._closed = True
        await self._stop_spool()
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
        if conn is not None and not self.transport.in_database:
            raise InvalidInput("conn", "publishing in a transaction needs the postgres transport")
        await self.transport.publish(topic, envelopes, conn=conn)

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
          The reference lost these writes; here they arrive late instead;
        - ``spooled``: neither path worked for ``spool_after`` (5 s); the
          message is in the pipeline's spool on disk (fsynced), and its
          replayer publishes it (or, while the broker is down, applies it in
          place) once a path works. Only with a ``spool_dir``.

        When neither path works, both are tried again, with pauses from
        0.25 s doubling to 5 s. Past ``spool_after`` the message is spooled.
        Without a spool, or while the spool is full, the tries go on for as
        long as it takes: the producer is held (and :meth:`admit` says to take
        no new work) rather than the message dropped, with an ERROR after
        30 s. A business error of ``apply`` is raised at once.
        """
        envelope = self.envelope(topic, body, id=id)
        if self.spool is not None and topic.name not in self._applies:
            self._applies[topic.name] = (topic, apply)
        started = self.clock.monotonic()
        pause = SUBMIT_RETRY_FIRST
        rounds = 1
        held = loud = False
        try:
            while True:
                try:
                    done = await self._submit_once(topic, envelope, apply, mode)
                    return done if rounds == 1 else dataclasses.replace(done, rounds=rounds)
                except Exception as exc:
                    if not is_retryable(exc):
                        raise
                    if self._closed:
                        # The producer is shutting down and its pool with it: tries
                        # would fail for good, in a task nobody may await any more.
                        # The caller learns the message was not taken.
                        log.error(
                            "topic %s: %s neither applied nor published when the pipeline "
                            "closed (%s)",
                            topic.name,
                            envelope.id,
                            exc,
                        )
                        raise PipelineClosed(
                            f"topic {topic.name}: {envelope.id} was neither applied nor "
                            "published before the pipeline closed"
                        ) from exc
                    waited = self.clock.monotonic() - started
                    if waited >= self.spool_after.total_seconds():
                        spooled = await self._spool(topic, envelope, mode, exc, rounds, waited)
                        if spooled is not None:
                            return spooled
                        if not loud and waited >= HELD_LOUD_AFTER.total_seconds():
                            loud = True
                            log.error(
                                "topic %s: %s neither applied nor published for %.0f s (%s); "
                                "%s, so the producer is held until a path works",
                                topic.name,
                                envelope.id,
                                waited,
                                exc,
                                "no spool" if self.spool is None else "the spool is full",
                            )
                    if not held:
                        held = True
                        self._held += 1
                    if not loud:
                        log.warning(
                            "topic %s: %s neither applied nor published (%s); "
                            "trying again in %.1f s",
                            topic.name,
                            envelope.id,
                            exc,
                            pause,
                        )
                await self.clock.sleep(pause)
                pause = min(pause * 2, SUBMIT_RETRY_MAX)
                rounds += 1
        finally:
            if held:
                self._held -= 1

    async def _spool(
        self,
        topic: Topic[T],
        envelope: Envelope,
        mode: Mode | None,
        error: Exception,
        rounds: int,
        waited: float,
    ) -> Submitted | None:
        """Put ``envelope`` in the spool; None when there is none, it is full or the disk failed."""
        if self.spool is None or self.spool.full:
            return None
        try:
            await self.spool.put(
                topic.name,
                envelope,
                mode=mode,
                reason=f"{type(error).__name__}: {error}",
                rounds=rounds,
            )
        except OSError as exc:
            log.error(
                "topic %s: %s could not be spooled (%s); holding the producer instead",
                topic.name,
                envelope.id,
                exc,
            )
            return None
        log.warning(
            "topic %s: %s neither applied nor published for %.1f s (%s); spooled to disk",
            topic.name,
            envelope.id,
            waited,
            error,
        )
        return Submitted(envelope.id, "spooled", error=error, rounds=rounds)

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
        """False when new work could not be kept: take none then.

        That is while the backlog monitor has paused ``topic``, while the
        spool is full, and (without a spool) while a submit is held because
        neither path works.
        """
        if self.spool is not None and self.spool.full:
            return False
        if self.spool is None and self._held:
            return False
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

    # -- the spool -----------------------------------------------------------

    def spool_stats(self) -> SpoolStats | None:
        """What waits in the spool (None without one)."""
        return None if self.spool is None else self.spool.stats()

    async def replay_once(self) -> int:
        """Hand the oldest spooled messages on; how many left the spool.

        Per topic, one publish of up to 200 messages; when the publish fails
        and this process has submitted to the topic, each message is applied
        in place instead (the apply is the consumer's, so idempotent). A
        message leaves the spool only after that succeeded; a crash in
        between hands it on again, and its id absorbs the replay (the
        done-marker, the broker's duplicate window). A business error of the
        in-place apply leaves it for the publish, whose consumer dead-letters
        it.
        """
        spool = self.spool
        if spool is None or not len(spool):
            return 0
        by_topic: dict[str, list[SpoolEntry]] = {}
        for entry in spool.entries(REPLAY_BATCH):
            by_topic.setdefault(entry.topic, []).append(entry)
        moved = 0
        for name, entries in by_topic.items():
            try:
                await self._send(name, [e.envelope for e in entries], None)
            except Exception as exc:
                if not is_retryable(exc):
                    raise
                log.warning("spool: publish of %d to %s failed: %s", len(entries), name, exc)
            else:
                moved += await spool.remove([e.envelope.id for e in entries])
                continue
            registered = self._applies.get(name)
            if registered is None:
                continue
            topic, apply = registered
            for entry in entries:
                try:
                    await self.apply_now(topic, entry.envelope, apply)
                except Exception as exc:
                    if is_retryable(exc):
                        log.warning("spool: apply of %s failed: %s", entry.envelope.id, exc)
                        break
                    log.warning(
                        "spool: %s failed in place with a business error (%s); "
                        "kept for the topic's consumer",
                        entry.envelope.id,
                        exc,
                    )
                    continue
                moved += await spool.remove([entry.envelope.id])
        if moved:
            log.info("spool: %d handed on, %d waiting", moved, len(spool))
        return moved

    async def _replay(self) -> None:
        """While the spool holds messages, replay_once, pausing while nothing moves."""
        assert self.spool is not None
        pause = REPLAY_RETRY_FIRST
        while True:
            if not len(self.spool):
                self.spool.changed.clear()
                await self.spool.changed.wait()
                pause = REPLAY_RETRY_FIRST
                continue
            try:
                moved = await self.replay_once()
            except Exception as exc:  # a loop boundary: the messages stay spooled
                log.error("spool: replay round failed: %s: %s", type(exc).__name__, exc)
                moved = 0
            if moved:
                pause = REPLAY_RETRY_FIRST
                continue
            await self.clock.sleep(pause)
            pause = min(pause * 2, REPLAY_RETRY_MAX)

    # -- consuming -----------------------------------------------------------

    def consumer(self, topic: Topic[T], apply: Apply[T], **options: Any) -> Consumer[T]:
        options.setdefault("dedupe", self.dedupe)
        options.setdefault("hooks", self.boss.hooks)
        return Consumer(self.transport, topic, apply, store=self.store, clock=self.clock, **options)

    def batch_consumer(
        self, topic: Topic[T], write: WriteBatch[T], **options: Any
    ) -> BatchConsumer[T]:
        options.setdefault("hooks", self.boss.hooks)
        return BatchConsumer(
            self.transport, topic, write, store=self.store, clock=self.clock, **options
        )

    def monitor(self, topics: Sequence[tuple[str, str]], **options: Any) -> BacklogMonitor:
        options.setdefault("hooks", self.boss.hooks)
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
                # In this transaction where the transport can join it.
                joined = conn if self.transport.in_database else None
                await self.transport.publish(topic, envelopes, conn=joined)
            return len(envelopes)

        return await self.boss.db.run(run)


def default_connection_reserve(pool_size: int) -> int:
    """The reserve of a pool of ``pool_size`` when none is set: a quarter, at least 2."""
    return max(MIN_CONNECTION_RESERVE, pool_size // 4)


def pool_size_for(need: int, *, reserve: int | None = None) -> int:
    """The smallest pool in which ``need`` ingest connections fit beside the reserve."""
    size = need + (MIN_CONNECTION_RESERVE if reserve is None else reserve)
    while need > size - (default_connection_reserve(size) if reserve is None else reserve):
        size += 1
    return size


def check_connection_budget(
    *, pool_size: int, consumers: int, writers: int, reserve: int | None = None
) -> bool:
    """Decision D12: consumer slots + batch writers must fit in the pool minus a reserve.

    The reserve defaults to :func:`default_connection_reserve` of the pool.
    Logs ERROR, saying what to change (and returns False) when they do not fit;
    the caller starts anyway.
    """
    kept = default_connection_reserve(pool_size) if reserve is None else reserve
    need = consumers + writers
    if need > pool_size - kept:
        log.error(
            "connection budget: %d consumer slots + %d batch writers = %d, over the pool of %d "
            "minus a reserve of %d (= %d); applies will queue for connections and time out. "
            "Raise the pool to %d (shoal worker --pool-size or SHOAL_POOL_SIZE; "
            "Shoal.connect(max_size=...)), or lower the consumers' concurrency and the "
            "sinks' writers to %d in all",
            consumers,
            writers,
            need,
            pool_size,
            kept,
            pool_size - kept,
            pool_size_for(need, reserve=reserve),
            max(pool_size - kept, 0),
        )
        return False
    log.info(
        "connection budget: %d of %d (pool %d, reserve %d)",
        need,
        pool_size - kept,
        pool_size,
        kept,
    )
    return True
