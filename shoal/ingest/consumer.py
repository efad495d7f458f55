"""Consumers: a fixed number of applies in flight, whatever the producers do.

:class:`Consumer` applies one message at a time per slot (30 slots by
default). :class:`~shoal.ingest.batch_consumer.BatchConsumer` buffers
messages and writes them in batches (by default: flush at 200 or after 1 s,
one writer). Both take their messages from a :class:`Transport`, so the same
code runs on the postgres and the nats transports, and share their options
and the settling of failures (:mod:`shoal.ingest.consumer_base`).

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
from collections.abc import Sequence
from datetime import timedelta
from typing import TypeVar, Unpack

from shoal.errors import InvalidInput
from shoal.ingest.consumer_base import (
    Apply,
    ConsumerBase,
    ConsumerOptions,
    ConsumerStats,
    WriteBatch,
    ack_many,
    positive,
    sleep_or_stop,
    wait_either,
)
from shoal.ingest.dedupe import DoneStore
from shoal.ingest.message import Topic
from shoal.ingest.store import IngestStore
from shoal.ingest.transport import Delivery, Subscription, Transport

T = TypeVar("T")
log = logging.getLogger("shoal.ingest")

DEFAULT_CONCURRENCY = 30


__all__ = ["Apply", "Consumer", "ConsumerOptions", "ConsumerStats", "WriteBatch"]


class Consumer(ConsumerBase[T]):
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
        concurrency: int = DEFAULT_CONCURRENCY,
        max_in_flight: int | None = None,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        if max_in_flight is not None and max_in_flight < concurrency:
            raise InvalidInput("max_in_flight", f"must be >= concurrency ({concurrency})")
        super().__init__(
            transport,
            topic,
            store=store,
            max_in_flight=max_in_flight or 4 * positive("concurrency", concurrency),
            options=options,
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
                    await wait_either(room, stop)
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
        for delivery, error in zip(duplicates, await ack_many(sub, duplicates), strict=True):
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
        outcomes = await ack_many(sub, applied, self.dedupe)
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
