"""What every ingest transport guarantees, run against both: postgres and nats.

Each test drives the :class:`~shoal.ingest.transport.Transport` protocol only,
through a :class:`Bench` that hides how time passes. On postgres time is a
``FakeClock`` bound into SQL, and a pass of the queue's maintenance (which
every worker runs) expires dead leases. On nats the redelivery timers are
the server's, which run on real time: there the tests use delays of a second
or two and wait for the event itself, never a fixed sleep.

The consumer side of a test gets a transport of its own, as another process
would (a second database pool, a second nats connection), so a "crash" can
drop it without acknowledging anything. (``test_ingest_lease_processes.py``
kills a real worker process with SIGKILL, on both transports.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from shoal import FakeClock, Shoal
from shoal.db import Database
from shoal.db.pool import AsyncConn
from shoal.errors import InvalidInput
from shoal.hooks import Event, Hooks
from shoal.ingest.consumer import Consumer
from shoal.ingest.dedupe import DoneStore, PostgresDoneStore
from shoal.ingest.message import Envelope, Message, Topic, new_envelope
from shoal.ingest.postgres import PostgresTransport
from shoal.ingest.store import IngestStore
from shoal.ingest.transport import DEFAULT_ACK_WAIT, Delivery, Depth, Subscription, Transport
from shoal.testing import NatsServer
from tests.conftest import wait_for

TOPIC = "conformance.events"
GROUP = "shoal"
# A consumer's short ack wait. On nats it is real time; on postgres the fake
# clock makes any value instant.
ACK_WAIT = timedelta(seconds=2)
# How long a nats test waits, past a delay, for the server to redeliver. Far
# below the publisher's default ack wait (5 minutes), so a redelivery inside
# it cannot have come from that.
REAL_MARGIN = timedelta(seconds=15)


@dataclass
class Bench:
    """One transport under test, how its time passes, and its consumers' connections."""

    kind: str
    db_url: str
    publisher: Transport  # built with the transport's defaults, as a producer process would
    _connect: Callable[[], Awaitable[tuple[Transport, Callable[[], Awaitable[None]]]]]
    clock: FakeClock | None = None
    boss: Shoal | None = None
    _closers: dict[int, Callable[[], Awaitable[None]]] = field(default_factory=dict)
    _subs: dict[int, list[Subscription]] = field(default_factory=dict)

    async def consumer_transport(self) -> Transport:
        """A transport of another process, started: its own pool or connection."""
        transport, close = await self._connect()
        self._closers[id(transport)] = close
        return transport

    async def subscribe(
        self, transport: Transport, *, ack_wait: timedelta = ACK_WAIT
    ) -> Subscription:
        sub = await transport.subscribe(TOPIC, GROUP, max_in_flight=10, ack_wait=ack_wait)
        self._subs.setdefault(id(transport), []).append(sub)
        return sub

    async def crash(self, transport: Transport) -> None:
        """The consumer's process dies: its connections close; nothing is acked or nakked."""
        for sub in self._subs.pop(id(transport), []):
            await sub.close()  # stops fetching; settles nothing
        await self._closers.pop(id(transport))()

    async def _pass(self, delta: timedelta) -> None:
        assert self.clock is not None and self.boss is not None
        self.clock.advance(delta)
        await self.boss.maintain()  # what each worker's maintenance loop does

    async def nothing_within(self, sub: Subscription, delta: timedelta) -> None:
        """``delta`` passes and nothing is delivered."""
        if self.clock is not None:
            await self._pass(delta)
            assert await sub.fetch(10, wait=timedelta(0)) == []
        else:
            assert await sub.fetch(10, wait=delta) == []

    async def delivered_within(
        self, sub: Subscription, delta: timedelta, *, count: int = 1
    ) -> list[Delivery]:
        """``count`` deliveries once ``delta`` more has passed (on nats, within a margin)."""
        if self.clock is not None:
            await self._pass(delta)
            got = list(await sub.fetch(count, wait=timedelta(0)))
            assert len(got) == count, f"{len(got)} of {count} delivered"
            return got
        return await fetch_until(sub, count, within=delta + REAL_MARGIN)

    async def close(self) -> None:
        for key, close in reversed(list(self._closers.items())):
            for sub in self._subs.pop(key, []):
                await sub.close()
            await close()


async def fetch_until(sub: Subscription, count: int, *, within: timedelta) -> list[Delivery]:
    """Fetch until ``count`` deliveries arrived, or fail after ``within``."""
    got: list[Delivery] = []
    try:
        async with asyncio.timeout(within.total_seconds()):
            while len(got) < count:
                got.extend(await sub.fetch(count - len(got), wait=timedelta(milliseconds=200)))
    except TimeoutError:
        raise AssertionError(f"only {len(got)} of {count} delivered within {within}") from None
    return got


@pytest.fixture(params=["postgres", "nats"])
async def bench(
    request: pytest.FixtureRequest, db_url: str, tmp_path: Path
) -> AsyncIterator[Bench]:
    if request.param == "postgres":
        clock = FakeClock()
        db = await Database(db_url, max_size=4).open()
        boss = Shoal(db, clock=clock)
        publisher = PostgresTransport(boss)
        await publisher.start()

        async def connect_pg() -> tuple[Transport, Callable[[], Awaitable[None]]]:
            their_db = await Database(db_url, max_size=4).open()
            theirs = Shoal(their_db, clock=clock)
            transport = PostgresTransport(theirs)
            await transport.start()
            # LISTEN in place: a fetch that waits is woken by the next publish.
            assert theirs.notifier is not None
            await asyncio.wait_for(theirs.notifier.listening.wait(), 10)

            async def close() -> None:
                await transport.close()
                await theirs.close()

            return transport, close

        b = Bench("postgres", db_url, publisher, connect_pg, clock=clock, boss=boss)
        try:
            yield b
        finally:
            await b.close()
            await publisher.close()
            await boss.close()
        return

    from shoal.ingest.nats import NatsTransport

    server = NatsServer(tmp_path / "nats").start()

    def nats_transport() -> NatsTransport:
        return NatsTransport(
            server.url, monitor_url=server.monitor_url, reconnect_wait=timedelta(milliseconds=100)
        )

    async def connect_nats() -> tuple[Transport, Callable[[], Awaitable[None]]]:
        transport = nats_transport()
        await transport.start()
        return transport, transport.close

    nats_publisher = nats_transport()
    await nats_publisher.start()
    b = Bench("nats", db_url, nats_publisher, connect_nats)
    try:
        yield b
    finally:
        await b.close()
        await nats_publisher.close()
        server.stop()


def envelopes(n: int, *, prefix: str = "m") -> list[Envelope]:
    return [
        new_envelope({"i": i, "who": "ü"}, published_at=_PUBLISHED_AT, id=f"{prefix}-{i}")
        for i in range(n)
    ]


_PUBLISHED_AT = FakeClock().now()


async def depth_reaches(bench: Bench, check: Callable[[Depth], bool]) -> Depth:
    """The depth once ``check`` holds (nats counts an ack a moment after it was sent)."""
    seen: list[Depth] = []

    async def holds() -> bool:
        seen.append(await bench.publisher.depth(TOPIC, GROUP))
        return check(seen[-1])

    try:
        await wait_for(holds, 10)
    except AssertionError:
        raise AssertionError(f"depth stuck at {seen[-1]}") from None
    return seen[-1]


# -- the tests ---------------------------------------------------------------------


async def test_published_messages_are_delivered_once_each_and_acked_ones_never_return(
    bench: Bench,
) -> None:
    sent = envelopes(3)
    await bench.publisher.publish(TOPIC, sent)
    sub = await bench.subscribe(await bench.consumer_transport())
    got = await fetch_until(sub, 3, within=REAL_MARGIN)
    assert sorted(
        (d.envelope.id, d.envelope.published_at, d.envelope.body, d.attempt) for d in got
    ) == sorted((e.id, e.published_at, e.body, 1) for e in sent)
    for d in got:
        await d.ack()
    drained = await depth_reaches(bench, lambda d: d.total == 0)
    assert drained.oldest_age is None
    # Past the consumer's ack wait: an unacked message would be back by now.
    await bench.nothing_within(sub, ACK_WAIT + timedelta(milliseconds=500))


async def test_a_nak_with_delay_redelivers_only_after_the_delay(bench: Bench) -> None:
    await bench.publisher.publish(TOPIC, envelopes(1))
    sub = await bench.subscribe(await bench.consumer_transport(), ack_wait=DEFAULT_ACK_WAIT)
    (first,) = await fetch_until(sub, 1, within=REAL_MARGIN)
    await first.nak(timedelta(seconds=1))
    await bench.nothing_within(sub, timedelta(milliseconds=500))
    (again,) = await bench.delivered_within(sub, timedelta(milliseconds=500))
    assert (again.envelope.id, again.attempt) == (first.envelope.id, 2)
    await again.ack()


async def test_depth_counts_ready_in_flight_and_delayed_messages(bench: Bench) -> None:
    assert (await bench.publisher.depth(TOPIC, GROUP)).total == 0
    await bench.publisher.publish(TOPIC, envelopes(4))
    # Before any consumer took one, all of them are ready.
    before = await bench.publisher.depth(TOPIC, GROUP)
    assert (before.ready, before.in_flight, before.delayed) == (4, 0, 0)
    assert before.oldest_age is not None and before.oldest_age >= timedelta(0)
    sub = await bench.subscribe(await bench.consumer_transport())
    taken = await fetch_until(sub, 2, within=REAL_MARGIN)
    await depth_reaches(bench, lambda d: (d.ready, d.in_flight, d.delayed) == (2, 2, 0))
    await taken[0].nak(timedelta(minutes=10))
    # JetStream counts a nakked message as in flight until it is due, so only
    # the sum of in-flight and delayed is the same on both transports.
    depth = await depth_reaches(bench, lambda d: d.ready == 2 and d.in_flight + d.delayed == 2)
    assert depth.total == 4 and depth.oldest_age is not None
    await taken[1].ack()
    await depth_reaches(bench, lambda d: d.total == 3)


async def test_a_republished_message_id_is_applied_once(bench: Bench, db_url: str) -> None:
    transport = await bench.consumer_transport()
    db = await Database(db_url, max_size=2).open()
    store = IngestStore(db)
    topic: Topic[Any] = Topic(TOPIC)
    applied: list[str] = []

    async def apply(message: Message[Any]) -> None:
        applied.append(message.id)

    clock = bench.clock or FakeClock()
    dedupe = PostgresDoneStore(store, clock=clock)
    consumer = Consumer(
        transport,
        topic,
        apply,
        store=store,
        dedupe=dedupe,
        concurrency=2,
        poll=timedelta(milliseconds=100),
        clock=clock,
    )
    stop = asyncio.Event()
    running = asyncio.create_task(consumer.run(stop, grace=timedelta(seconds=5)))
    try:
        (message,) = envelopes(1)
        await bench.publisher.publish(TOPIC, [message])
        await wait_for(lambda: applied == [message.id])
        await depth_reaches(bench, lambda d: d.total == 0)
        await bench.publisher.publish(TOPIC, [message])  # a producer's retry, say
        # postgres stores the copy and the consumer acks it on its marker;
        # JetStream drops it on Nats-Msg-Id. Either way the topic drains.
        await depth_reaches(bench, lambda d: d.total == 0)
        assert applied == [message.id]
    finally:
        stop.set()
        await asyncio.wait_for(running, 10)
        await dedupe.close()
        await db.close()


async def test_two_copies_of_an_id_taken_in_one_fetch_are_applied_once(
    bench: Bench, db_url: str
) -> None:
    # Both copies are stored before any consumer runs (on postgres; JetStream
    # drops the second on its Nats-Msg-Id), so one fetch takes both: the
    # done-marker check of that fetch finds neither.
    (message,) = envelopes(1)
    others = envelopes(2, prefix="other")
    await bench.publisher.publish(TOPIC, [message, others[0]])
    await bench.publisher.publish(TOPIC, [message, others[1]])
    transport = await bench.consumer_transport()
    db = await Database(db_url, max_size=2).open()
    store = IngestStore(db)
    applied: list[str] = []

    async def apply(message: Message[Any]) -> None:
        applied.append(message.id)

    clock = bench.clock or FakeClock()
    dedupe = PostgresDoneStore(store, clock=clock)
    fetched: list[int] = []

    def on_fetched(event: Event) -> None:
        if event.name == "fetched":
            fetched.append(event.fields["count"])

    hooks = Hooks()
    hooks.add(on_fetched)
    consumer = Consumer(
        transport,
        Topic(TOPIC),
        apply,
        store=store,
        dedupe=dedupe,
        concurrency=2,
        max_in_flight=10,
        poll=timedelta(milliseconds=100),
        clock=clock,
        hooks=hooks,
    )
    stop = asyncio.Event()
    running = asyncio.create_task(consumer.run(stop, grace=timedelta(seconds=5)))
    try:
        # The applies first: once, on a loaded machine, the nats depth read
        # 0 before any message was applied (its cause not found), and the
        # test went on to an empty list.
        await wait_for(lambda: len(applied) >= 3, 10)
        await depth_reaches(bench, lambda d: d.total == 0)
        assert sorted(applied) == sorted([message.id, *(o.id for o in others)])
        if bench.kind == "postgres":
            assert fetched[0] == 4  # one fetch took both copies
            assert consumer.stats.duplicates == 1
    finally:
        stop.set()
        await asyncio.wait_for(running, 10)
        await dedupe.close()
        await db.close()


async def test_a_redelivery_while_the_first_delivery_is_applied_is_not_applied_again(
    bench: Bench, db_url: str
) -> None:
    # The first delivery's apply outlasts its lease, so the transport delivers
    # the message again while it is in hand; the copy's marker check comes
    # before the first delivery wrote its marker.
    (message,) = envelopes(1)
    await bench.publisher.publish(TOPIC, [message])
    transport = await bench.consumer_transport()
    db = await Database(db_url, max_size=2).open()
    store = IngestStore(db)
    applied: list[str] = []
    started, finish = asyncio.Event(), asyncio.Event()

    async def apply(message: Message[Any]) -> None:
        applied.append(message.id)
        started.set()
        await finish.wait()

    fetched: list[int] = []
    copy_fetched = asyncio.Event()

    def on_fetched(event: Event) -> None:
        if event.name == "fetched" and event.fields["count"]:
            fetched.append(event.fields["count"])
            if len(fetched) == 2:
                copy_fetched.set()

    hooks = Hooks()
    hooks.add(on_fetched)
    clock = bench.clock or FakeClock()
    dedupe = PostgresDoneStore(store, clock=clock)
    consumer = Consumer(
        transport,
        Topic(TOPIC),
        apply,
        store=store,
        dedupe=dedupe,
        concurrency=2,
        ack_wait=ACK_WAIT,
        poll=timedelta(milliseconds=100),
        clock=clock,
        hooks=hooks,
    )
    stop = asyncio.Event()
    running = asyncio.create_task(consumer.run(stop, grace=timedelta(seconds=5)))
    try:
        await asyncio.wait_for(started.wait(), 30)
        if bench.clock is not None:
            await bench._pass(ACK_WAIT + timedelta(seconds=1))  # the lease runs out
        # On nats the server's ack-wait timer (real time) redelivers it.
        await asyncio.wait_for(copy_fetched.wait(), REAL_MARGIN.total_seconds())
        finish.set()
        await depth_reaches(bench, lambda d: d.total == 0)
        assert applied == [message.id]
        assert consumer.stats.duplicates == 1
    finally:
        finish.set()
        stop.set()
        await asyncio.wait_for(running, 10)
        await dedupe.close()
        await db.close()


async def test_a_delivery_whose_consumer_died_unacked_comes_back_after_its_ack_wait(
    bench: Bench,
) -> None:
    await bench.publisher.publish(TOPIC, envelopes(1))
    doomed = await bench.consumer_transport()
    (taken,) = await fetch_until(await bench.subscribe(doomed), 1, within=REAL_MARGIN)
    await bench.crash(doomed)

    survivor = await bench.subscribe(await bench.consumer_transport())
    await bench.nothing_within(survivor, ACK_WAIT / 2)
    (again,) = await bench.delivered_within(survivor, ACK_WAIT / 2)
    assert (again.envelope.id, again.attempt) == (taken.envelope.id, 2)
    await again.ack()


async def test_the_lease_is_the_consumers_ack_wait_not_the_publishers(bench: Bench) -> None:
    """The fault test's finding: a consumer declared with a 3 s ack wait whose
    worker was SIGKILLed left its messages in flight for the publisher's 5 minutes."""
    # The publisher's transport has its defaults (a 5-minute ack wait on postgres
    # before this was fixed); the consumer's is 2 s.
    await bench.publisher.publish(TOPIC, envelopes(3))
    doomed = await bench.consumer_transport()
    taken = await fetch_until(
        await bench.subscribe(doomed, ack_wait=ACK_WAIT), 3, within=REAL_MARGIN
    )
    await bench.crash(doomed)

    depth = await bench.publisher.depth(TOPIC, GROUP)
    assert (depth.ready, depth.in_flight) == (0, 3)
    survivor = await bench.subscribe(await bench.consumer_transport(), ack_wait=ACK_WAIT)
    back = await bench.delivered_within(survivor, ACK_WAIT, count=3)
    assert sorted((d.envelope.id, d.attempt) for d in back) == sorted(
        (d.envelope.id, 2) for d in taken
    )
    for d in back:
        await d.ack()
    await depth_reaches(bench, lambda d: d.total == 0)


async def test_touch_extends_the_lease_by_the_consumers_ack_wait(bench: Bench) -> None:
    await bench.publisher.publish(TOPIC, envelopes(1))
    doomed = await bench.consumer_transport()
    (d,) = await fetch_until(await bench.subscribe(doomed), 1, within=REAL_MARGIN)
    observer = await bench.subscribe(await bench.consumer_transport())
    for _ in range(3):  # 1.8 ack waits in all, each touch before the lease runs out
        await bench.nothing_within(observer, ACK_WAIT * 0.6)
        await d.touch()
    await bench.crash(doomed)
    await bench.nothing_within(observer, ACK_WAIT * 0.6)
    (again,) = await bench.delivered_within(observer, ACK_WAIT * 0.4)
    assert (again.envelope.id, again.attempt) == (d.envelope.id, 2)
    await again.ack()


async def test_a_termed_message_is_never_delivered_again(bench: Bench) -> None:
    await bench.publisher.publish(TOPIC, envelopes(1))
    sub = await bench.subscribe(await bench.consumer_transport())
    (d,) = await fetch_until(sub, 1, within=REAL_MARGIN)
    await d.term()
    # Past the ack wait: an unsettled message would be back by now.
    await bench.nothing_within(sub, ACK_WAIT + timedelta(milliseconds=500))
    await depth_reaches(bench, lambda depth: depth.total == 0)


async def test_a_fetch_with_nothing_to_deliver_returns_nothing(bench: Bench) -> None:
    sub = await bench.subscribe(await bench.consumer_transport())
    assert await sub.fetch(5, wait=timedelta(0)) == []
    assert await sub.fetch(5, wait=timedelta(milliseconds=200)) == []


async def test_caller_mistakes_are_refused_naming_what_was_wrong(bench: Bench) -> None:
    """The same refusals on both: an app that moves to the other transport meets no new one."""
    for bad_topic in (
        bench.publisher.publish("no spaces", envelopes(1)),
        bench.publisher.subscribe("no spaces", GROUP, max_in_flight=1),
        bench.publisher.depth("no spaces", GROUP),
    ):
        with pytest.raises(InvalidInput, match="topic"):
            await bad_topic
    with pytest.raises(InvalidInput, match="group"):
        await bench.publisher.subscribe(TOPIC, "no spaces", max_in_flight=1)
    with pytest.raises(InvalidInput, match="group"):
        await bench.publisher.depth(TOPIC, "no spaces")
    with pytest.raises(InvalidInput, match="max_in_flight"):
        await bench.publisher.subscribe(TOPIC, GROUP, max_in_flight=0)
    with pytest.raises(InvalidInput, match="ack_wait"):
        await bench.publisher.subscribe(TOPIC, GROUP, max_in_flight=1, ack_wait=timedelta(0))
    sub = await bench.subscribe(await bench.consumer_transport())
    with pytest.raises(InvalidInput, match="limit"):
        await sub.fetch(0, wait=timedelta(0))


async def test_publishing_nothing_stores_nothing(bench: Bench) -> None:
    await bench.publisher.publish(TOPIC, [])
    assert (await bench.publisher.depth(TOPIC, GROUP)).total == 0


async def test_a_fetch_takes_at_most_its_limit_and_the_rest_stay_for_later(bench: Bench) -> None:
    sent = envelopes(5)
    await bench.publisher.publish(TOPIC, sent)
    sub = await bench.subscribe(await bench.consumer_transport())
    first = await sub.fetch(2, wait=REAL_MARGIN)
    assert 1 <= len(first) <= 2
    rest = await fetch_until(sub, len(sent) - len(first), within=REAL_MARGIN)
    assert sorted(d.envelope.id for d in [*first, *rest]) == sorted(e.id for e in sent)


async def test_a_publish_ends_the_wait_of_a_fetch_at_once(bench: Bench) -> None:
    sub = await bench.subscribe(await bench.consumer_transport())
    # A wait far past the margin below: only the publish can end it in time.
    waiting = asyncio.create_task(sub.fetch(1, wait=timedelta(minutes=2)))
    (message,) = envelopes(1)
    await bench.publisher.publish(TOPIC, [message])
    (d,) = await asyncio.wait_for(waiting, REAL_MARGIN.total_seconds())
    assert d.envelope.id == message.id
    await d.ack()


async def test_each_delivery_counts_an_attempt(bench: Bench) -> None:
    await bench.publisher.publish(TOPIC, envelopes(1))
    sub = await bench.subscribe(await bench.consumer_transport())
    attempts = []
    for _ in range(3):
        (d,) = await bench.delivered_within(sub, timedelta(0))
        attempts.append(d.attempt)
        await d.nak(timedelta(0))
    assert attempts == [1, 2, 3]


async def test_subscribers_of_one_group_share_its_messages(bench: Bench) -> None:
    sent = envelopes(6)
    await bench.publisher.publish(TOPIC, sent)
    one = await bench.subscribe(await bench.consumer_transport())
    other = await bench.subscribe(await bench.consumer_transport())
    got_one = await fetch_until(one, 3, within=REAL_MARGIN)
    got_other = await fetch_until(other, 3, within=REAL_MARGIN)
    assert sorted(d.envelope.id for d in [*got_one, *got_other]) == sorted(e.id for e in sent)
    for d in [*got_one, *got_other]:
        await d.ack()
    await depth_reaches(bench, lambda d: d.total == 0)


class MemoryDone:
    """Done-markers outside any database (a Redis store, say)."""

    def __init__(self) -> None:
        self.marked: set[str] = set()

    async def seen(self, ids: Sequence[str]) -> set[str]:
        return self.marked & set(ids)

    async def mark(self, message_id: str) -> None:
        self.marked.add(message_id)

    async def close(self) -> None:
        return None


@pytest.mark.parametrize("where", ["database", "elsewhere"])
async def test_ack_done_marks_each_message_done_and_acks_it(
    bench: Bench, db_url: str, where: str
) -> None:
    """In the database (postgres: marker and ack in one statement), or elsewhere."""
    db = await Database(db_url, max_size=2).open()
    done: DoneStore = (
        PostgresDoneStore(IngestStore(db), clock=bench.clock or FakeClock())
        if where == "database"
        else MemoryDone()
    )
    try:
        sent = envelopes(3)
        await bench.publisher.publish(TOPIC, sent)
        sub = await bench.subscribe(await bench.consumer_transport())
        for d in await fetch_until(sub, 3, within=REAL_MARGIN):
            await d.ack_done(done)
        assert await done.seen([e.id for e in sent]) == {e.id for e in sent}
        await depth_reaches(bench, lambda d: d.total == 0)
        await bench.nothing_within(sub, ACK_WAIT + timedelta(milliseconds=500))
    finally:
        await done.close()
        await db.close()


@pytest.mark.parametrize("where", ["database", "elsewhere"])
async def test_ack_many_acks_every_delivery_with_its_marker_and_reports_each(
    bench: Bench, db_url: str, where: str
) -> None:
    """What a consumer's acker does with the applied deliveries that gathered."""
    db = await Database(db_url, max_size=2).open()
    done: DoneStore = (
        PostgresDoneStore(IngestStore(db), clock=bench.clock or FakeClock())
        if where == "database"
        else MemoryDone()
    )
    try:
        sent = envelopes(5)
        await bench.publisher.publish(TOPIC, sent)
        sub = await bench.subscribe(await bench.consumer_transport())
        taken = await fetch_until(sub, 5, within=REAL_MARGIN)
        assert await sub.ack_many(taken, done=done) == [None] * 5
        assert await done.seen([e.id for e in sent]) == {e.id for e in sent}
        await depth_reaches(bench, lambda d: d.total == 0)
        await bench.nothing_within(sub, ACK_WAIT + timedelta(milliseconds=500))
    finally:
        await done.close()
        await db.close()


class RefusingDone(MemoryDone):
    """A marker store that cannot write the marker of one id."""

    def __init__(self, refused: str) -> None:
        super().__init__()
        self.refused = refused

    async def mark(self, message_id: str) -> None:
        if message_id == self.refused:
            raise ConnectionError(f"marker store away for {message_id}")
        await super().mark(message_id)


async def test_ack_many_leaves_unacked_a_delivery_whose_marker_was_not_written(
    bench: Bench,
) -> None:
    """Marker first, ack second: without its marker a message is not acked, so
    it comes back after its ack wait instead of being lost to de-duplication."""
    sent = envelopes(3)
    await bench.publisher.publish(TOPIC, sent)
    sub = await bench.subscribe(await bench.consumer_transport())
    taken = sorted(await fetch_until(sub, 3, within=REAL_MARGIN), key=lambda d: d.envelope.id)
    done = RefusingDone(refused=taken[1].envelope.id)
    outcomes = await sub.ack_many(taken, done=done)
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], ConnectionError)
    assert done.marked == {taken[0].envelope.id, taken[2].envelope.id}
    (again,) = await bench.delivered_within(sub, ACK_WAIT + timedelta(milliseconds=500))
    assert (again.envelope.id, again.attempt) == (taken[1].envelope.id, 2)
    assert await sub.ack_many([again]) == [None]
    await depth_reaches(bench, lambda d: d.total == 0)


async def test_a_publish_joins_the_callers_transaction_only_on_a_transport_in_the_database(
    bench: Bench,
) -> None:
    class Rollback(Exception):
        pass

    async def publish_then_roll_back(conn: AsyncConn) -> None:
        await bench.publisher.publish(TOPIC, envelopes(1, prefix="rolled"), conn=conn)
        raise Rollback

    async def publish_and_commit(conn: AsyncConn) -> None:
        await bench.publisher.publish(TOPIC, envelopes(1, prefix="kept"), conn=conn)

    db = await Database(bench.db_url, max_size=2).open()
    try:
        if not bench.publisher.in_database:
            with pytest.raises(InvalidInput, match="conn"):
                await db.run(publish_and_commit)
            return
        with pytest.raises(Rollback):
            await db.run(publish_then_roll_back)
        await db.run(publish_and_commit)
    finally:
        await db.close()
    sub = await bench.subscribe(await bench.consumer_transport())
    (d,) = await fetch_until(sub, 1, within=REAL_MARGIN)
    assert d.envelope.id == "kept-0"
    await d.ack()
    await bench.nothing_within(sub, ACK_WAIT + timedelta(milliseconds=500))


# -- where the transports differ ---------------------------------------------------


@pytest.mark.parametrize("bench", ["postgres"], indirect=True)
async def test_a_claim_keeps_the_lease_of_the_consumer_that_took_it_on_postgres(
    bench: Bench,
) -> None:
    """postgres leases each claim on its own: a later consumer's ack wait changes nothing
    already taken. (nats keeps one ack wait per group: see the next test.)"""
    await bench.publisher.publish(TOPIC, envelopes(1))
    slow = await bench.consumer_transport()
    (taken,) = await fetch_until(
        await bench.subscribe(slow, ack_wait=timedelta(minutes=1)), 1, within=REAL_MARGIN
    )
    await bench.crash(slow)
    quick = await bench.subscribe(await bench.consumer_transport(), ack_wait=ACK_WAIT)
    await bench.nothing_within(quick, timedelta(seconds=59))
    (again,) = await bench.delivered_within(quick, timedelta(seconds=1))
    assert (again.envelope.id, again.attempt) == (taken.envelope.id, 2)


@pytest.mark.parametrize("bench", ["nats"], indirect=True)
async def test_on_nats_a_group_durable_takes_the_latest_subscribers_ack_wait(
    bench: Bench, caplog: pytest.LogCaptureFixture
) -> None:
    """A durable made with the 5-minute default (an earlier deployment) whose consumer
    died holding a message: the group's next subscriber, declaring 2 s, updates the
    durable, and the server redelivers within 2 s, not 5 minutes."""
    await bench.publisher.publish(TOPIC, envelopes(1))
    old = await bench.consumer_transport()
    (taken,) = await fetch_until(
        await bench.subscribe(old, ack_wait=DEFAULT_ACK_WAIT), 1, within=REAL_MARGIN
    )
    await bench.crash(old)
    with caplog.at_level(logging.WARNING, logger="shoal.ingest.nats"):
        new = await bench.subscribe(await bench.consumer_transport(), ack_wait=ACK_WAIT)
    assert "had ack_wait 300s; now 2s" in caplog.text
    (again,) = await bench.delivered_within(new, ACK_WAIT)
    assert (again.envelope.id, again.attempt) == (taken.envelope.id, 2)


@pytest.mark.parametrize("bench", ["postgres"], indirect=True)
async def test_on_postgres_a_superseded_delivery_settles_nothing(bench: Bench) -> None:
    """A delivery whose lease ran out and that was delivered again is fenced by its
    attempt: its late ack leaves the new delivery to its own consumer. (nats differs:
    see the next test.)"""
    await bench.publisher.publish(TOPIC, envelopes(1))
    sub = await bench.subscribe(await bench.consumer_transport())
    (first,) = await fetch_until(sub, 1, within=REAL_MARGIN)
    (again,) = await bench.delivered_within(sub, ACK_WAIT + timedelta(milliseconds=500))
    await first.ack()
    await again.nak(timedelta(0))
    (third,) = await bench.delivered_within(sub, timedelta(0))
    assert (third.envelope.id, third.attempt) == (first.envelope.id, 3)
    await third.ack()


@pytest.mark.parametrize("bench", ["postgres"], indirect=True)
async def test_on_postgres_ack_many_refuses_another_subscriptions_delivery(bench: Bench) -> None:
    """Another subscription's delivery is refused and nothing is acked.

    Acking it would delete its job under a fence this subscription never held.
    """
    await bench.publisher.publish(TOPIC, envelopes(2))
    one = await bench.subscribe(await bench.consumer_transport())
    other = await bench.subscribe(await bench.consumer_transport())
    (mine,) = await fetch_until(one, 1, within=REAL_MARGIN)
    (theirs,) = await fetch_until(other, 1, within=REAL_MARGIN)
    with pytest.raises(InvalidInput, match=r"deliveries.*not fetched by this subscription"):
        await one.ack_many([mine, theirs])
    assert (await bench.publisher.depth(TOPIC, GROUP)).in_flight == 2
    assert await one.ack_many([mine]) == [None]
    assert await other.ack_many([theirs]) == [None]
    await depth_reaches(bench, lambda d: d.total == 0)


@pytest.mark.parametrize("bench", ["nats"], indirect=True)
async def test_on_nats_the_ack_of_a_superseded_delivery_settles_the_message(bench: Bench) -> None:
    """JetStream takes a late ack of an earlier delivery as the message's: the apply it
    confirms did happen, so nothing is lost, but a nak of the later delivery then
    changes nothing. A consumer acks only after its apply, so either way the message
    was applied at least once."""
    await bench.publisher.publish(TOPIC, envelopes(1))
    sub = await bench.subscribe(await bench.consumer_transport())
    (first,) = await fetch_until(sub, 1, within=REAL_MARGIN)
    (again,) = await bench.delivered_within(sub, ACK_WAIT + timedelta(milliseconds=500))
    assert again.attempt == 2
    await first.ack()
    await depth_reaches(bench, lambda d: d.total == 0)
    await again.nak(timedelta(0))
    await bench.nothing_within(sub, ACK_WAIT + timedelta(milliseconds=500))
