"""Ingest under real failures: worker processes killed with SIGKILL, PostgreSQL
restarted with ``-m immediate``, nats-server killed and restarted, all mid-stream.

Every published message must be applied exactly once in effect: the readings'
totals and the collection rows come out exactly as published, whatever was
delivered twice. The worker is ``shoal worker --app tests.ingestapp:app``.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from shoal import Shoal
from shoal.db import Database
from shoal.db.embedded import EmbeddedPostgres
from shoal.db.migrate import migrate
from shoal.errors import TransientError
from shoal.ingest.pipeline import Pipeline
from shoal.ingest.postgres import PostgresTransport
from shoal.ingest.transport import Transport
from shoal.testing import NatsServer
from tests.conftest import wait_for
from tests.ingest_helpers import COLLECTION, READINGS, Reading, create_schema, scalar
from tests.test_processes import WorkerProcesses

READING_COUNT = 6000
RECORD_COUNT = 3000
CARDS = 100


def collection_records(n: int) -> list[dict[str, Any]]:
    base = datetime(2026, 11, 30, tzinfo=UTC)
    return [
        {
            "observation_id": f"o{i}",
            "observed_at": (base + timedelta(seconds=i)).isoformat(),
            "value": i,
        }
        for i in range(n)
    ]


class Setup:
    """The test's publisher and the environment its worker processes get."""

    def __init__(self, boss: Shoal, transport: Transport, env: dict[str, str]) -> None:
        self.boss = boss
        self.pipeline = Pipeline(boss, transport)
        self.env = env
        self.last_seen = ""

    async def publish_all(self) -> None:
        await self.pipeline.start()
        readings = [Reading(card_id=i % CARDS, amount=1) for i in range(READING_COUNT)]
        for start in range(0, READING_COUNT, 1000):
            await self.pipeline.publish_many(READINGS, readings[start : start + 1000])
        await self.pipeline.publish_many(COLLECTION, collection_records(RECORD_COUNT))

    async def applied(self) -> int:
        return int(await scalar(self.boss.db, "SELECT count(*) FROM applied"))

    async def all_done(self) -> bool:
        try:
            applied = await self.applied()
            rows = await scalar(self.boss.db, "SELECT count(*) FROM collection")
        except TransientError as exc:  # the test's own connection, across a restart
            self.last_seen = f"unreadable: {exc}"
            return False
        self.last_seen = f"{applied} readings applied, {rows} collection rows"
        return bool(applied == READING_COUNT and rows == RECORD_COUNT)

    async def wait_all_done(self, timeout_s: float) -> None:
        try:
            await wait_for(self.all_done, timeout_s)
        except AssertionError:
            raise AssertionError(f"not all applied in {timeout_s}s: {self.last_seen}") from None

    async def check_exactly_once_in_effect(self) -> None:
        assert await self.applied() == READING_COUNT
        assert await scalar(self.boss.db, "SELECT sum(total) FROM card") == READING_COUNT
        assert await scalar(
            self.boss.db, "SELECT min(total) FROM card WHERE id < %s", (CARDS,)
        ) == (READING_COUNT // CARDS)
        assert await scalar(self.boss.db, "SELECT count(*) FROM collection") == RECORD_COUNT
        assert await scalar(self.boss.db, "SELECT sum(value) FROM collection") == sum(
            range(RECORD_COUNT)
        )
        for topic in (READINGS.name, COLLECTION.name):
            await wait_for(lambda t=topic: _drained(self.pipeline, t), 30)

    async def close(self) -> None:
        await self.pipeline.close()


async def _drained(pipeline: Pipeline, topic: str) -> bool:
    return (await pipeline.transport.depth(topic, "shoal")).total == 0


async def make_setup(url: str, transport_kind: str, nats: NatsServer | None) -> Setup:
    db = await Database(url, max_size=10, application_name="shoal-test").open()
    await migrate(db)
    boss = Shoal(db, listen=False)
    await create_schema(db)
    if transport_kind == "nats":
        from shoal.ingest.nats import NatsTransport

        assert nats is not None
        transport: Transport = NatsTransport(nats.url, monitor_url=nats.monitor_url)
        env = {
            "SHOAL_INGEST_TRANSPORT": "nats",
            "SHOAL_NATS_URL": nats.url,
            "SHOAL_NATS_MONITOR_URL": nats.monitor_url,
        }
    else:
        transport = PostgresTransport(boss)
        env = {"SHOAL_INGEST_TRANSPORT": "postgres"}
    return Setup(boss, transport, env)


@pytest.fixture
async def setup(db_url: str, transport_kind: str, nats: NatsServer | None) -> AsyncIterator[Setup]:
    s = await make_setup(db_url, transport_kind, nats)
    try:
        yield s
    finally:
        await s.close()
        await s.boss.close()


@pytest.fixture
def durable_pg(pg_dir: Path) -> Iterator[EmbeddedPostgres]:
    """A cluster of the test's own with fsync and synchronous_commit on (the defaults).

    ``throwaway_pg`` turns them off for speed, and with them off a commit that
    was acknowledged can vanish in a crash: a consumer on another transport
    would then have acknowledged a message whose effect is gone.
    """
    server = EmbeddedPostgres(pg_dir / "pg", fsync=True)
    server.start()
    try:
        yield server
    finally:
        server.stop("immediate")


def ingest_workers(url: str, tmp_path: Path, env: dict[str, str]) -> WorkerProcesses:
    return WorkerProcesses(url, tmp_path, app="tests.ingestapp:app", env=env)


async def test_a_consumer_killed_mid_stream_loses_and_doubles_nothing(
    setup: Setup, db_url: str, tmp_path: Path
) -> None:
    await setup.publish_all()
    workers = ingest_workers(db_url, tmp_path, setup.env)
    try:
        first = workers.start()
        await wait_for(lambda: _at_least(setup.applied(), READING_COUNT // 4), 60)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert await setup.applied() < READING_COUNT, "killed too late to mean anything"
        workers.start()
        await setup.wait_all_done(120)
        await setup.check_exactly_once_in_effect()
    finally:
        workers.cleanup()


async def _at_least(count: Any, n: int) -> bool:
    return bool(await count >= n)


async def test_postgres_restarted_immediately_mid_stream_loses_and_doubles_nothing(
    transport_kind: str, nats: NatsServer | None, tmp_path: Path, durable_pg: EmbeddedPostgres
) -> None:
    server = durable_pg
    url = server.url()
    s = await make_setup(url, transport_kind, nats)
    workers = ingest_workers(url, tmp_path, s.env)
    try:
        await s.publish_all()
        workers.start()
        await wait_for(lambda: _at_least(s.applied(), READING_COUNT // 4), 60)
        await asyncio.to_thread(server.restart, "immediate")
        await s.wait_all_done(120)
        await s.check_exactly_once_in_effect()
    finally:
        workers.cleanup()
        await s.close()
        await s.boss.close()


async def test_nats_server_killed_mid_stream_loses_and_doubles_nothing(
    db_url: str, tmp_path: Path
) -> None:
    server = NatsServer(tmp_path / "nats").start()
    s = await make_setup(db_url, "nats", server)
    workers = ingest_workers(db_url, tmp_path, s.env)
    try:
        await s.publish_all()
        workers.start()
        await wait_for(lambda: _at_least(s.applied(), READING_COUNT // 4), 60)
        server.kill()
        await asyncio.sleep(1)  # noqa: TID251 - the killed server stays down while workers retry
        server.restart()
        await s.wait_all_done(120)
        await s.check_exactly_once_in_effect()
    finally:
        workers.cleanup()
        await s.close()
        await s.boss.close()
        server.stop()
