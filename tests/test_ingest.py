"""Ingest pipelines on the postgres transport: consumers, de-duplication, the delay
ladder, batch sinks, the out-of-order guard, backpressure and the mode switch.

Everything runs against real PostgreSQL; time-dependent tests use a FakeClock
bound into SQL. The nats transport runs the same consumers in
tests/test_ingest_nats_pipeline.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from shoal import App, FakeClock, Shoal, ShoalError
from shoal.errors import InvalidInput, TransientError
from shoal.ingest.batch_consumer import BatchConsumer
from shoal.ingest.consumer import Consumer
from shoal.ingest.dedupe import PostgresDoneStore, RedisDoneStore
from shoal.ingest.message import Message, Topic
from shoal.ingest.pipeline import Pipeline, check_connection_budget
from shoal.ingest.postgres import PgSubscription, PostgresTransport
from shoal.ingest.retry import DELAY_LADDER, redelivery_delay
from shoal.ingest.store import IngestStore
from shoal.ingest.transport import DEFAULT_ACK_WAIT, Delivery, PublishError, Transport
from shoal.testing import Probe
from tests.conftest import wait_for
from tests.ingest_helpers import (
    COLLECTION,
    READINGS,
    Reading,
    apply_reading,
    create_schema,
    scalar,
    write_collection,
)

FAST = timedelta(milliseconds=50)


@pytest.fixture
async def pipeline(boss: Shoal) -> AsyncIterator[Pipeline]:
    await create_schema(boss.db)
    p = Pipeline(boss, PostgresTransport(boss))
    await p.start()
    yield p
    await p.close()


@pytest.fixture
async def fake_pipeline(fake_boss: Shoal) -> AsyncIterator[Pipeline]:
    await create_schema(fake_boss.db)
    p = Pipeline(fake_boss)
    await p.start()
    yield p
    await p.close()


async def running(consumer: Consumer[Any] | BatchConsumer[Any]) -> tuple[asyncio.Event, Any]:
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop, grace=timedelta(seconds=5)))
    return stop, task


async def stopped(handle: tuple[asyncio.Event, Any]) -> None:
    handle[0].set()
    await asyncio.wait_for(handle[1], 30)


async def unfinished(boss: Shoal, topic: str) -> int:
    return int(
        await scalar(
            boss.db,
            "SELECT count(*) FROM shoal.topic_message WHERE topic = %s",
            (topic,),
        )
    )


# -- consumers ------------------------------------------------------------------


async def test_every_published_message_is_applied_once(pipeline: Pipeline, boss: Shoal) -> None:
    readings = [Reading(card_id=i % 50, amount=i) for i in range(1000)]
    ids = await pipeline.publish_many(READINGS, readings)
    assert len(set(ids)) == 1000
    consumer = pipeline.consumer(READINGS, apply_reading(boss.db), concurrency=30, poll=FAST)
    handle = await running(consumer)
    await wait_for(lambda: scalar(boss.db, "SELECT count(*) = 1000 FROM applied"), 30)
    await wait_for(lambda: _zero(unfinished(boss, READINGS.name)), 30)
    await stopped(handle)
    assert await scalar(boss.db, "SELECT sum(total) FROM card") == sum(range(1000))
    assert await scalar(boss.db, "SELECT count(*) FROM apply_call") == 1000
    assert consumer.stats.applied == 1000


async def _zero(count: Any) -> bool:
    return await count == 0


async def test_concurrency_is_fixed_whatever_the_producers_do(
    pipeline: Pipeline, boss: Shoal
) -> None:
    active = 0
    peak = 0
    done = 0

    full = asyncio.Event()  # the first applies hold their slots until all seven are taken

    async def slow_apply(message: Message[Reading]) -> None:
        nonlocal active, peak, done
        active += 1
        peak = max(peak, active)
        if active == 7:
            full.set()
        await full.wait()
        active -= 1
        done += 1

    consumer = pipeline.consumer(READINGS, slow_apply, concurrency=7, poll=FAST)
    handle = await running(consumer)
    # Three producers publishing at once, far faster than 7 slots apply.
    await asyncio.gather(
        *(
            pipeline.publish_many(READINGS, [Reading(card_id=p, amount=i) for i in range(100)])
            for p in range(3)
        )
    )
    await wait_for(lambda: done == 300, 30)
    await stopped(handle)
    assert peak == 7


async def test_a_message_id_is_applied_once_and_replays_are_acknowledged(
    pipeline: Pipeline, boss: Shoal
) -> None:
    consumer = pipeline.consumer(READINGS, apply_reading(boss.db), concurrency=4, poll=FAST)
    handle = await running(consumer)
    await pipeline.publish(READINGS, Reading(card_id=1, amount=5), id="obs-1")
    await wait_for(lambda: scalar(boss.db, "SELECT count(*) = 1 FROM applied"))
    await wait_for(lambda: _zero(unfinished(boss, READINGS.name)))
    # The same observation published again (a producer retry, a transport
    # redelivery): acknowledged by its done-marker, never applied again.
    for _ in range(3):
        await pipeline.publish(READINGS, Reading(card_id=1, amount=5), id="obs-1")
    await wait_for(lambda: _zero(unfinished(boss, READINGS.name)))
    await stopped(handle)
    assert await scalar(boss.db, "SELECT count(*) FROM apply_call") == 1
    assert await scalar(boss.db, "SELECT total FROM card WHERE id = 1") == 5
    assert consumer.stats.duplicates == 3


class MarkerLost:
    """The process dies after the apply committed and before the marker was written.

    A wrapper, not a PostgresDoneStore: with one of those the postgres transport
    writes the marker and the ack in one statement, both or neither.
    """

    def __init__(self, store: IngestStore) -> None:
        self.markers = PostgresDoneStore(store)

    async def seen(self, ids: Sequence[str]) -> set[str]:
        return await self.markers.seen(ids)

    async def mark(self, message_id: str) -> None:
        raise ConnectionError("killed between commit and marker")

    async def close(self) -> None:
        await self.markers.close()


class SlowMarker:
    """Done-markers whose write for one message id waits until ``written`` is set.

    Not a PostgresDoneStore, so the transport writes the marker, then acks:
    the marker of ``slow_id`` stands for an ack that takes its time.
    """

    def __init__(self, store: IngestStore, slow_id: str) -> None:
        self.markers = PostgresDoneStore(store)
        self.slow_id = slow_id
        self.waiting = asyncio.Event()
        self.written = asyncio.Event()

    async def seen(self, ids: Sequence[str]) -> set[str]:
        return await self.markers.seen(ids)

    async def mark(self, message_id: str) -> None:
        if message_id == self.slow_id:
            self.waiting.set()
            await self.written.wait()
        await self.markers.mark(message_id)

    async def close(self) -> None:
        await self.markers.close()


async def test_a_slot_applies_the_next_message_while_its_last_ones_ack_is_written(
    pipeline: Pipeline, boss: Shoal
) -> None:
    markers = SlowMarker(pipeline.store, "obs-slow")
    consumer = Consumer(
        pipeline.transport,
        READINGS,
        apply_reading(boss.db),
        store=pipeline.store,
        dedupe=markers,
        concurrency=1,
        max_in_flight=4,
        poll=FAST,
    )
    handle = await running(consumer)
    await pipeline.publish(READINGS, Reading(card_id=1, amount=5), id="obs-slow")
    await markers.waiting.wait()
    # The one slot is free while obs-slow's marker and ack are on their way.
    await pipeline.publish(READINGS, Reading(card_id=2, amount=7), id="obs-next")
    await wait_for(lambda: scalar(boss.db, "SELECT count(*) = 1 FROM applied WHERE card_id = 2"))
    # A copy of obs-slow fetched meanwhile waits for its marker, then is
    # acknowledged as a duplicate: never applied twice.
    await pipeline.publish(READINGS, Reading(card_id=1, amount=5), id="obs-slow")
    claimed = "SELECT count(*) = 3 FROM shoal.topic_message WHERE topic = %s AND leased"
    await wait_for(lambda: scalar(boss.db, claimed, (READINGS.name,)))
    # Acked only once obs-slow's is: one ack waits at a time (`concurrency`).
    assert consumer.stats.applied == 0
    markers.written.set()
    await wait_for(lambda: _zero(unfinished(boss, READINGS.name)))
    await stopped(handle)
    calls = await scalar(boss.db, "SELECT count(*) FROM apply_call WHERE message_id = 'obs-slow'")
    assert calls == 1
    assert consumer.stats.applied == 2
    assert consumer.stats.duplicates == 1


class HeldThenFailingAcks(IngestStore):
    """A subscription's store whose first ack statement waits for ``release``
    and whose second one fails; the rest succeed."""

    def __init__(self, store: IngestStore, release: asyncio.Event) -> None:
        super().__init__(store.db)
        self.release = release
        self.calls = 0

    async def ack(self, topic: str, done: Sequence[tuple[int, int]], **kw: Any) -> None:
        self.calls += 1
        if self.calls == 1:
            await self.release.wait()
        elif self.calls == 2:
            raise ShoalError("connection lost during the ack")
        await super().ack(topic, done, **kw)


class AckRecorder(PostgresTransport):
    """The postgres transport, with the size of every ack_many, on a HeldThenFailingAcks."""

    def __init__(self, boss: Shoal, release: asyncio.Event) -> None:
        super().__init__(boss)
        self.batches: list[int] = []
        self.release = release

    async def subscribe(
        self, topic: str, group: str, *, max_in_flight: int, ack_wait: timedelta = DEFAULT_ACK_WAIT
    ) -> PgSubscription:
        store = HeldThenFailingAcks(self.store, self.release)
        batches = self.batches

        class Recording(PgSubscription):
            async def ack_many(
                self, deliveries: Sequence[Delivery], *, done: Any = None
            ) -> list[BaseException | None]:
                batches.append(len(deliveries))
                return await super().ack_many(deliveries, done=done)

        return Recording(self.boss, store, topic, ack_wait=ack_wait)


async def test_a_failed_ack_of_many_sends_each_of_its_messages_back(
    fake_pipeline: Pipeline, fake_boss: Shoal, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    pipeline, boss = fake_pipeline, fake_boss
    caplog.set_level(logging.WARNING, logger="shoal.ingest")
    release = asyncio.Event()
    transport = AckRecorder(boss, release)
    apply = apply_reading(boss.db)
    applies: list[str] = []

    async def recorded(message: Message[Reading]) -> None:
        await apply(message)
        applies.append(message.id)  # the slot leaves its ack in the same step

    consumer = Consumer(
        transport,
        READINGS,
        recorded,
        store=pipeline.store,
        dedupe=pipeline.dedupe,
        concurrency=5,
        poll=FAST,
        clock=boss.clock,
        ack_wait=timedelta(seconds=30),
    )
    handle = await running(consumer)
    await pipeline.publish(READINGS, Reading(card_id=3, amount=100), id="first")
    await wait_for(lambda: transport.batches == [1])  # its ack statement is held
    ids = [f"m{i}" for i in range(4)]
    await pipeline.publish_many(
        READINGS, [Reading(card_id=3, amount=i + 1) for i in range(4)], ids=ids
    )
    await wait_for(lambda: len(applies) == 5)
    # The four acks gathered behind the held one go out together, and that
    # statement (their markers with them) fails: each is logged, none is
    # marked, and all four keep their lease.
    release.set()
    await wait_for(lambda: transport.batches == [1, 4])
    await wait_for(lambda: sum("not acknowledged" in r.getMessage() for r in caplog.records) == 4)
    assert await unfinished(boss, READINGS.name) == 4
    assert await scalar(boss.db, "SELECT count(*) FROM shoal.ingest_done") == 1
    # Past the lease each is delivered again, applied again (the sink is
    # idempotent by message id), acknowledged and marked: nothing lost.
    clock.advance(timedelta(seconds=31))
    await wait_for(lambda: _zero(unfinished(boss, READINGS.name)))
    await stopped(handle)
    assert sorted(applies) == sorted(["first", *ids, *ids])
    assert await scalar(boss.db, "SELECT total FROM card WHERE id = 3") == 100 + 1 + 2 + 3 + 4
    assert await scalar(boss.db, "SELECT count(*) FROM shoal.ingest_done") == 5
    assert consumer.stats.applied == 5


async def test_a_replay_after_commit_without_marker_changes_nothing(
    fake_pipeline: Pipeline, fake_boss: Shoal, clock: FakeClock
) -> None:
    pipeline, boss = fake_pipeline, fake_boss
    crashing = pipeline.consumer(
        READINGS,
        apply_reading(boss.db),
        dedupe=MarkerLost(pipeline.store),
        concurrency=2,
        poll=FAST,
        ack_wait=timedelta(seconds=2),  # the lease of what it takes
    )
    handle = await running(crashing)
    await pipeline.publish(READINGS, Reading(card_id=2, amount=7), id="obs-2")
    await wait_for(lambda: scalar(boss.db, "SELECT count(*) = 1 FROM apply_call"))
    await stopped(handle)
    # Neither marked nor acknowledged: once its lease expires it is delivered again.
    assert await scalar(boss.db, "SELECT count(*) FROM shoal.ingest_done") == 0
    clock.advance(timedelta(hours=1))  # past any ack wait
    await boss.maintain()
    clock.advance(timedelta(hours=1))  # past the redelivery's delay
    consumer = pipeline.consumer(READINGS, apply_reading(boss.db), concurrency=2, poll=FAST)
    handle = await running(consumer)
    await wait_for(lambda: scalar(boss.db, "SELECT count(*) = 2 FROM apply_call"))
    await wait_for(lambda: _zero(unfinished(boss, READINGS.name)))
    await stopped(handle)
    # Applied twice, with the effect of once: the sink is idempotent by message id.
    assert await scalar(boss.db, "SELECT total FROM card WHERE id = 2") == 7
    assert await scalar(boss.db, "SELECT count(*) FROM shoal.ingest_done") == 1


async def test_retryable_errors_follow_the_delay_ladder_without_limit(
    fake_pipeline: Pipeline, fake_boss: Shoal, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    attempts: list[int] = []

    async def failing(message: Message[Reading]) -> None:
        attempts.append(message.attempt)
        raise TransientError("database timed out")

    caplog.set_level(logging.WARNING, logger="shoal.ingest")  # before the first attempt
    consumer = fake_pipeline.consumer(READINGS, failing, concurrency=1, poll=FAST)
    handle = await running(consumer)
    await fake_pipeline.publish(READINGS, Reading(card_id=3, amount=1))
    expected = [5, 15, 30, 60, 120, 300, 300, 300, 300, 300, 300]
    for n, delay_s in enumerate(expected, start=1):
        await wait_for(lambda n=n: len(attempts) == n, 30)
        assert redelivery_delay(n) == timedelta(seconds=delay_s)
        await wait_for(lambda: _nakked(fake_boss), 30)
        # Not a moment before the ladder's delay: the redelivery is due exactly then...
        due = await scalar(
            fake_boss.db,
            "SELECT due_at FROM shoal.topic_message WHERE topic = %s",
            (READINGS.name,),
        )
        assert due == clock.now() + timedelta(seconds=delay_s)
        clock.advance(timedelta(seconds=delay_s - 1))
        assert len(attempts) == n
        # ...and it comes once the clock reaches it.
        clock.advance(timedelta(seconds=1))
    await wait_for(lambda: len(attempts) == len(expected) + 1, 30)
    await stopped(handle)
    assert attempts == list(range(1, len(expected) + 2))
    # One line per redelivery, naming its attempt: WARN for 1-9, ERROR from 10.
    loud = {
        int(r.getMessage().split(" attempt ")[1].split()[0]): r.levelno
        for r in caplog.records
        if "redelivering" in r.getMessage()
    }
    assert sorted(loud)[: len(expected)] == list(range(1, len(expected) + 1))
    assert all(
        level == (logging.ERROR if n >= 10 else logging.WARNING) for n, level in loud.items()
    )


async def _nakked(boss: Shoal) -> bool:
    """The message is back in its topic, waiting for its delay (no lease)."""
    leased = await scalar(
        boss.db, "SELECT leased FROM shoal.topic_message WHERE topic = %s", (READINGS.name,)
    )
    return leased is False


async def test_business_errors_are_acknowledged_with_a_warning_and_kept(
    pipeline: Pipeline, boss: Shoal, caplog: pytest.LogCaptureFixture
) -> None:
    async def reject(message: Message[Reading]) -> None:
        raise LookupError(f"card {message.body.card_id} not found")

    caplog.set_level(logging.WARNING, logger="shoal.ingest")
    consumer = pipeline.consumer(READINGS, reject, concurrency=2, poll=FAST)
    handle = await running(consumer)
    await pipeline.publish(READINGS, Reading(card_id=99, amount=1), id="obs-99")
    await wait_for(lambda: _zero(unfinished(boss, READINGS.name)))
    await stopped(handle)
    assert consumer.stats.business_errors == 1 and consumer.stats.redelivered == 0
    warned = [r for r in caplog.records if "business error" in r.getMessage()]
    assert warned and warned[0].levelno == logging.WARNING
    (letter,) = await pipeline.store.dead_letters(READINGS.name)
    assert (letter.message_id, letter.reason, letter.attempt) == ("obs-99", "business", 1)
    assert "card 99 not found" in letter.error
    # After a fix, a redrive applies it.
    assert await pipeline.redrive(READINGS.name) == 1
    consumer = pipeline.consumer(READINGS, apply_reading(boss.db), concurrency=2, poll=FAST)
    handle = await running(consumer)
    await wait_for(lambda: scalar(boss.db, "SELECT count(*) = 1 FROM applied"))
    await stopped(handle)
    assert await pipeline.redrive(READINGS.name) == 0


async def test_an_attempt_cap_sends_a_message_to_the_dead_letter_table(
    pipeline: Pipeline, boss: Shoal
) -> None:
    async def failing(message: Message[Reading]) -> None:
        raise TimeoutError("gateway")

    consumer = pipeline.consumer(
        READINGS, failing, concurrency=1, retry_limit=2, ladder=[timedelta(0)], poll=FAST
    )
    handle = await running(consumer)
    await pipeline.publish(READINGS, Reading(card_id=4, amount=1), id="obs-4")
    await wait_for(lambda: _zero(unfinished(boss, READINGS.name)))
    await stopped(handle)
    (letter,) = await pipeline.store.dead_letters(READINGS.name)
    assert (letter.reason, letter.attempt) == ("attempts", 3)
    assert consumer.stats.redelivered == 2


async def test_max_attempts_is_the_deprecated_spelling_of_retry_limit(pipeline: Pipeline) -> None:
    async def apply(message: Message[Reading]) -> None:
        return None

    with pytest.warns(DeprecationWarning, match="retry_limit"):
        consumer = pipeline.consumer(READINGS, apply, max_attempts=3)
    assert consumer.retry_limit == 2
    with pytest.warns(DeprecationWarning, match="retry_limit"):
        assert consumer.max_attempts == 3
    with pytest.warns(DeprecationWarning), pytest.raises(InvalidInput, match="max_attempts"):
        pipeline.batch_consumer(READINGS, _write_nothing, max_attempts=3, retry_limit=2)


async def _write_nothing(messages: list[Message[Reading]]) -> None:
    return None


# -- batch sinks --------------------------------------------------------------------


def records(n: int, *, bad: set[int] = frozenset()) -> list[dict[str, Any]]:  # type: ignore[assignment]
    base = datetime(2026, 11, 30, tzinfo=UTC)
    return [
        {
            "observation_id": f"o{i}",
            "observed_at": (base + timedelta(seconds=i)).isoformat(),
            "value": -1 if i in bad else i,
        }
        for i in range(n)
    ]


async def test_a_batch_sink_flushes_at_batch_size(pipeline: Pipeline, boss: Shoal) -> None:
    sizes: list[int] = []

    async def write(messages: list[Message[Any]]) -> None:
        sizes.append(len(messages))
        await write_collection(boss.db, messages)

    await pipeline.publish_many(COLLECTION, records(450))
    sink = pipeline.batch_consumer(COLLECTION, write, batch_size=200, poll=FAST)
    handle = await running(sink)
    await wait_for(lambda: scalar(boss.db, "SELECT count(*) = 450 FROM collection"), 30)
    await wait_for(lambda: _zero(unfinished(boss, COLLECTION.name)))
    await stopped(handle)
    assert sizes[:2] == [200, 200] and sum(sizes) == 450


async def test_a_batch_sink_flushes_a_partial_batch_after_max_wait(
    fake_pipeline: Pipeline, fake_boss: Shoal, clock: FakeClock
) -> None:
    sizes: list[int] = []

    async def write(messages: list[Message[Any]]) -> None:
        sizes.append(len(messages))
        await write_collection(fake_boss.db, messages)

    probe = Probe(fake_boss)
    sink = fake_pipeline.batch_consumer(COLLECTION, write, batch_size=200, poll=FAST)
    handle = await running(sink)
    await fake_pipeline.publish_many(COLLECTION, records(10))
    await probe.wait_for("fetched", lambda e: e["count"] == 10, queue=COLLECTION.name)
    # Two more fetches: the second began after the ten were buffered, so the sink
    # weighed a flush in between, and made none.
    probe.discard("fetched")
    await probe.fetched(COLLECTION.name, count=2)
    assert sizes == []  # 10 of 200, and the second has not passed
    clock.advance(timedelta(milliseconds=999))
    probe.discard("fetched")
    await probe.fetched(COLLECTION.name, count=2)
    assert sizes == []
    clock.advance(timedelta(milliseconds=1))
    await wait_for(lambda: sizes == [10], 30)
    await stopped(handle)


async def test_a_retryable_failure_requeues_the_whole_batch(
    pipeline: Pipeline, boss: Shoal
) -> None:
    calls: list[int] = []

    async def write(messages: list[Message[Any]]) -> None:
        calls.append(len(messages))
        if len(calls) == 1:
            raise TransientError("connection reset")
        assert all(m.attempt == 2 for m in messages)
        await write_collection(boss.db, messages)

    await pipeline.publish_many(COLLECTION, records(50))
    sink = pipeline.batch_consumer(
        COLLECTION, write, batch_size=50, ladder=[timedelta(0)], poll=FAST
    )
    handle = await running(sink)
    await wait_for(lambda: scalar(boss.db, "SELECT count(*) = 50 FROM collection"), 30)
    await stopped(handle)
    assert calls == [50, 50]


async def test_a_data_error_writes_the_good_rows_and_dead_letters_the_poison(
    pipeline: Pipeline, boss: Shoal
) -> None:
    await pipeline.publish_many(COLLECTION, records(200, bad={17, 120, 121}))
    sink = pipeline.batch_consumer(
        COLLECTION, lambda ms: write_collection(boss.db, ms), batch_size=200, poll=FAST
    )
    handle = await running(sink)
    await wait_for(lambda: _zero(unfinished(boss, COLLECTION.name)), 30)
    await stopped(handle)
    assert await scalar(boss.db, "SELECT count(*) FROM collection") == 197
    letters = await pipeline.store.dead_letters(COLLECTION.name)
    bodies = [json.loads(letter.envelope_json)["body"] for letter in letters]
    assert sorted(b["observation_id"] for b in bodies) == ["o120", "o121", "o17"]
    assert {letter.reason for letter in letters} == {"poison"}
    assert all("CheckViolation" in letter.error for letter in letters)


# -- ordering, backpressure, modes ------------------------------------------------------


async def test_out_of_order_arrivals_leave_the_newest_state(
    pipeline: Pipeline, boss: Shoal
) -> None:
    base = datetime(2026, 11, 30, 8, tzinfo=UTC)
    observations = [
        Reading(
            card_id=5,
            amount=0,
            status=f"s{i}",
            observed_at=(base + timedelta(minutes=i)).isoformat(),
        )
        for i in range(40)
    ]
    random.Random(7).shuffle(observations)
    await pipeline.publish_many(READINGS, observations)
    consumer = pipeline.consumer(READINGS, apply_reading(boss.db), concurrency=10, poll=FAST)
    handle = await running(consumer)
    await wait_for(lambda: _zero(unfinished(boss, READINGS.name)), 30)
    await stopped(handle)
    assert await scalar(boss.db, "SELECT status FROM card WHERE id = 5") == "s39"
    # The sync path refuses the same older observation.
    old = Reading(
        card_id=5, amount=0, status="s3", observed_at=(base + timedelta(minutes=3)).isoformat()
    )
    await pipeline.apply_now(READINGS, pipeline.envelope(READINGS, old), apply_reading(boss.db))
    assert await scalar(boss.db, "SELECT status FROM card WHERE id = 5") == "s39"


async def test_producers_pause_past_pause_depth_and_resume_below_half(
    pipeline: Pipeline, boss: Shoal
) -> None:
    monitor = pipeline.monitor([(READINGS.name, "shoal")], pause_depth=100, alert_depth=80)
    await pipeline.publish_many(READINGS, [Reading(card_id=1, amount=1) for _ in range(101)])
    (reading,) = await monitor.check()
    assert reading.paused and reading.alerted and reading.depth.total == 101
    pipeline._admit.clear()
    assert not await pipeline.admit(READINGS)

    sub = await pipeline.transport.subscribe(READINGS.name, "shoal", max_in_flight=100)

    async def drain(n: int) -> None:
        deliveries = await sub.fetch(n, wait=timedelta(0))
        assert len(deliveries) == n
        assert await sub.ack_many(deliveries) == [None] * n

    await drain(51)  # 50 left: not below half, still paused
    assert (await monitor.check())[0].paused
    await drain(1)  # 49: below half
    (reading,) = await monitor.check()
    assert not reading.paused and reading.depth.total == 49
    pipeline._admit.clear()
    assert await pipeline.admit(READINGS)
    await sub.close()


async def test_the_mode_switch_picks_sync_or_async_within_its_cache(
    fake_pipeline: Pipeline, fake_boss: Shoal, clock: FakeClock
) -> None:
    apply = apply_reading(fake_boss.db)
    assert await fake_pipeline.mode() == "sync"  # the default
    await fake_pipeline.submit(READINGS, Reading(card_id=6, amount=2), apply)
    assert await scalar(fake_boss.db, "SELECT total FROM card WHERE id = 6") == 2
    assert await unfinished(fake_boss, READINGS.name) == 0

    other = Pipeline(fake_boss)  # another process flips the switch
    await other.config.set("ingest.mode", "async")
    await fake_pipeline.submit(READINGS, Reading(card_id=6, amount=3), apply)
    assert await unfinished(fake_boss, READINGS.name) == 0  # still sync: cached for 5 s
    clock.advance(timedelta(seconds=5))
    await fake_pipeline.submit(READINGS, Reading(card_id=6, amount=3), apply)
    assert await unfinished(fake_boss, READINGS.name) == 1  # published
    assert await scalar(fake_boss.db, "SELECT total FROM card WHERE id = 6") == 5


async def test_a_sync_apply_that_fails_transiently_is_handed_to_the_topic_not_lost(
    pipeline: Pipeline, boss: Shoal
) -> None:
    """The reference lost a write that timed out on the sync path; submit publishes it."""
    apply = apply_reading(boss.db)
    failures = [TransientError("no database connection free in time")]

    async def flaky(message: Message[Reading]) -> None:
        if failures:
            raise failures.pop()
        await apply(message)

    submitted = await pipeline.submit(READINGS, Reading(card_id=8, amount=4), flaky)
    assert submitted.route == "handed_off"
    assert isinstance(submitted.error, TransientError)
    assert await unfinished(boss, READINGS.name) == 1
    total_8 = "SELECT coalesce(max(total), 0) FROM card WHERE id = 8"
    assert await scalar(boss.db, total_8) == 0

    stop, task = await running(pipeline.consumer(READINGS, flaky, concurrency=2))
    try:

        async def applied() -> bool:
            return await scalar(boss.db, total_8) == 4

        await wait_for(applied, 30)
    finally:
        stop.set()
        await task
    assert await unfinished(boss, READINGS.name) == 0

    # A business error is the caller's: raised, and nothing is published.
    async def refuse(message: Message[Reading]) -> None:
        raise ValueError("card 9 is not ours")

    with pytest.raises(ValueError, match="card 9"):
        await pipeline.submit(READINGS, Reading(card_id=9, amount=1), refuse)
    assert await unfinished(boss, READINGS.name) == 0

    # A per-message mode overrides the switch (a priority item stays sync).
    await pipeline.config.set("ingest.mode", "async")
    published = await pipeline.submit(READINGS, Reading(card_id=10, amount=1), apply)
    kept = await pipeline.submit(READINGS, Reading(card_id=11, amount=1), apply, mode="sync")
    assert (published.route, kept.route) == ("published", "applied")
    assert await scalar(boss.db, "SELECT total FROM card WHERE id = 11") == 1


async def test_concurrent_small_publishes_share_statements_and_one_bad_one_fails_alone(
    pipeline: Pipeline, boss: Shoal
) -> None:
    good = [Reading(card_id=20 + i % 5, amount=1) for i in range(300)]
    huge = Reading(card_id=99, amount=1, status="x" * (boss.max_payload_bytes + 1))
    results = await asyncio.gather(
        *(pipeline.publish(READINGS, r) for r in good),
        pipeline.publish(READINGS, huge),
        return_exceptions=True,
    )
    failed = [r for r in results if isinstance(r, BaseException)]
    assert len(failed) == 1 and isinstance(failed[0], PublishError)
    assert "byte cap" in str(failed[0])
    assert await unfinished(boss, READINGS.name) == 300
    ids = [r for r in results if isinstance(r, str)]
    assert len(set(ids)) == 300


async def test_an_unknown_mode_is_refused_with_its_name(pipeline: Pipeline) -> None:
    with pytest.raises(InvalidInput) as refused:
        await pipeline.config.set("ingest.mode", "asynch")
    assert refused.value.field == "ingest.mode"
    assert str(refused.value) == "ingest.mode: must be one of sync, async; got 'asynch'"
    assert await pipeline.config.get("ingest.mode", "unset") == "unset"  # nothing written


def test_the_connection_budget_is_checked(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="shoal.ingest")
    assert check_connection_budget(pool_size=40, consumers=30, writers=1, reserve=20) is False
    assert any(r.levelno == logging.ERROR and "31" in r.getMessage() for r in caplog.records)
    assert check_connection_budget(pool_size=60, consumers=30, writers=1) is True


def test_the_ladder_is_the_references() -> None:
    assert [d.total_seconds() for d in DELAY_LADDER] == [5, 15, 30, 60, 120, 300]
    assert redelivery_delay(50) == timedelta(minutes=5)


# -- the Redis marker store ---------------------------------------------------------


@pytest.fixture
async def redis_client() -> AsyncIterator[Any]:
    """A real Redis: $SHOAL_TEST_REDIS_URL (.ci/run sets it and starts Redis)."""
    import os

    import redis.asyncio as redis

    url = os.environ.get("SHOAL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    client = redis.Redis.from_url(url)
    try:
        await client.ping()
    except Exception as exc:
        await client.aclose()
        if os.environ.get("CI"):
            raise AssertionError(f"Redis at {url} is required in CI: {exc}") from exc
        pytest.skip(f"NO REDIS at {url} ({exc}): the Redis marker store is NOT tested here")
    yield client
    await client.aclose()


async def test_the_redis_marker_store_skips_replays_and_tolerates_a_lost_marker(
    pipeline: Pipeline, boss: Shoal, redis_client: Any
) -> None:
    import uuid

    prefix = f"shoal-test:{uuid.uuid4()}:"
    store = RedisDoneStore(redis_client, ttl=timedelta(hours=48), prefix=prefix)
    consumer = pipeline.consumer(
        READINGS, apply_reading(boss.db), dedupe=store, concurrency=4, poll=FAST
    )
    handle = await running(consumer)
    await pipeline.publish(READINGS, Reading(card_id=8, amount=4), id="r-1")
    await wait_for(lambda: _zero(unfinished(boss, READINGS.name)))
    assert 0 < await redis_client.ttl(prefix + "r-1") <= 48 * 3600
    await pipeline.publish(READINGS, Reading(card_id=8, amount=4), id="r-1")
    await wait_for(lambda: _zero(unfinished(boss, READINGS.name)))
    assert consumer.stats.duplicates == 1
    # The marker lost (committed, then the process died before SET): the
    # replay is applied again, and the idempotent sink keeps the effect once.
    await redis_client.delete(prefix + "r-1")
    await pipeline.publish(READINGS, Reading(card_id=8, amount=4), id="r-1")
    await wait_for(lambda: scalar(boss.db, "SELECT count(*) = 2 FROM apply_call"))
    await wait_for(lambda: _zero(unfinished(boss, READINGS.name)))
    await stopped(handle)
    assert await unfinished(boss, READINGS.name) == 0
    await redis_client.delete(prefix + "r-1")


async def test_the_monitor_leader_prunes_expired_done_markers(
    fake_pipeline: Pipeline, clock: FakeClock
) -> None:
    store = fake_pipeline.dedupe
    for i in range(5):
        await store.mark(f"m{i}")
    clock.advance(timedelta(hours=47))
    await store.mark("fresh")
    monitor = fake_pipeline.monitor([])
    assert await monitor.prune() == 0
    clock.advance(timedelta(hours=1, seconds=1))
    assert await monitor.prune() == 5
    assert await store.seen(["m0", "fresh"]) == {"fresh"}


async def test_producers_whose_config_cache_ran_out_together_share_one_read(
    pipeline: Pipeline, boss: Shoal
) -> None:
    reads = entered = 0
    real = pipeline.store.config_get
    real_get = pipeline.config.get
    everyone_waits = asyncio.Event()  # the read is held until all 200 callers wait on it

    async def counted(key: str) -> Any:
        nonlocal reads
        reads += 1
        await everyone_waits.wait()
        return await real(key)

    async def get(key: str, default: Any = None) -> Any:
        nonlocal entered
        entered += 1
        if entered == 200:
            everyone_waits.set()
        return await real_get(key, default)

    pipeline.store.config_get = counted  # type: ignore[method-assign]
    pipeline.config.get = get  # type: ignore[method-assign]
    await pipeline.config.set("ingest.mode", "async")
    modes = await asyncio.gather(*(pipeline.mode() for _ in range(200)))
    pipeline.config.get = real_get  # type: ignore[method-assign]
    assert set(modes) == {"async"} and reads == 1
    # A set() in this process is seen by the next read, not hidden by one under way.
    pipeline.config._cache.clear()
    under_way = asyncio.create_task(pipeline.mode())
    await asyncio.sleep(0)  # noqa: TID251 - a yield: the read starts before the set()
    await pipeline.config.set("ingest.mode", "sync")
    await under_way
    assert await pipeline.mode() == "sync"


class BrokerDownFor:
    """The postgres transport behind a broker that refuses its first ``n`` publishes."""

    name = "postgres"

    def __init__(self, inner: PostgresTransport, n: int) -> None:
        self.inner = inner
        self.refusals = n

    async def publish(self, topic: str, envelopes: Any, **options: Any) -> None:
        if self.refusals > 0:
            self.refusals -= 1
            raise PublishError("broker down")
        await self.inner.publish(topic, envelopes, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_submit_keeps_trying_while_neither_apply_nor_publish_works(
    boss: Shoal, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="shoal.ingest")
    await create_schema(boss.db)
    broker = BrokerDownFor(PostgresTransport(boss), 2)
    pipeline = Pipeline(boss, cast(Transport, broker))

    async def overloaded(message: Message[Reading]) -> None:
        raise TransientError("no database connection free in time")

    # Two rounds fail both ways; the third hands the message to the topic.
    submitted = await pipeline.submit(READINGS, Reading(card_id=30, amount=1), overloaded)
    assert submitted.route == "handed_off" and submitted.rounds == 3 and broker.refusals == 0
    assert await unfinished(boss, READINGS.name) == 1
    assert sum("trying again" in r.getMessage() for r in caplog.records) == 2
    # It never gives up: tests/test_ingest_spool.py holds or spools past any bound.
    await pipeline.close()


async def test_an_apply_publishes_follow_ups_on_the_workers_own_pipeline(boss: Shoal) -> None:
    await create_schema(boss.db)
    follow_ups: Topic[dict[str, Any]] = Topic("card.follow_up")
    app = App()
    app.ingest_settings.transport = lambda b: PostgresTransport(b)
    app.ingest_settings.monitor = False
    seen: list[dict[str, Any]] = []

    with pytest.raises(ShoalError, match="once the app runs"):
        _ = app.pipeline

    @app.consumer(READINGS, concurrency=2, poll=FAST)
    async def apply(message: Message[Reading]) -> None:
        body = message.body
        await app.pipeline.publish(follow_ups, {"card": body.card_id}, id=f"{message.id}:next")

    @app.consumer(follow_ups, concurrency=1, poll=FAST)
    async def follow(message: Message[dict[str, Any]]) -> None:
        seen.append(message.body)

    stop = asyncio.Event()
    running_app = asyncio.create_task(app.run(boss, stop=stop, grace=timedelta(seconds=5)))
    try:
        await wait_for(lambda: app._pipeline is not None, 30)
        await app.pipeline.publish_many(READINGS, [Reading(card_id=i, amount=1) for i in (1, 2)])
        await wait_for(lambda: len(seen) == 2, 30)
    finally:
        stop.set()
        await running_app
    assert sorted(s["card"] for s in seen) == [1, 2]
    with pytest.raises(ShoalError):  # closed with the app
        _ = app.pipeline
