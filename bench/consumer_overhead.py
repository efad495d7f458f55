"""The ingest consumers' own CPU per message, with no database and no broker.

    .venv/bin/python -m bench.consumer_overhead                 # 100,000 messages, 3 rounds
    .venv/bin/python -m bench.consumer_overhead --n 20000 --rounds 5

An in-memory transport hands out envelopes encoded beforehand and takes
acks at once (each fetch and each ack yields to the event loop once, as a
round trip would), and the apply or batch write is a coroutine that yields
once. What is left is what the consumer itself spends on a message: the
buffer and its refills, the in-hand bookkeeping of ids, the slots, the acker,
the batch buffer, building each Message. Measured as this process's CPU
(``time.process_time``) from the start of the run to the last message
applied, per message, for:

- ``loop``: the floor: 30 tasks taking the same deliveries from an
  ``asyncio.Queue``, decoding each envelope and awaiting the same no-op
  apply, with no acks. Any consumer of 30 slots spends at least this.
- ``Consumer``: 30 slots, no marker store, its acker acking what the slots
  applied.
- ``BatchConsumer``: batches of 200, one writer.

The rounds run the three in turn; reported per round and as the median,
lowest and highest ratio to the loop of the same round, the unit that
travels between machines. A real transport adds its statements or its
broker's round trips on top (docs/benchmarks.md, "Ingest pipelines").

This is a measurement script, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from shoal.ingest.batch_consumer import BatchConsumer
from shoal.ingest.consumer import Consumer
from shoal.ingest.dedupe import DoneStore
from shoal.ingest.message import Envelope, Message, Topic, new_envelope
from shoal.ingest.transport import Delivery, Depth, Subscription

SLOTS = 30
BATCH = 200
TOPIC: Topic[Any] = Topic("bench.overhead")


def encoded(n: int) -> list[str]:
    """``n`` envelopes of the ingest bench's observation shape, as a transport stores them."""
    at = datetime(2026, 12, 4, tzinfo=UTC)
    return [
        new_envelope(
            {"card_id": i % 5000, "value": i, "observed_at": at.isoformat()}, published_at=at
        )
        .encode()
        .decode()
        for i in range(n)
    ]


class MemoryDelivery:
    __slots__ = ("_envelope", "_text")

    def __init__(self, text: str) -> None:
        self._text = text
        self._envelope: Envelope | None = None

    @property
    def envelope(self) -> Envelope:
        if self._envelope is None:
            self._envelope = Envelope.decode(self._text)
        return self._envelope

    @property
    def attempt(self) -> int:
        return 1

    async def ack(self) -> None:
        return None

    async def ack_done(self, done: DoneStore) -> None:
        return None

    async def nak(self, delay: timedelta) -> None:
        return None

    async def term(self) -> None:
        return None

    async def touch(self) -> None:
        return None


class MemorySubscription:
    def __init__(self, texts: Sequence[str]) -> None:
        self._texts = texts
        self._next = 0

    async def fetch(self, limit: int, *, wait: timedelta) -> Sequence[Delivery]:
        await asyncio.sleep(0)  # a round trip's worth of yielding
        start = self._next
        if start >= len(self._texts):
            await asyncio.sleep(min(wait.total_seconds(), 0.01))
            return []
        self._next = min(len(self._texts), start + limit)
        return [MemoryDelivery(t) for t in self._texts[start : self._next]]

    async def ack_many(
        self, deliveries: Sequence[Delivery], *, done: DoneStore | None = None
    ) -> list[BaseException | None]:
        await asyncio.sleep(0)
        return [None] * len(deliveries)

    async def close(self) -> None:
        return None


class MemoryTransport:
    name = "memory"
    in_database = False

    def __init__(self, texts: Sequence[str]) -> None:
        self._texts = texts

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def publish(self, topic: str, envelopes: Sequence[Envelope], **_: Any) -> None:
        raise NotImplementedError("the messages are made beforehand")

    async def subscribe(
        self, topic: str, group: str, *, max_in_flight: int, ack_wait: timedelta = timedelta(0)
    ) -> Subscription:
        return MemorySubscription(self._texts)

    async def depth(self, topic: str, group: str) -> Depth:
        return Depth(0, 0, 0, None)


class NoStore:
    """Where the consumers write their lag records: nowhere."""

    async def record_wait(self, topic: str, wait: timedelta, *, now: datetime | None) -> None:
        return None


class Apply:
    """The no-op apply (or batch write): counts what it was given and yields once."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.seen = 0
        self.all_seen = asyncio.Event()

    async def one(self, _: object) -> None:
        await self.many([_])

    async def many(self, items: Sequence[object]) -> None:
        self.seen += len(items)
        if self.seen >= self.target:
            self.all_seen.set()
        await asyncio.sleep(0)


async def run_loop(texts: Sequence[str]) -> float:
    queue: asyncio.Queue[MemoryDelivery] = asyncio.Queue()
    for text in texts:
        queue.put_nowait(MemoryDelivery(text))

    apply = Apply(len(texts))

    async def slot() -> None:
        while not queue.empty():
            delivery = queue.get_nowait()
            envelope = delivery.envelope
            await apply.one(
                Message(envelope.id, TOPIC.name, envelope.body, envelope.published_at, 1)
            )

    began = time.process_time()
    await asyncio.gather(*(slot() for _ in range(SLOTS)))
    return time.process_time() - began


async def run_consumer(
    texts: Sequence[str], make: Callable[[MemoryTransport, Apply], Any]
) -> float:
    """Until every message is applied and acked: the consumer stops once all are in."""
    apply = Apply(len(texts))
    consumer = make(MemoryTransport(texts), apply)
    stop = asyncio.Event()
    began = time.process_time()
    running = asyncio.create_task(consumer.run(stop))
    await apply.all_seen.wait()
    stop.set()
    await running
    return time.process_time() - began


def consumer(transport: MemoryTransport, apply: Apply) -> Consumer[Any]:
    store: Any = NoStore()  # record_wait is all a consumer asks of its store here
    return Consumer(transport, TOPIC, apply.one, store=store, concurrency=SLOTS)


def batch_consumer(transport: MemoryTransport, apply: Apply) -> BatchConsumer[Any]:
    store: Any = NoStore()
    return BatchConsumer(transport, TOPIC, apply.many, store=store, batch_size=BATCH)


async def bench(n: int, rounds: int) -> None:
    texts = encoded(n)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"machine: os.cpu_count() = {os.cpu_count()}; load average {load}; N = {n:,}")
    print("CPU microseconds of this process per message (no database, no broker)")
    runs: dict[str, list[float]] = {"loop": [], "Consumer": [], "BatchConsumer": []}
    for r in range(rounds):
        loop_s = await run_loop(texts)
        consumer_s = await run_consumer(texts, consumer)
        batch_s = await run_consumer(texts, batch_consumer)
        for name, spent in (("loop", loop_s), ("Consumer", consumer_s), ("BatchConsumer", batch_s)):
            runs[name].append(spent)
        print(
            f"  round {r + 1}: loop {loop_s / n * 1e6:.1f}, Consumer {consumer_s / n * 1e6:.1f}"
            f" ({consumer_s / loop_s:.2f}x), BatchConsumer {batch_s / n * 1e6:.1f}"
            f" ({batch_s / loop_s:.2f}x)"
        )
    for name in ("Consumer", "BatchConsumer"):
        ratios = [s / base for s, base in zip(runs[name], runs["loop"], strict=True)]
        per = statistics.median(runs[name]) / n * 1e6
        print(
            f"{name}: {per:.1f} us a message, {statistics.median(ratios):.2f}x the loop"
            f" ({min(ratios):.2f}x-{max(ratios):.2f}x)"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=100_000, help="messages a run (default 100,000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three (default 3)")
    args = parser.parse_args(argv)
    if args.n < 1 or args.rounds < 1:
        parser.error("--n and --rounds must be at least 1")
    asyncio.run(bench(args.n, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
