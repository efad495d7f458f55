"""The same consumers, sinks and switches on the nats transport (a real nats-server 2.15).

tests/test_ingest.py covers them in depth on the postgres transport; here the
behaviours that depend on the transport: delivery, de-duplication, business
errors, poison rows, the backlog reading, and an outage of the server, which
must fail a publish within its timeout and, in async mode, degrade that
message to the sync path.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from shoal import Shoal
from shoal.ingest.message import Message
from shoal.ingest.nats import NatsTransport
from shoal.ingest.pipeline import Pipeline
from shoal.ingest.transport import PublishError
from shoal.testing import NatsServer
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
from tests.test_ingest import records, running, stopped

FAST = timedelta(milliseconds=50)


@pytest.fixture
async def pipeline(boss: Shoal, nats_server: NatsServer) -> AsyncIterator[Pipeline]:
    await create_schema(boss.db)
    transport = NatsTransport(
        nats_server.url,
        monitor_url=nats_server.monitor_url,
        request_timeout=timedelta(seconds=1),
    )
    p = Pipeline(boss, transport)
    await p.start()
    yield p
    await p.close()


async def drained(pipeline: Pipeline, topic: str) -> bool:
    return (await pipeline.transport.depth(topic, "shoal")).total == 0


async def test_messages_are_applied_once_with_replays_acknowledged(
    pipeline: Pipeline, boss: Shoal
) -> None:
    await pipeline.publish_many(READINGS, [Reading(card_id=i % 10, amount=1) for i in range(500)])
    consumer = pipeline.consumer(READINGS, apply_reading(boss.db), concurrency=30, poll=FAST)
    handle = await running(consumer)
    await wait_for(lambda: scalar(boss.db, "SELECT count(*) = 500 FROM applied"), 30)
    # Replays of applied ids (a redelivery after a lost ack, a producer retry).
    await pipeline.publish(READINGS, Reading(card_id=1, amount=1), id="again")
    await wait_for(lambda: scalar(boss.db, "SELECT count(*) = 501 FROM applied"))
    # JetStream drops a second publish of an id within its 2-minute window;
    # later replays (and redeliveries) meet the 48 h done-marker instead.
    # The server has answered the publish: had it kept the message, the topic
    # would not read drained until the consumer applied and acknowledged it.
    await pipeline.publish(READINGS, Reading(card_id=1, amount=1), id="again")
    await wait_for(lambda: drained(pipeline, READINGS.name))
    await stopped(handle)
    assert await scalar(boss.db, "SELECT sum(total) FROM card") == 501
    assert await scalar(boss.db, "SELECT count(*) FROM apply_call") == 501


async def test_business_errors_are_acknowledged_and_kept(
    pipeline: Pipeline, boss: Shoal, caplog: pytest.LogCaptureFixture
) -> None:
    async def reject(message: Message[Reading]) -> None:
        raise ValueError("unknown card")

    caplog.set_level(logging.WARNING, logger="shoal.ingest")
    consumer = pipeline.consumer(READINGS, reject, concurrency=2, poll=FAST)
    handle = await running(consumer)
    await pipeline.publish(READINGS, Reading(card_id=1, amount=1), id="bad-1")
    await wait_for(lambda: consumer.stats.business_errors == 1)
    await wait_for(lambda: drained(pipeline, READINGS.name))
    await stopped(handle)
    (letter,) = await pipeline.store.dead_letters(READINGS.name)
    assert (letter.message_id, letter.reason) == ("bad-1", "business")
    assert any(r.levelno == logging.WARNING and "bad-1" in r.getMessage() for r in caplog.records)


async def test_a_sink_writes_good_rows_and_dead_letters_poison(
    pipeline: Pipeline, boss: Shoal
) -> None:
    await pipeline.publish_many(COLLECTION, records(300, bad={5, 250}))
    sink = pipeline.batch_consumer(
        COLLECTION, lambda ms: write_collection(boss.db, ms), batch_size=200, poll=FAST
    )
    handle = await running(sink)
    await wait_for(lambda: scalar(boss.db, "SELECT count(*) = 298 FROM collection"), 20)
    await wait_for(lambda: drained(pipeline, COLLECTION.name), 10)
    await stopped(handle)
    letters = await pipeline.store.dead_letters(COLLECTION.name)
    ids = sorted(json.loads(letter.envelope_json)["body"]["observation_id"] for letter in letters)
    assert ids == ["o250", "o5"]


async def test_an_outage_fails_the_publish_in_time_and_async_mode_degrades_to_sync(
    pipeline: Pipeline, boss: Shoal, nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    await pipeline.config.set("ingest.mode", "async")
    apply = apply_reading(boss.db)
    await pipeline.submit(READINGS, Reading(card_id=7, amount=1), apply, id="up")
    assert await scalar(boss.db, "SELECT count(*) FROM applied") == 0  # published, not applied

    nats_server.kill()
    # The publish fails (its own timeout) instead of waiting in the client's
    # reconnect buffer for a server that is gone; the ceiling only keeps a
    # buffered publish from hanging the test.
    async with asyncio.timeout(60):
        with pytest.raises(PublishError):
            await pipeline.publish(READINGS, Reading(card_id=7, amount=1), id="lost?")

    caplog.set_level(logging.WARNING, logger="shoal.ingest")
    await pipeline.submit(READINGS, Reading(card_id=7, amount=2), apply, id="down")
    # Applied in place, with a WARN, by the very apply the consumer runs.
    assert await scalar(boss.db, "SELECT total FROM card WHERE id = 7") == 2
    assert any("applying it synchronously" in r.getMessage() for r in caplog.records)

    nats_server.restart()
    consumer = pipeline.consumer(READINGS, apply, concurrency=2, poll=FAST)
    handle = await running(consumer)
    await wait_for(lambda: scalar(boss.db, "SELECT total = 3 FROM card WHERE id = 7"), 20)
    await wait_for(lambda: drained(pipeline, READINGS.name), 10)
    await stopped(handle)
    # The failed publish was never stored, so it never arrives; the degraded one
    # is not applied twice.
    assert await scalar(boss.db, "SELECT count(*) FROM applied") == 2
    assert await scalar(boss.db, "SELECT total FROM card WHERE id = 7") == 3


async def test_the_monitor_reads_the_nats_backlog(pipeline: Pipeline) -> None:
    await pipeline.publish_many(READINGS, [Reading(card_id=1, amount=1) for _ in range(30)])
    sub = await pipeline.transport.subscribe(READINGS.name, "shoal", max_in_flight=10)
    taken = await sub.fetch(10, wait=timedelta(seconds=2))
    monitor = pipeline.monitor([(READINGS.name, "shoal")], pause_depth=25, alert_depth=20)
    (reading,) = await monitor.check()
    assert (reading.depth.ready, reading.depth.in_flight, reading.depth.total) == (20, 10, 30)
    assert reading.paused and reading.alerted
    assert not await pipeline.admit(READINGS)
    for delivery in taken:
        await delivery.ack()
    await sub.close()
