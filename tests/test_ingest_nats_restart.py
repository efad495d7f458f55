"""A consumer on the nats transport outlives a nats-server that is killed and restarted.

The server is killed with SIGKILL while the consumer has deliveries in hand,
so their acks are refused (nats-py sends nothing while it reconnects:
"outbound buffer limit exceeded"). After the restart the consumer must go on
fetching by itself: the messages whose acks were lost come back after their
ack wait and are dropped by their done-markers, and messages published after
the restart are applied too.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta

import pytest

from shoal import Shoal
from shoal.ingest.dedupe import DoneStore
from shoal.ingest.message import Message
from shoal.ingest.nats import NatsTransport
from shoal.ingest.pipeline import Pipeline
from shoal.ingest.transport import PublishError
from shoal.testing import NatsServer
from tests.conftest import wait_for
from tests.ingest_helpers import READINGS, Reading, apply_reading, create_schema, scalar
from tests.test_ingest import running, stopped

FAST = timedelta(milliseconds=50)
# JetStream's redelivery timer runs on the server's wall clock: a delivery
# whose ack was lost with the server comes back this long after the restart.
ACK_WAIT = timedelta(seconds=1)


@pytest.fixture
async def pipeline(boss: Shoal, nats_server: NatsServer) -> AsyncIterator[Pipeline]:
    await create_schema(boss.db)
    transport = NatsTransport(
        nats_server.url,
        monitor_url=nats_server.monitor_url,
        request_timeout=timedelta(seconds=1),
        reconnect_wait=timedelta(milliseconds=100),
    )
    p = Pipeline(boss, transport)
    await p.start()
    yield p
    await p.close()


class HeldDoneStore:
    """The pipeline's done-markers, with the first check that finds a duplicate held.

    It answers once ``release`` is set, so the consumer acknowledges those
    duplicates just when the test wants: with the server gone.
    """

    def __init__(self, markers: DoneStore) -> None:
        self.markers = markers
        self.holding = asyncio.Event()
        self.release = asyncio.Event()

    async def seen(self, ids: Sequence[str]) -> set[str]:
        found = await self.markers.seen(ids)
        if found and not self.holding.is_set():
            self.holding.set()
            await self.release.wait()
        return found

    async def mark(self, message_id: str) -> None:
        await self.markers.mark(message_id)

    async def close(self) -> None:
        await self.markers.close()


async def test_a_consumer_resumes_after_the_server_is_killed_with_acks_in_flight(
    pipeline: Pipeline, boss: Shoal, nats_server: NatsServer
) -> None:
    first = 300
    now = datetime.now(UTC)  # noqa: TID251 - a producer's stamp, as the pipeline writes it
    ids = await pipeline.publish_many(
        READINGS, [Reading(card_id=i % 10, amount=1) for i in range(first)]
    )
    # Every fifth message was applied before, by a worker killed before its
    # ack: in effect already and marked done, so the first fetch holds duplicates.
    apply = apply_reading(boss.db)
    replayed = list(range(0, first, 5))
    for i in replayed:
        await apply(Message(ids[i], READINGS.name, Reading(card_id=i % 10, amount=1), now, 1))
        await pipeline.dedupe.mark(ids[i])

    markers = HeldDoneStore(pipeline.dedupe)
    consumer = pipeline.consumer(
        READINGS, apply, dedupe=markers, concurrency=10, poll=FAST, ack_wait=ACK_WAIT
    )
    handle = await running(consumer)
    # A fetch is in hand, its duplicates found; the server dies before they are acknowledged.
    await asyncio.wait_for(markers.holding.wait(), 30)
    nats_server.kill()
    await wait_for(lambda: not _connected(pipeline), 30)
    markers.release.set()
    await asyncio.to_thread(nats_server.start)

    # Everything published before the kill takes effect once.
    await wait_for(lambda: _applied_is(boss, first, handle[1]), 60)
    # The consumer goes on with what is published after the restart.
    await _publish_when_connected(pipeline, [Reading(card_id=1, amount=1) for _ in range(50)])
    await wait_for(lambda: _applied_is(boss, first + 50, handle[1]), 60)
    await stopped(handle)
    assert await scalar(boss.db, "SELECT sum(total) FROM card") == first + 50


def _connected(pipeline: Pipeline) -> bool:
    transport = pipeline.transport
    assert isinstance(transport, NatsTransport)
    return transport._nc is not None and transport._nc.is_connected


async def _applied_is(boss: Shoal, n: int, consumer: asyncio.Task[None]) -> bool:
    if consumer.done():
        raise AssertionError(f"the consumer ended: {consumer.exception()!r}")
    return int(await scalar(boss.db, "SELECT count(*) FROM applied")) == n


async def _publish_when_connected(pipeline: Pipeline, readings: list[Reading]) -> None:
    async def published() -> bool:
        try:
            await pipeline.publish_many(READINGS, readings)
        except PublishError:
            return False
        return True

    await wait_for(published, 30)
