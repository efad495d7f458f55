"""A three-server JetStream cluster loses nothing when its stream leaders are SIGKILLed.

Three nats-servers clustered on loopback (shoal.testing.NatsCluster),
the topic's stream and its consumer kept on all three (``replicas=3``), the
transport given every server's URL. While a publisher sends ``MESSAGES``
messages in calls of ``CHUNK``, the stream's leader is SIGKILLed; once
publishing has gone on without it, it is restarted and, when it has caught
up, the new leader is killed and restarted the same way. A call that fails
(its server gone, the stream electing a leader) is published again with the
same ids, as a producer must. A batch sink writes every delivery to its table
with ``ON CONFLICT DO NOTHING``.

What a user relies on: every acknowledged message is in the sink's table
exactly once (none lost; redeliveries and re-published duplicates absorbed),
and publishing goes on while a killed server is still down: it pauses for the
election, not for the restart. The longest pause is printed, not asserted.

``SHOAL_CLUSTER_MESSAGES=50000 pytest tests/test_nats_cluster.py -s`` runs the
issue's full size (about a minute here); the default keeps the test short.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from shoal import Shoal
from shoal.errors import InvalidInput
from shoal.ingest.message import Envelope, Message, new_envelope
from shoal.ingest.nats import NatsTransport, UnsafeDurability, stream_name_for
from shoal.ingest.pipeline import Pipeline
from shoal.ingest.transport import PublishError
from shoal.testing import NatsCluster, NatsServer
from tests.conftest import wait_for
from tests.ingest_helpers import COLLECTION, create_schema, scalar, write_collection
from tests.test_ingest import running, stopped

MESSAGES = int(os.environ.get("SHOAL_CLUSTER_MESSAGES", "12000"))
CHUNK = 250
STREAM = stream_name_for("SHOAL", COLLECTION.name)
OBSERVED_AT = "2026-01-01T00:00:00+00:00"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    cluster = NatsCluster(tmp_path / "nats").start()
    try:
        yield cluster
    finally:
        cluster.stop()


def cluster_transport(cluster: NatsCluster, **options: Any) -> NatsTransport:
    return NatsTransport(
        cluster.urls,
        monitor_url=cluster.monitor_urls,
        request_timeout=timedelta(seconds=2),
        reconnect_wait=timedelta(milliseconds=100),
        **options,
    )


@pytest.fixture
async def pipeline(boss: Shoal, cluster: NatsCluster) -> AsyncIterator[Pipeline]:
    await create_schema(boss.db)
    p = Pipeline(boss, cluster_transport(cluster, replicas=3, topics=[COLLECTION.name]))
    await p.start()
    yield p
    await p.close()


@dataclass
class Publisher:
    """Publishes every chunk until it is acknowledged, the same ids each time."""

    transport: NatsTransport
    chunks: list[list[Envelope]]
    acknowledged: int = 0
    failures: int = 0
    longest_pause_s: float = 0.0
    progress: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        last_ack = loop.time()
        for chunk in self.chunks:
            while True:
                try:
                    await self.transport.publish(
                        COLLECTION.name, chunk, timeout=timedelta(seconds=3)
                    )
                    break
                except PublishError:
                    self.failures += 1
                    # A moment for the client to reconnect or the stream to
                    # elect a leader; the next try is the pause's end.
                    await asyncio.sleep(0.05)  # noqa: TID251 - a producer's retry pause
            now = loop.time()
            self.longest_pause_s = max(self.longest_pause_s, now - last_ack)
            last_ack = now
            async with self.progress:
                self.acknowledged += len(chunk)
                self.progress.notify_all()

    async def reached(self, count: int) -> None:
        async with self.progress:
            await asyncio.wait_for(self.progress.wait_for(lambda: self.acknowledged >= count), 60)


def replicas_current(cluster: NatsCluster, stream: str) -> bool:
    """Whether every replica of ``stream`` is running and caught up with its leader."""
    leader = cluster.stream_leader(stream)
    if leader is None:
        return False
    for account in leader.monitor("jsz?streams=true").get("account_details") or []:
        for detail in account.get("stream_detail") or []:
            if detail.get("name") == stream:
                replicas = (detail.get("cluster") or {}).get("replicas") or []
                return len(replicas) == 2 and all(
                    r.get("current") and not r.get("offline") for r in replicas
                )
    return False


async def kill_and_restart(
    cluster: NatsCluster, publisher: Publisher, victim: NatsServer, *, until: int
) -> None:
    """SIGKILL ``victim``; restart it once ``until`` messages are acknowledged, and wait
    until every replica has caught up."""
    victim.kill()
    # Publishing goes on while the killed server is down: only an election stands between.
    await publisher.reached(until)
    assert not victim.is_running
    await asyncio.to_thread(victim.start)
    await wait_for(lambda: asyncio.to_thread(replicas_current, cluster, STREAM), 30, interval_s=0.1)


def leader_of_stream(cluster: NatsCluster) -> NatsServer:
    leader = cluster.stream_leader(STREAM)
    assert leader is not None, "the stream has no leader"
    return leader


@pytest.mark.slow
async def test_every_acknowledged_message_is_written_once_while_stream_leaders_are_killed(
    pipeline: Pipeline, boss: Shoal, cluster: NatsCluster
) -> None:
    transport = pipeline.transport
    assert isinstance(transport, NatsTransport)
    _, js = transport._connected()
    assert (await js.stream_info(STREAM)).config.num_replicas == 3

    envelopes = [
        new_envelope(
            {"observation_id": f"o{i}", "observed_at": OBSERVED_AT, "value": i},
            published_at=datetime.now(UTC),  # noqa: TID251 - a producer's stamp
            id=f"m{i}",
        )
        for i in range(MESSAGES)
    ]
    publisher = Publisher(transport, [envelopes[i : i + CHUNK] for i in range(0, MESSAGES, CHUNK)])
    delivered = 0

    async def write(messages: list[Message[Any]]) -> None:
        nonlocal delivered
        await write_collection(boss.db, messages)
        delivered += len(messages)

    sink = pipeline.batch_consumer(
        COLLECTION,
        write,
        batch_size=500,
        poll=timedelta(milliseconds=50),
        ack_wait=timedelta(seconds=5),
    )
    handle = await running(sink)
    publishing = asyncio.create_task(publisher.run())
    try:
        await publisher.reached(MESSAGES // 5)
        first = leader_of_stream(cluster)
        await kill_and_restart(cluster, publisher, first, until=2 * MESSAGES // 5)
        # Then another server: the leader elected meanwhile, unless leadership
        # went back to the restarted one (then one of the others).
        second = leader_of_stream(cluster)
        if second is first:
            second = next(s for s in cluster.servers if s is not first)
        await kill_and_restart(cluster, publisher, second, until=3 * MESSAGES // 5)
        await asyncio.wait_for(publishing, 120)
        await wait_for(
            lambda: scalar(boss.db, f"SELECT count(*) >= {MESSAGES} FROM collection"), 60
        )
    finally:
        publishing.cancel()
        await asyncio.gather(publishing, return_exceptions=True)
        await stopped(handle)

    rows = await scalar(boss.db, "SELECT count(*) FROM collection")
    distinct = await scalar(boss.db, "SELECT count(DISTINCT observation_id) FROM collection")
    values = await scalar(boss.db, "SELECT sum(value) FROM collection")
    assert (rows, distinct) == (MESSAGES, MESSAGES)
    assert values == MESSAGES * (MESSAGES - 1) // 2  # the same messages, not just as many
    print(
        f"\n{MESSAGES} messages through two leader kills: {publisher.failures} failed publish "
        f"calls retried, longest pause between acknowledged calls "
        f"{publisher.longest_pause_s:.2f}s, {delivered - MESSAGES} duplicate deliveries absorbed"
    )


async def test_start_refuses_more_replicas_than_the_cluster_has_servers(
    cluster: NatsCluster,
) -> None:
    transport = cluster_transport(cluster, replicas=5)
    with pytest.raises(InvalidInput, match=r"replicas: 5: .* cluster of 3 servers"):
        await transport.start()
    await transport.close()


async def test_one_replica_in_a_cluster_is_a_warning(
    cluster: NatsCluster, caplog: pytest.LogCaptureFixture
) -> None:
    transport = cluster_transport(cluster, replicas=1)
    with caplog.at_level(logging.WARNING, logger="shoal.ingest.nats"):
        await transport.start()
    await transport.close()
    assert any("replicas=1 in a JetStream cluster of 3" in r.getMessage() for r in caplog.records)


async def test_a_member_without_sync_always_is_refused(tmp_path: Path) -> None:
    cluster = NatsCluster(tmp_path / "unsafe", sync_always=False).start()
    try:
        transport = cluster_transport(cluster, replicas=3)
        with pytest.raises(UnsafeDurability, match="sync_interval"):
            await transport.start()
        await transport.close()
    finally:
        cluster.stop()


async def test_a_member_down_at_start_is_a_warning_and_the_transport_starts(
    cluster: NatsCluster, caplog: pytest.LogCaptureFixture
) -> None:
    down = cluster.servers[0]
    down.kill()
    transport = cluster_transport(cluster, replicas=3)
    with caplog.at_level(logging.WARNING, logger="shoal.ingest.nats"):
        await transport.start()
    await transport.close()
    assert any(
        down.monitor_url in r.getMessage() and "not checked" in r.getMessage()
        for r in caplog.records
    )


async def test_a_stream_made_with_one_replica_is_raised_to_the_configured_replicas(
    cluster: NatsCluster,
) -> None:
    single = cluster_transport(cluster, replicas=1, topics=[COLLECTION.name])
    await single.start()
    _, js = single._connected()
    assert (await js.stream_info(STREAM)).config.num_replicas == 1
    await single.close()
    replicated = cluster_transport(cluster, replicas=3, topics=[COLLECTION.name])
    await replicated.start()
    _, js = replicated._connected()
    assert (await js.stream_info(STREAM)).config.num_replicas == 3
    await replicated.close()
