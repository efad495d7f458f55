"""Consumers: a fixed number of applies in flight, whatever the producers do.

:class:`Consumer` applies one message at a time per slot (30 slots by
default). :class:`BatchConsumer` buffers messages and writes them in batches
(by default: flush at 200 or after 1 s, one writer). Both take their
messages from a :class:`Transport`, so the same code runs on the postgres
and the nats transports.

What happens to a delivery:

- already marked done (de-duplication): acknowledged, not applied;
- another delivery of the same id in hand (a message published twice, a
  redelivery while the first is still applied): it waits for that one to
  finish, then goes through these cases itself (:class:`Consumer`);
- applied without error: marked done, then acknowledged;
- a retryable error: delivered again after the delay ladder's wait for this
  attempt, without limit (ERROR logged from attempt 10), unless a
  ``retry_limit`` is set, past which it is dead-lettered;
- any other error is a business error: acknowledged, logged as WARN, and kept
  in the dead-letter table so it can be replayed after a fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Generic, TypeVar

from shoal._deprecation import check_retry_limit, retry_limit_from_max_attempts, warn_renamed
from shoal.clock import SYSTEM_CLOCK, Clock
from shoal.errors import InvalidInput
from shoal.hooks import Hooks
from shoal.ingest.dedupe import DoneStore
from shoal.ingest.message import Message, Topic
from shoal.ingest.retry import DELAY_LADDER, LOUD_FROM_ATTEMPT, is_retryable, redelivery_delay
from shoal.ingest.store import IngestStore
from shoal.ingest.transport import Delivery, Subscription, Transport

T = TypeVar("T")
log = logging.getLogger("shoal.ingest")

DEFAULT_CONCURRENCY = 30
DEFAULT_GROUP = "shoal"
DEFAULT_BATCH_SIZE = 200
DEFAULT_MAX_WAIT = timedelta(seconds=1)
DEFAULT_BATCH_IN_FLIGHT = 500
# How long an idle consumer waits for a message before asking again.
FETCH_WAIT = timedelta(seconds=1)
# A consumer writes the lag of what it applies at most this often.
WAIT_RECORD_EVERY = timedelta(seconds=5)

Apply = Callable[[Message[T]], Awaitable[None]]
WriteBatch = Callable[[list[Message[T]]], Awaitable[None]]


@dataclass(slots=True)
class ConsumerStats:
    applied: int = 0
    duplicates: int = 0
    redelivered: int = 0
    business_errors: int = 0
    dead_lettered: int = 0
    batches: int = 0
    splits: int = 0


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(name, f"must be an integer >= 1, got {value!r}")
    return value


class _Base(Generic[T]):
    """What both consumers share: the subscription, settling deliveries, lag records."""

    def __init__(
        self,
        transport: Transport,
        topic: Topic[T],
        *,
        store: IngestStore,
        group: str,
        poll: timedelta,
        max_in_flight: int,
        retryable: tuple[type[BaseException], ...],
        retry_limit: int | None,
        max_attempts: int | None,
        ladder: Sequence[timedelta],
        ack_wait: timedelta,
        clock: Clock,
        hooks: Hooks | None,
    ) -> None:
        # Past the cap (None: none), a retryable failure is dead-lettered.
        retry_limit = retry_limit_from_max_attempts(retry_limit, max_attempts, stacklevel=3)
        check_retry_limit(retry_limit)
        self.transport = transport
        self.topic = topic
        self.store = store
        self.group = group
        self.poll = poll
        self.max_in_flight = _positive("max_in_flight", max_in_flight)
        self.retryable = retryable
        self.retry_limit = retry_limit
        self.ladder = tuple(ladder)
        self.ack_wait = ack_wait
        self.clock = clock
        # Observers of applied and failed messages (shoal.testing.Probe).
        self.hooks = hooks if hooks is not None else Hooks()
        self.stats = ConsumerStats()
        self._last_wait_record = -WAIT_RECORD_EVERY.total_seconds()
        self._background: set[asyncio.Task[None]] = set()

    @property
    def max_attempts(self) -> int | None:
        """Deprecated: ``retry_limit + 1``."""
        warn_renamed("max_attempts", "retry_limit")
        return None if self.retry_limit is None else self.retry_limit + 1

    async def _subscribe(self, stop: asyncio.Event) -> Subscription | None:
        """Subscribe, retrying while the transport is unreachable; None once ``stop`` is set."""
        while not stop.is_set():
            try:
                return await self.transport.subscribe(
                    self.topic.name,
                    self.group,
                    max_in_flight=self.max_in_flight,
                    ack_wait=self.ack_wait,
                )
            except Exception as exc:
                log.warning("topic %s: cannot subscribe yet: %s", self.topic.name, exc)
                await sleep_or_stop(stop, 1.0, self.clock)
        return None

    def _message(self, delivery: Delivery) -> Message[T]:
        envelope = delivery.envelope
        return Message(
            id=envelope.id,
            topic=self.topic.name,
            body=self.topic.decode(envelope.body),
            published_at=envelope.published_at,
            attempt=delivery.attempt,
        )

    def _note_applied(self, delivery: Delivery) -> None:
        """Keep the topic's wait time (now - published_at) fresh, without a write per message."""
        self.stats.applied += 1
        if self.hooks:
            self.hooks.emit(
                "message_applied",
                self.topic.name,
                message_id=delivery.envelope.id,
                attempt=delivery.attempt,
            )
        mono = self.clock.monotonic()
        if mono - self._last_wait_record < WAIT_RECORD_EVERY.total_seconds():
            return
        self._last_wait_record = mono
        wait = self.clock.now() - delivery.envelope.published_at
        self._spawn(self.store.record_wait(self.topic.name, wait, now=self.clock.sql_now()))

    def _report_failed(self, delivery: Delivery, settled: str) -> None:
        if self.hooks:
            self.hooks.emit(
                "message_failed",
                self.topic.name,
                message_id=delivery.envelope.id,
                attempt=delivery.attempt,
                settled=settled,
            )

    def _spawn(self, work: Awaitable[None]) -> None:
        async def run() -> None:
            try:
                await work
            except Exception as exc:
                log.warning("topic %s: background write failed: %s", self.topic.name, exc)

        task = asyncio.create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _retry_or_dead(self, delivery: Delivery, error: BaseException) -> None:
        """A retryable failure: redeliver on the ladder, or dead-letter past the cap."""
        attempt = delivery.attempt
        message_id = delivery.envelope.id
        if self.retry_limit is not None and attempt > self.retry_limit:
            await self._dead(delivery, "attempts", error)
            await delivery.term()
            self._report_failed(delivery, "dead")
            return
        delay = redelivery_delay(attempt, self.ladder)
        level = logging.ERROR if attempt >= LOUD_FROM_ATTEMPT else logging.WARNING
        log.log(
            level,
            "topic %s message %s attempt %d failed (%s: %s); redelivering in %s",
            self.topic.name,
            message_id,
            attempt,
            type(error).__name__,
            error,
            delay,
        )
        self.stats.redelivered += 1
        await delivery.nak(delay)
        self._report_failed(delivery, "retry")

    async def _business(self, delivery: Delivery, error: BaseException) -> None:
        log.warning(
            "topic %s message %s dropped, business error (%s: %s); kept in the dead-letter table",
            self.topic.name,
            delivery.envelope.id,
            type(error).__name__,
            error,
        )
        self.stats.business_errors += 1
        await self._dead(delivery, "business", error)
        await delivery.ack()
        self._report_failed(delivery, "business")

    async def _dead(self, delivery: Delivery, reason: str, error: BaseException) -> None:
        envelope = delivery.envelope
        letter = (envelope.id, envelope.encode().decode(), _describe(error), delivery.attempt)
        await self.store.dead_letter(self.topic.name, reason, [letter], now=self.clock.sql_now())
        self.stats.dead_lettered += 1

    async def _settle_failure(self, delivery: Delivery, error: BaseException) -> None:
        try:
            if is_retryable(error, self.retryable):
                await self._retry_or_dead(delivery, error)
            else:
                await self._business(delivery, error)
        except Exception as exc:
            # The transport or the database is down: the delivery will come
            # back after its ack wait, which is what a nak would have done.
            log.warning("topic %s: could not settle a failed delivery: %s", self.topic.name, exc)

    async def _drain_background(self) -> None:
        # Until none is left: an ack finishing here may start a wait record.
        while pending := [task for task in self._background if not task.done()]:
            await asyncio.gather(*pending, return_exceptions=True)


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


class Consumer(_Base[T]):
    """Runs ``apply(message)`` for each message of ``topic``, ``concurrency`` at a time.

    >>> consumer = Consumer(transport, readings, apply_reading, store=store)  # doctest: +SKIP
    >>> await consumer.run(stop)                                              # doctest: +SKIP
    """

    def __init__(
        self,
        transport: Transport,
        topic: Topic[T],
        apply: Apply[T],
        *,
        store: IngestStore,
        dedupe: DoneStore | None = None,
        group: str = DEFAULT_GROUP,
        concurrency: int = DEFAULT_CONCURRENCY,
        max_in_flight: int | None = None,
        retryable: tuple[type[BaseException], ...] = (),
        retry_limit: int | None = None,
        max_attempts: int | None = None,  # deprecated: retry_limit + 1
        ladder: Sequence[timedelta] = DELAY_LADDER,
        ack_wait: timedelta = timedelta(minutes=5),
        poll: timedelta = FETCH_WAIT,
        clock: Clock = SYSTEM_CLOCK,
        hooks: Hooks | None = None,
    ) -> None:
        if max_in_flight is not None and max_in_flight < concurrency:
            raise InvalidInput("max_in_flight", f"must be >= concurrency ({concurrency})")
        super().__init__(
            transport,
            topic,
            store=store,
            group=group,
            poll=poll,
            max_in_flight=max_in_flight or 4 * _positive("concurrency", concurrency),
            retryable=retryable,
            retry_limit=retry_limit,
            max_attempts=max_attempts,
            ladder=ladder,
            ack_wait=ack_wait,
            clock=clock,
            hooks=hooks,
        )
        self.apply = apply
        self.dedupe = dedupe
        self.concurrency = concurrency

    async def run(self, stop: asyncio.Event, *, grace: timedelta = timedelta(seconds=30)) -> None:
        """Consume until ``stop`` is set; then let running applies finish within ``grace``.

        ``concurrency`` slots take deliveries from a local buffer, which the
        fetch loop refills in batches once it is down to half of
        ``max_in_flight`` (4 x concurrency by default, as Celery's prefetch
        multiplier): one claim per batch, never one per finished apply.
        """
        sub = await self._subscribe(stop)
        if sub is None:
            return
        ready: asyncio.Queue[Delivery | None] = asyncio.Queue()
        room = asyncio.Event()
        held = 0  # buffered, being applied, or waiting behind another copy of its id
        # The ids of the deliveries buffered or being applied, each with the
        # later copies of that id fetched meanwhile (a message published twice,
        # a redelivery while the first is still in hand). The done-marker check
        # of a fetch cannot tell such copies apart: none of them has a marker
        # yet. So a copy waits for the first to finish and is then checked
        # again: acknowledged as a duplicate when the first was applied,
        # applied itself when the first failed. Written by the fetch loop and
        # the slots, each time without an await between reading and writing.
        in_hand: dict[str, list[Delivery]] = {}

        def release(count: int) -> None:
            nonlocal held
            held -= count
            if held <= self.max_in_flight // 2:
                room.set()

        async def take(deliveries: Sequence[Delivery]) -> None:
            """Queue the first copy of each id that is neither in hand nor marked done."""
            firsts: list[Delivery] = []
            for delivery in deliveries:
                copies = in_hand.get(delivery.envelope.id)
                if copies is None:
                    in_hand[delivery.envelope.id] = []
                    firsts.append(delivery)
                else:
                    copies.append(delivery)
            fresh = {d.envelope.id for d in await self._unseen(sub, firsts)}
            for delivery in firsts:
                if delivery.envelope.id in fresh:
                    ready.put_nowait(delivery)
                else:  # acknowledged as a duplicate
                    release(1)
                    await finished(delivery)

        async def finished(delivery: Delivery) -> None:
            """``delivery`` is settled (and marked, if applied): its copies' turn."""
            copies = in_hand.pop(delivery.envelope.id, [])
            if copies:
                await take(copies)

        async def put_back() -> None:
            """Deliveries not yet started go back at once rather than after their ack wait."""
            unstarted: list[Delivery] = []
            while not ready.empty():
                delivery = ready.get_nowait()
                if delivery is not None:
                    unstarted.append(delivery)
            for copies in in_hand.values():
                unstarted.extend(copies)
                copies.clear()
            for delivery in unstarted:
                with contextlib.suppress(Exception):
                    await delivery.nak(timedelta(0))
            release(len(unstarted))

        # An applied delivery's ack (with its done-marker) goes on while its
        # slot applies the next one: the slot would otherwise wait a second
        # commit per message, the ack's, and run at half the rate of the
        # applies alone. The slot leaves the delivery in `to_ack`; the acker
        # acks all that have gathered there in one `ack_many` (one statement
        # on postgres), no task or future per message, and while it writes,
        # the next ones gather. At most `concurrency` acks wait at once; each
        # delivery stays held (in max_in_flight, its copies waiting) until
        # its ack is written. A crash before then is a crash between an apply
        # and its ack, as before: the message is delivered again. A stopping
        # consumer lets the acker finish before it closes its subscription.
        acks_room = asyncio.Semaphore(self.concurrency)
        to_ack: list[Delivery] = []
        acks_wanted = asyncio.Event()  # set by a slot that left an ack, and to stop
        closing = False

        async def settled(delivery: Delivery) -> None:
            release(1)
            await finished(delivery)  # never raises: _unseen does not

        async def acker() -> None:
            while to_ack or not closing:
                if not to_ack:
                    acks_wanted.clear()
                    await acks_wanted.wait()
                    continue
                batch = to_ack[:]
                to_ack.clear()
                await self._ack_applied(sub, batch)  # never raises
                for delivery in batch:
                    acks_room.release()
                    await settled(delivery)

        async def slot() -> None:
            while (delivery := await ready.get()) is not None:
                applied = False
                try:
                    applied = await self._apply(delivery)
                except Exception:
                    # Loop boundary: a slot that died would hold its share of
                    # max_in_flight for good, and with every slot gone the
                    # fetch loop would wait for room forever. The delivery
                    # comes back after its ack wait.
                    log.exception(
                        "topic %s message %s: unexpected error in a consumer slot",
                        self.topic.name,
                        delivery.envelope.id,
                    )
                if not applied:
                    await settled(delivery)
                    continue
                await acks_room.acquire()
                to_ack.append(delivery)
                acks_wanted.set()

        acking = asyncio.create_task(acker())
        slots = [asyncio.create_task(slot()) for _ in range(self.concurrency)]
        try:
            while not stop.is_set():
                if held > self.max_in_flight // 2:
                    room.clear()
                    await _wait_either(room, stop)
                    continue
                try:
                    deliveries = await sub.fetch(self.max_in_flight - held, wait=self.poll)
                except Exception as exc:
                    log.warning("topic %s: fetch failed: %s", self.topic.name, exc)
                    await sleep_or_stop(stop, 1.0, self.clock)
                    continue
                if self.hooks:
                    self.hooks.emit("fetched", self.topic.name, count=len(deliveries))
                held += len(deliveries)
                await take(deliveries)
        finally:
            await put_back()
            for _ in slots:
                ready.put_nowait(None)
            _, late = await asyncio.wait(slots, timeout=grace.total_seconds())
            for task in late:  # their deliveries come back after the ack wait
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
            closing = True
            acks_wanted.set()
            await acking
            await put_back()  # copies that waited behind a delivery a slot finished
            await self._drain_background()
            await sub.close()

    async def _unseen(self, sub: Subscription, deliveries: Sequence[Delivery]) -> list[Delivery]:
        """Acknowledge the deliveries already applied; return the rest.

        Never raises: it runs in the fetch loop, and an error escaping it
        would end the consumer while the process lives on.
        """
        if self.dedupe is None or not deliveries:
            return list(deliveries)
        try:
            seen = await self.dedupe.seen([d.envelope.id for d in deliveries])
        except Exception as exc:  # the marker store is down: apply; sinks are idempotent
            log.warning("topic %s: de-duplication check failed: %s", self.topic.name, exc)
            return list(deliveries)
        fresh: list[Delivery] = []
        duplicates: list[Delivery] = []
        for delivery in deliveries:
            if delivery.envelope.id in seen:
                self.stats.duplicates += 1
                if self.hooks:
                    self.hooks.emit(
                        "message_duplicate", self.topic.name, message_id=delivery.envelope.id
                    )
                duplicates.append(delivery)
            else:
                fresh.append(delivery)
        if duplicates:
            await self._ack_duplicates(sub, duplicates)
        return fresh

    async def _ack_duplicates(self, sub: Subscription, duplicates: Sequence[Delivery]) -> None:
        for delivery, error in zip(duplicates, await _ack_many(sub, duplicates), strict=True):
            if error is not None:
                # The broker is away (nats-py refuses to send while it
                # reconnects): the duplicate comes back after its ack wait and
                # meets its marker again.
                log.warning(
                    "topic %s message %s: duplicate not acknowledged (%s); it comes back after "
                    "its ack wait and is dropped then",
                    self.topic.name,
                    delivery.envelope.id,
                    error,
                )

    async def _apply(self, delivery: Delivery) -> bool:
        """Apply ``delivery``: True when it was applied and is to be acked, False
        when it failed (and was nakked, dead-lettered or left to its ack wait)."""
        try:
            await self.apply(self._message(delivery))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._settle_failure(delivery, exc)
            return False
        return True

    async def _ack_applied(self, sub: Subscription, applied: Sequence[Delivery]) -> None:
        """Mark applied deliveries done and ack them; a failure is logged, not raised."""
        outcomes = await _ack_many(sub, applied, self.dedupe)
        for delivery, error in zip(applied, outcomes, strict=True):
            if error is None:
                self._note_applied(delivery)
                continue
            log.warning(
                "topic %s message %s applied but not acknowledged (%s); a redelivery will be %s",
                self.topic.name,
                delivery.envelope.id,
                error,
                "skipped by its marker" if self.dedupe is not None else "applied again",
            )


class BatchConsumer(_Base[T]):
    """Buffers messages and hands them to ``write(messages)`` in batches.

    A batch is flushed at ``batch_size`` messages or ``max_wait`` after its
    first one arrived, by at most ``writers`` concurrent writes. On success
    every message is acknowledged; on a retryable failure every message is
    delivered again; on any other failure the batch is split in halves until
    the rows that fail alone are found: the others are written, the poison
    ones go to the dead-letter table (a requeue of the whole batch would
    block the topic forever on one bad row).
    """

    def __init__(
        self,
        transport: Transport,
        topic: Topic[T],
        write: WriteBatch[T],
        *,
        store: IngestStore,
        group: str = DEFAULT_GROUP,
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_wait: timedelta = DEFAULT_MAX_WAIT,
        writers: int = 1,
        max_in_flight: int = DEFAULT_BATCH_IN_FLIGHT,
        retryable: tuple[type[BaseException], ...] = (),
        retry_limit: int | None = None,
        max_attempts: int | None = None,  # deprecated: retry_limit + 1
        ladder: Sequence[timedelta] = DELAY_LADDER,
        ack_wait: timedelta = timedelta(minutes=5),
        poll: timedelta = FETCH_WAIT,
        clock: Clock = SYSTEM_CLOCK,
        hooks: Hooks | None = None,
    ) -> None:
        super().__init__(
            transport,
            topic,
            store=store,
            group=group,
            poll=poll,
            max_in_flight=max_in_flight,
            retryable=retryable,
            retry_limit=retry_limit,
            max_attempts=max_attempts,
            ladder=ladder,
            ack_wait=ack_wait,
            clock=clock,
            hooks=hooks,
        )
        self.write = write
        self.batch_size = _positive("batch_size", batch_size)
        self.writers = _positive("writers", writers)
        if max_in_flight < batch_size:
            raise InvalidInput("max_in_flight", f"must be >= batch_size ({batch_size})")
        self.max_wait = max_wait

    async def run(self, stop: asyncio.Event, *, grace: timedelta = timedelta(seconds=30)) -> None:
        sub = await self._subscribe(stop)
        if sub is None:
            return
        buffer: list[Delivery] = []
        first_at = 0.0
        writing: set[asyncio.Task[None]] = set()
        slots = asyncio.Semaphore(self.writers)
        held = 0  # deliveries buffered or being written

        async def flush(batch: list[Delivery]) -> None:
            nonlocal held
            try:
                async with slots:
                    await self._write(sub, batch)
            except Exception:
                # Loop boundary (nobody awaits this task's result): logged, not lost.
                log.exception(
                    "topic %s: unexpected error writing a batch of %d; its messages come back "
                    "after their ack wait",
                    self.topic.name,
                    len(batch),
                )
            finally:
                held -= len(batch)

        def start_flush() -> None:
            nonlocal buffer
            batch, buffer = buffer, []
            task = asyncio.create_task(flush(batch))
            writing.add(task)
            task.add_done_callback(writing.discard)

        try:
            while not stop.is_set():
                due = first_at + self.max_wait.total_seconds() - self.clock.monotonic()
                if buffer and (len(buffer) >= self.batch_size or due <= 0):
                    start_flush()
                    continue
                room = self.max_in_flight - held
                if room <= 0:
                    await asyncio.wait(writing, return_when=asyncio.FIRST_COMPLETED)
                    continue
                wait = timedelta(seconds=max(due, 0.0)) if buffer else self.poll
                want = min(room, self.batch_size - len(buffer))
                try:
                    got = await sub.fetch(want, wait=min(wait, self.poll))
                except Exception as exc:
                    log.warning("topic %s: fetch failed: %s", self.topic.name, exc)
                    await sleep_or_stop(stop, 1.0, self.clock)
                    continue
                if self.hooks:
                    self.hooks.emit("fetched", self.topic.name, count=len(got))
                if got and not buffer:
                    first_at = self.clock.monotonic()
                buffer.extend(got)
                held += len(got)
        finally:
            if buffer:
                start_flush()
            if writing:
                await asyncio.wait(writing, timeout=grace.total_seconds())
            await self._drain_background()
            await sub.close()

    async def _write(self, sub: Subscription, batch: list[Delivery]) -> None:
        self.stats.batches += 1
        messages: list[Message[T]] = []
        good: list[Delivery] = []
        for delivery in batch:
            try:
                messages.append(self._message(delivery))
                good.append(delivery)
            except Exception as exc:  # an undecodable body is poison on its own
                await self._poison(delivery, exc)
        if good:
            await self._write_split(sub, good, messages)

    async def _write_split(
        self, sub: Subscription, batch: list[Delivery], messages: list[Message[T]]
    ) -> None:
        try:
            await self.write(messages)
        except Exception as exc:
            if is_retryable(exc, self.retryable):
                # Together: the transport sends many settlements in one round trip.
                await asyncio.gather(*(self._settle_failure(d, exc) for d in batch))
                return
            if len(batch) == 1:
                await self._poison(batch[0], exc)
                return
            self.stats.splits += 1
            half = len(batch) // 2
            await self._write_split(sub, batch[:half], messages[:half])
            await self._write_split(sub, batch[half:], messages[half:])
            return
        for delivery, error in zip(batch, await _ack_many(sub, batch), strict=True):
            if error is not None:
                log.warning("topic %s: written but not acknowledged: %s", self.topic.name, error)
            else:
                self._note_applied(delivery)

    async def _poison(self, delivery: Delivery, error: BaseException) -> None:
        log.warning(
            "topic %s message %s is poison (%s); dead-lettered, the rest of its batch is written",
            self.topic.name,
            delivery.envelope.id,
            _describe(error),
        )
        try:
            await self._dead(delivery, "poison", error)
            await delivery.term()
            self._report_failed(delivery, "dead")
        except Exception as exc:
            log.warning("topic %s: could not dead-letter: %s", self.topic.name, exc)


async def _ack_many(
    sub: Subscription, deliveries: Sequence[Delivery], done: DoneStore | None = None
) -> list[BaseException | None]:
    """``sub.ack_many``, with an error escaping it (a bug) counted against every delivery."""
    try:
        return await sub.ack_many(deliveries, done=done)
    except Exception as exc:
        return [exc] * len(deliveries)


async def _wait_either(first: asyncio.Event, second: asyncio.Event) -> None:
    waits = [asyncio.create_task(first.wait()), asyncio.create_task(second.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


async def sleep_or_stop(stop: asyncio.Event, seconds: float, clock: Clock) -> None:
    """Wait ``seconds`` of ``clock``'s time, or until ``stop`` is set."""
    waits = [asyncio.ensure_future(clock.sleep(seconds)), asyncio.ensure_future(stop.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waits:
            waiter.cancel()
