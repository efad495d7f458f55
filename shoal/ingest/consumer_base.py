"""What both ingest consumers share: their options, the subscription, settling deliveries.

:class:`~shoal.ingest.consumer.Consumer` applies one message at a time per
slot; :class:`~shoal.ingest.batch_consumer.BatchConsumer` writes them in
batches. Both are built on :class:`ConsumerBase`: it subscribes (retrying
while the transport is unreachable), turns deliveries into messages, settles
failures (a retryable error is delivered again after the delay ladder's wait,
past ``retry_limit`` dead-lettered; any other error is a business error:
acknowledged, logged as WARN and kept in the dead-letter table), and records
the lag of what it applies. The options both take are declared once, in
:class:`ConsumerOptions`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Generic, TypedDict, TypeVar

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

DEFAULT_GROUP = "shoal"
DEFAULT_ACK_WAIT = timedelta(minutes=5)
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


def positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(name, f"must be an integer >= 1, got {value!r}")
    return value


class ConsumerOptions(TypedDict, total=False):
    """The options both consumers take, by keyword (``Pipeline.consumer`` passes them on).

    - ``group``: the consumer group (default ``"shoal"``);
    - ``retryable``: exception types retried besides :class:`~shoal.errors.TransientError`;
    - ``retry_limit``: retries of a retryable failure before it is dead-lettered
      (None: without limit); ``max_attempts`` is its deprecated spelling;
    - ``ladder``: the redelivery delays, by attempt;
    - ``ack_wait``: how long a delivery is held before it is delivered again;
    - ``poll``: how long an idle consumer waits for a message before asking again;
    - ``clock``, ``hooks``: the time source and the observers (shoal.testing).
    """

    group: str
    retryable: tuple[type[BaseException], ...]
    retry_limit: int | None
    max_attempts: int | None
    ladder: Sequence[timedelta]
    ack_wait: timedelta
    poll: timedelta
    clock: Clock
    hooks: Hooks | None


def check_options(options: Mapping[str, object]) -> None:
    """Refuse a keyword no consumer takes (the signature's ``**options`` would swallow it)."""
    unknown = sorted(set(options) - ConsumerOptions.__optional_keys__)
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {', '.join(map(repr, unknown))}")


class ConsumerBase(Generic[T]):
    """What both consumers share: the subscription, settling deliveries, lag records."""

    def __init__(
        self,
        transport: Transport,
        topic: Topic[T],
        *,
        store: IngestStore,
        max_in_flight: int,
        options: ConsumerOptions,
    ) -> None:
        check_options(options)
        # Past the cap (None: none), a retryable failure is dead-lettered.
        retry_limit = retry_limit_from_max_attempts(
            options.get("retry_limit"), options.get("max_attempts"), stacklevel=3
        )
        check_retry_limit(retry_limit)
        self.transport = transport
        self.topic = topic
        self.store = store
        self.group = options.get("group", DEFAULT_GROUP)
        self.poll = options.get("poll", FETCH_WAIT)
        self.max_in_flight = positive("max_in_flight", max_in_flight)
        self.retryable = options.get("retryable", ())
        self.retry_limit = retry_limit
        self.ladder = tuple(options.get("ladder", DELAY_LADDER))
        self.ack_wait = options.get("ack_wait", DEFAULT_ACK_WAIT)
        self.clock = options.get("clock", SYSTEM_CLOCK)
        hooks = options.get("hooks")
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
        letter = (envelope.id, envelope.encode().decode(), describe(error), delivery.attempt)
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


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


async def ack_many(
    sub: Subscription, deliveries: Sequence[Delivery], done: DoneStore | None = None
) -> list[BaseException | None]:
    """``sub.ack_many``, with an error escaping it (a bug) counted against every delivery."""
    try:
        return await sub.ack_many(deliveries, done=done)
    except Exception as exc:
        return [exc] * len(deliveries)


async def wait_either(first: asyncio.Event, second: asyncio.Event) -> None:
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
