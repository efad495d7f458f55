"""The NATS JetStream transport against a real nats-server 2.15 (one per test).

What every transport guarantees (publish, deliver, ack, nak with a delay,
touch, term, depth, redelivery, leases) is tested on both transports in
test_transport_conformance.py. Here: what is nats's own (the durability
check, stream management, atomic batch publish, publishing through an
outage, one durable consumer per group).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats
import pytest
from nats.js.api import PersistMode, StorageType

from shoal import Shoal
from shoal.db.embedded import free_port
from shoal.errors import Conflict, TransientError
from shoal.ingest.message import Envelope, new_envelope
from shoal.ingest.nats import NatsTransport, UnsafeDurability, stream_name_for
from shoal.ingest.supervisor import IngestSettings, start_pipeline
from shoal.ingest.transport import Delivery, PublishError, Subscription
from shoal.testing import NatsServer
from tests.conftest import wait_for

TOPIC = "card.ingest"
GROUP = "writer"
FAST_RECONNECT = timedelta(milliseconds=100)


def transport_for(server: NatsServer, **options: object) -> NatsTransport:
    options.setdefault("monitor_url", server.monitor_url)
    options.setdefault("reconnect_wait", FAST_RECONNECT)
    return NatsTransport(server.url, **options)  # type: ignore[arg-type]


@pytest.fixture
async def transport(nats_server: NatsServer) -> AsyncIterator[NatsTransport]:
    t = transport_for(nats_server)
    await t.start()
    try:
        yield t
    finally:
        await t.close()


def envelopes(n: int, *, prefix: str = "m") -> list[Envelope]:
    now = datetime.now(UTC)  # noqa: TID251 - a producer's publish stamp, read by the server
    return [
        new_envelope({"i": i, "who": "ü"}, published_at=now, id=f"{prefix}-{i}") for i in range(n)
    ]


async def fetch_until(
    sub: Subscription, count: int, *, timeout_s: float = 30.0, batch: int = 500
) -> list[Delivery]:
    """Fetch until ``count`` deliveries arrived (or fail after ``timeout_s``)."""
    got: list[Delivery] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        assert time.monotonic() < deadline, f"only {len(got)} of {count} deliveries arrived"
        got.extend(await sub.fetch(min(batch, count - len(got)), wait=timedelta(seconds=0.5)))
    return got


async def test_each_group_gets_every_message(transport: NatsTransport) -> None:
    sent = envelopes(5)
    await transport.publish(TOPIC, sent)
    for group in ("writer", "audit"):
        sub = await transport.subscribe(TOPIC, group, max_in_flight=10)
        got = await fetch_until(sub, 5)
        assert sorted(d.envelope.id for d in got) == sorted(e.id for e in sent)
        for d in got:
            await d.ack()


async def test_publish_fails_within_its_timeout_while_the_server_is_down_and_is_not_buffered(
    nats_server: NatsServer, transport: NatsTransport
) -> None:
    await transport.publish(TOPIC, envelopes(1, prefix="before"))
    nats_server.kill()

    # Right after the kill (the client may not have noticed yet) and once it has.
    for attempt in ("lost-1", "lost-2"):
        # PublishError, not the outer guard's TimeoutError: the publish's own timeout fired.
        with pytest.raises(PublishError):
            await asyncio.wait_for(
                transport.publish(
                    TOPIC, envelopes(3, prefix=attempt), timeout=timedelta(seconds=1)
                ),
                30,
            )
        if attempt == "lost-1":
            await wait_for(lambda: not _connected(transport), timeout_s=30)

    await asyncio.to_thread(nats_server.restart)

    # The same transport reconnects by itself; a publish succeeds again.
    async def published() -> bool:
        try:
            await transport.publish(TOPIC, envelopes(1, prefix="after"))
        except PublishError:
            return False
        return True

    await wait_for(published, timeout_s=30)

    sub = await transport.subscribe(TOPIC, GROUP, max_in_flight=100)
    got = await fetch_until(sub, 2)
    assert await sub.fetch(100, wait=timedelta(milliseconds=500)) == []
    assert sorted(d.envelope.id for d in got) == ["after-0", "before-0"]


async def test_every_acknowledged_publish_survives_sigkill_and_restart(
    nats_server: NatsServer,
) -> None:
    """Process crash only: what nats-server wrote is in the OS page cache and survives
    SIGKILL even without fsync. Machine crashes need ``sync_interval: always``, which
    start() checks (see the durability tests); a test cannot pull the power."""
    producer = transport_for(nats_server)
    await producer.start()
    confirmed: list[str] = []
    past_2300 = asyncio.Event()

    async def publish_batches(prefix: str, batches: int) -> None:
        for b in range(batches):
            batch = envelopes(100, prefix=f"{prefix}{b}")
            await producer.publish(TOPIC, batch, timeout=timedelta(seconds=2))
            confirmed.extend(e.id for e in batch)
            if len(confirmed) >= 2_300:
                past_2300.set()

    await publish_batches("a", 20)  # 2,000 confirmed
    assert len(confirmed) == 2_000
    # Kill while more batches are in flight: the batch cut short raises; every
    # batch that returned must be there after the restart.
    racing = asyncio.create_task(publish_batches("b", 1_000))
    await asyncio.wait_for(past_2300.wait(), timeout=10)
    nats_server.kill()
    with pytest.raises(PublishError):
        await racing
    await producer.close()

    await asyncio.to_thread(nats_server.restart)
    consumer = transport_for(nats_server)
    await consumer.start()
    try:
        sub = await consumer.subscribe(TOPIC, GROUP, max_in_flight=5_000)
        received: set[str] = set()
        deadline = time.monotonic() + 15
        while not set(confirmed) <= received:
            assert time.monotonic() < deadline, f"{len(set(confirmed) - received)} lost"
            for d in await sub.fetch(1_000, wait=timedelta(milliseconds=500)):
                received.add(d.envelope.id)
                await d.ack()
        assert set(confirmed) <= received
    finally:
        await consumer.close()


async def test_one_call_publishes_a_large_batch(transport: NatsTransport) -> None:
    # More than max_ack_pending at once; a generous deadline: every message is fsynced.
    await transport.publish(TOPIC, envelopes(3_000), timeout=timedelta(seconds=60))
    assert (await transport.depth(TOPIC, GROUP)).ready == 3_000


async def test_start_rejects_a_server_without_sync_always(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "unsafe", sync_always=False).start()
    try:
        t = transport_for(server)
        with pytest.raises(UnsafeDurability, match="sync_interval"):
            await t.start()
        await t.close()
    finally:
        server.stop()


async def test_start_with_allow_unsafe_sync_goes_on_and_logs_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = NatsServer(tmp_path / "unsafe", sync_always=False).start()
    t = transport_for(server, allow_unsafe_sync=True)
    try:
        with caplog.at_level(logging.ERROR, logger="shoal.ingest.nats"):
            await t.start()
        assert any("sync_interval" in r.getMessage() for r in caplog.records)
        await t.publish(TOPIC, envelopes(1))
    finally:
        await t.close()
        server.stop()


async def test_start_accepts_sync_always(nats_server: NatsServer) -> None:
    t = transport_for(nats_server)
    await t.start()
    await t.start()  # idempotent
    await t.close()


async def test_start_without_monitor_url_warns_that_durability_is_unverified(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    t = transport_for(nats_server, monitor_url=None)
    with caplog.at_level(logging.WARNING, logger="shoal.ingest.nats"):
        await t.start()
    await t.close()
    assert any("durability not verified" in r.getMessage() for r in caplog.records)


async def add_memory_stream(server: NatsServer) -> None:
    """TOPIC's stream, made by someone else with memory storage (which shoal refuses)."""
    nc = await nats.connect(server.url)
    try:
        await nc.jetstream().add_stream(
            name=stream_name_for("SHOAL", TOPIC),
            subjects=[f"shoal.{TOPIC}"],
            storage=StorageType.MEMORY,
        )
    finally:
        await nc.close()


async def test_existing_stream_with_memory_storage_is_refused(nats_server: NatsServer) -> None:
    await add_memory_stream(nats_server)
    t = transport_for(nats_server, topics=[TOPIC])
    with pytest.raises(Conflict, match="memory storage"):
        await t.start()
    await t.close()


async def test_a_worker_refused_by_a_stream_leaves_no_connection_behind(
    boss: Shoal, nats_server: NatsServer
) -> None:
    # A worker in this process whose transport connects, then refuses the
    # topic's stream: the refusal reaches the caller, and the connection
    # closes (it would otherwise reconnect, and log, for the life of the process).
    await add_memory_stream(nats_server)
    settings = IngestSettings(transport=lambda _: transport_for(nats_server, topics=[TOPIC]))
    with pytest.raises(Conflict, match="memory storage"):
        await start_pipeline(boss, settings, stop=asyncio.Event())

    async def no_connection() -> bool:
        connz = await asyncio.to_thread(nats_server.monitor, "connz")
        return int(connz["num_connections"]) == 0

    await wait_for(no_connection, 10)


async def test_topics_mapping_to_the_same_stream_name_are_refused(
    transport: NatsTransport,
) -> None:
    await transport.publish("a.b", envelopes(1))
    with pytest.raises(Conflict, match="same stream name"):
        await transport.publish("a_b", envelopes(1))


async def test_redelivered_duplicate_id_within_window_is_stored_once(
    transport: NatsTransport,
) -> None:
    batch = envelopes(3, prefix=uuid.uuid4().hex)
    await transport.publish(TOPIC, batch)
    await transport.publish(TOPIC, batch)  # a retry after a lost PubAck
    assert (await transport.depth(TOPIC, GROUP)).ready == 3


async def test_subscribing_again_with_new_limits_keeps_the_groups_position(
    transport: NatsTransport,
) -> None:
    await transport.publish(TOPIC, envelopes(4))
    sub = await transport.subscribe(TOPIC, GROUP, max_in_flight=10)
    for d in await fetch_until(sub, 2, batch=2):
        await d.ack()
    await sub.close()
    # A redeploy with another concurrency: the group goes on where it was.
    sub = await transport.subscribe(TOPIC, GROUP, max_in_flight=1, ack_wait=timedelta(seconds=30))
    (d,) = await fetch_until(sub, 1, batch=5)
    assert d.envelope.id == "m-2"
    # max_in_flight=1: nothing more is handed out until that one is acked.
    assert await sub.fetch(5, wait=timedelta(milliseconds=300)) == []
    await d.ack()
    (last,) = await fetch_until(sub, 1, batch=5)
    assert last.envelope.id == "m-3"


async def test_start_fails_within_connect_timeout_when_no_server_answers() -> None:
    t = NatsTransport(
        f"nats://127.0.0.1:{free_port()}",
        monitor_url=None,
        connect_timeout=timedelta(seconds=1),
        reconnect_wait=FAST_RECONNECT,
    )
    # TransientError, not the outer guard's TimeoutError: the connect timeout fired.
    with pytest.raises(TransientError, match="cannot connect"):
        await asyncio.wait_for(t.start(), 30)
    with pytest.raises(PublishError):
        await t.publish(TOPIC, envelopes(1))


def _connected(transport: NatsTransport) -> bool:
    """Whether the transport's client still believes it is connected."""
    nc = transport._nc
    return nc is not None and nc.is_connected


async def set_max_msgs(server: NatsServer, topic: str, max_msgs: int) -> None:
    """Change the stream's message limit behind the transport's back, as an operator would."""
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream_name_for("SHOAL", topic))
        await js.update_stream(dataclasses.replace(info.config, max_msgs=max_msgs))
    finally:
        await nc.close()


async def stored_ids(transport: NatsTransport, count: int) -> list[str]:
    """The ids of the first ``count`` messages of the topic, for a group of its own."""
    sub = await transport.subscribe(TOPIC, f"check-{uuid.uuid4().hex[:8]}", max_in_flight=5_000)
    got = await fetch_until(sub, count)
    assert await sub.fetch(10, wait=timedelta(milliseconds=300)) == []
    await sub.close()
    return [d.envelope.id for d in got]


async def test_a_refused_batch_stores_nothing_of_itself(
    nats_server: NatsServer, transport: NatsTransport
) -> None:
    await transport.publish(TOPIC, envelopes(1, prefix="first"))
    await set_max_msgs(nats_server, TOPIC, 10)
    # One atomic batch of 15 does not fit in the 9 places left: none of it is stored,
    # where one publish per message would have stored 9 and refused 6.
    with pytest.raises(PublishError, match="refused"):
        await transport.publish(TOPIC, envelopes(15))
    assert (await transport.depth(TOPIC, GROUP)).ready == 1


async def test_a_call_that_fails_midway_is_stored_exactly_once_by_its_retry(
    nats_server: NatsServer,
) -> None:
    transport = transport_for(nats_server, max_batch=5)
    await transport.start()
    try:
        await transport.publish(TOPIC, envelopes(1, prefix="first"))
        await set_max_msgs(nats_server, TOPIC, 12)
        call = envelopes(15)  # three batches of 5; only two fit
        with pytest.raises(PublishError, match=r"\d+ of 15 messages were confirmed"):
            await transport.publish(TOPIC, call)
        assert (await transport.depth(TOPIC, GROUP)).ready == 11

        await set_max_msgs(nats_server, TOPIC, -1)
        # The retry's stored batches hold known ids: the server refuses them whole,
        # and the transport then publishes them one by one, which drops the known ids.
        await transport.publish(TOPIC, call)
        ids = await stored_ids(transport, 16)
        assert sorted(ids) == sorted(["first-0", *(e.id for e in call)])
    finally:
        await transport.close()


async def test_a_stream_made_without_atomic_publish_is_upgraded_in_place(
    nats_server: NatsServer,
) -> None:
    # What a shoal before atomic batches created: the same stream, allow_atomic unset.
    old = transport_for(nats_server)
    nc = await nats.connect(nats_server.url)
    try:
        config = dataclasses.replace(old._streams.config(TOPIC), allow_atomic=None)
        await nc.jetstream().add_stream(config)
        await nc.jetstream().publish(f"shoal.{TOPIC}", envelopes(1, prefix="old")[0].encode())
    finally:
        await nc.close()

    transport = transport_for(nats_server, topics=[TOPIC])
    await transport.start()
    try:
        nc = await nats.connect(nats_server.url)
        try:
            info = await nc.jetstream().stream_info(stream_name_for("SHOAL", TOPIC))
        finally:
            await nc.close()
        assert info.config.allow_atomic is True
        await transport.publish(TOPIC, envelopes(3, prefix="new"))
        assert sorted(await stored_ids(transport, 4)) == ["new-0", "new-1", "new-2", "old-0"]
    finally:
        await transport.close()


async def add_async_persist_stream(server: NatsServer) -> None:
    """TOPIC's stream as shoal makes it, but acknowledging before it writes (ADR-56)."""
    nc = await nats.connect(server.url)
    try:
        config = dataclasses.replace(
            transport_for(server)._streams.config(TOPIC),
            allow_atomic=None,
            persist_mode=PersistMode.ASYNC,
        )
        await nc.jetstream().add_stream(config)
    finally:
        await nc.close()


async def test_a_stream_in_async_persist_mode_is_refused(nats_server: NatsServer) -> None:
    await add_async_persist_stream(nats_server)
    t = transport_for(nats_server, topics=[TOPIC])
    with pytest.raises(UnsafeDurability, match="persist_mode 'async'"):
        await t.start()
    await t.close()


async def test_a_stream_that_cannot_take_atomic_publish_is_published_one_at_a_time(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    # Async persist mode excludes atomic batches; allow_unsafe_sync accepts the stream.
    await add_async_persist_stream(nats_server)
    t = transport_for(nats_server, allow_unsafe_sync=True)
    await t.start()
    try:
        with caplog.at_level(logging.WARNING, logger="shoal.ingest.nats"):
            await t.publish(TOPIC, envelopes(5))
        assert any("one message at a time" in r.getMessage() for r in caplog.records)
        batch = envelopes(5)
        await t.publish(TOPIC, batch)  # again: JetStream drops the known ids
        assert sorted(await stored_ids(t, 5)) == sorted(e.id for e in batch)
    finally:
        await t.close()
