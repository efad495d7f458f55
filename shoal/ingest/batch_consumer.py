"""The batch consumer: buffers a topic's messages and writes them in batches.

By default a batch is flushed at 200 messages or 1 s after its first one,
by one writer. Its options besides those are :class:`ConsumerOptions`, as
for :class:`~shoal.ingest.consumer.Consumer`.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import TypeVar, Unpack

from shoal.errors import InvalidInput
from shoal.ingest.consumer_base import (
    ConsumerBase,
    ConsumerOptions,
    WriteBatch,
    ack_many,
    describe,
    positive,
    sleep_or_stop,
)
from shoal.ingest.message import Message, Topic
from shoal.ingest.retry import is_retryable
from shoal.ingest.store import IngestStore
from shoal.ingest.transport import Delivery, Subscription, Transport

T = TypeVar("T")
log = logging.getLogger("shoal.ingest")

DEFAULT_BATCH_SIZE = 200
DEFAULT_MAX_WAIT = timedelta(seconds=1)
DEFAULT_BATCH_IN_FLIGHT = 500


class BatchConsumer(ConsumerBase[T]):
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
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_wait: timedelta = DEFAULT_MAX_WAIT,
        writers: int = 1,
        max_in_flight: int = DEFAULT_BATCH_IN_FLIGHT,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        super().__init__(
            transport, topic, store=store, max_in_flight=max_in_flight, options=options
        )
        self.write = write
        self.batch_size = positive("batch_size", batch_size)
        self.writers = positive("writers", writers)
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
        for delivery, error in zip(batch, await ack_many(sub, batch), strict=True):
            if error is not None:
                log.warning("topic %s: written but not acknowledged: %s", self.topic.name, error)
            else:
                self._note_applied(delivery)

    async def _poison(self, delivery: Delivery, error: BaseException) -> None:
        log.warning(
            "topic %s message %s is poison (%s); dead-lettered, the rest of its batch is written",
            self.topic.name,
            delivery.envelope.id,
            describe(error),
        )
        try:
            await self._dead(delivery, "poison", error)
            await delivery.term()
            self._report_failed(delivery, "dead")
        except Exception as exc:
            log.warning("topic %s: could not dead-letter: %s", self.topic.name, exc)
