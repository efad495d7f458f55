"""The upgrade moves a topic's backlog out of the job table while the previous release works it.

Until migration 0012 a topic's messages were jobs of the queue
``topic.<name>``. The upgrade moves every unfinished one into the topic's
table, and messages the previous release's producers publish afterwards
follow them there. Here the previous release is stood in for by its own
statements on connections of their own (tests/upgrade/e3c978a_queries): a
consumer holds messages under a live lease, one of them nakked into a
delayed retry; a producer publishes without pause while ``migrate`` runs.
Then this release's consumer finishes the topic, and every message is
applied once: none lost, none doubled.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

from shoal import FakeClock, Shoal
from shoal.db import Database, migrate
from shoal.ingest.message import Message, new_envelope
from shoal.ingest.pipeline import Pipeline
from shoal.ingest.postgres import PostgresTransport, topic_queue
from shoal.ingest.transport import Depth

from .conftest import wait_for
from .test_upgrade import START, TOPIC, previous_release, restore

# The fixture's topic: m-0..m-5, two held by a consumer that died, four waiting.
FIXTURE = [f"m-{n}" for n in range(6)]
# How the previous release's transport published (its insert_json options).
UNLIMITED_ATTEMPTS = 2**31 - 1
OLD_ACK_WAIT = timedelta(minutes=5)
OLD_PUBLISH = """
INSERT INTO shoal.job (queue, data, retry_limit, retry_delay, retry_backoff, retry_delay_max,
                       expire_in, start_after, created_at)
VALUES (%s, %s::jsonb, %s, interval '0', false, interval '0', %s, %s, %s)
RETURNING id
"""
UNFINISHED_JOBS = sql.SQL(
    "SELECT count(*) FROM shoal.job WHERE queue = %(queue)s"
    " AND state IN ('created', 'retry', 'active')"
).format()


async def publish_while(url: str, stop: asyncio.Event, published: list[str]) -> None:
    """The previous release's producer: one message a statement until ``stop``, and 5 more."""
    queue = topic_queue(TOPIC.name)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        after = 0
        while after < 5:
            if stop.is_set():
                after += 1
            message_id = f"p-{len(published)}"
            text = new_envelope({"n": len(published)}, published_at=START, id=message_id).encode()
            cur = await conn.execute(
                OLD_PUBLISH, (queue, text.decode(), UNLIMITED_ATTEMPTS, OLD_ACK_WAIT, START, START)
            )
            # The statement returns its job as the producer expects, moved or not.
            assert len(await cur.fetchall()) == 1
            published.append(message_id)


async def test_a_topics_backlog_moves_while_the_previous_release_publishes_and_consumes(
    empty_db_url: str,
) -> None:
    restore(empty_db_url)  # the previous release's schema and its work in flight
    old_queue, old_ingest = previous_release("queue"), previous_release("ingest")
    queue = topic_queue(TOPIC.name)
    applied: Counter[str] = Counter()
    published: list[str] = []

    async with Database(empty_db_url, max_size=10) as db:

        async def old(query: Any, **params: Any) -> list[tuple[Any, ...]]:
            return await db.fetch(query, params)

        # A consumer of the previous release holds two waiting messages under
        # its lease, applies one (its ack comes after the upgrade), and nakks
        # the other into a retry a minute away.
        held = await old(old_queue["claim_jobs"], queue=queue, limit=2, now=START)
        (acked_id, acked_attempt, acked_data), (nakked_id, nakked_attempt, _) = [
            (r[0], r[4], json.loads(r[2])) for r in held
        ]
        await old(
            old_queue["fail_jobs"],
            ids=[nakked_id],
            attempts=[nakked_attempt],
            states=["retry"],
            retry_in_s=[60.0],
            errors=[json.dumps({"kind": "nak"})],
            expired_only=False,
            now=START,
        )
        applied[acked_data["id"]] += 1

        # Its producer publishes on its own connection all through the upgrade.
        stop = asyncio.Event()
        producer = asyncio.create_task(publish_while(empty_db_url, stop, published))
        await wait_for(lambda: len(published) >= 20)
        assert 12 in await migrate(db)
        stop.set()
        await producer

        # The consumer's ack finds no job now, but writes its done-marker.
        await old(
            old_ingest["ack_messages"],
            marks=[acked_data["id"]],
            ttls=[timedelta(hours=48)],
            ids=[acked_id],
            attempts=[acked_attempt],
            now=START,
        )
        # Nothing of the topic is left in the job table to be delivered.
        assert await old(UNFINISHED_JOBS, queue=queue) == [(0,)]

    clock = FakeClock(START)
    db = await Database(empty_db_url, max_size=10).open()
    boss = Shoal(db, clock=clock)
    transport = PostgresTransport(boss)
    pipeline = Pipeline(boss, transport)
    await pipeline.start()
    # Moved with their state: the fixture's and the live consumer's held ones
    # under their leases, the nakked one delayed, the rest waiting.
    depth = await transport.depth(TOPIC.name, "shoal")
    assert (depth.in_flight, depth.delayed) == (3, 1)
    assert depth.ready == len(FIXTURE) - 4 + len(published)

    async def apply(message: Message[Any]) -> None:
        applied[message.id] += 1

    stop_consumer = asyncio.Event()
    consumer = pipeline.consumer(TOPIC, apply, concurrency=4, poll=timedelta(milliseconds=50))
    running = asyncio.create_task(consumer.run(stop_consumer))
    try:
        await wait_for(lambda: sum(applied.values()) == 1 + 2 + len(published), 30)
        clock.advance(timedelta(seconds=61))  # the nakked one is due
        await wait_for(lambda: sum(applied.values()) == 1 + 3 + len(published), 30)
        # Past the leases: the fixture's dead consumer's two are applied; the
        # one the live consumer acked is met by its marker, acknowledged only.
        clock.advance(OLD_ACK_WAIT)
        await wait_for(lambda: consumer.stats.duplicates == 1, 30)
        await wait_for(lambda: _empty(transport), 30)
    finally:
        stop_consumer.set()
        await running
        await pipeline.close()
        await boss.close()
    assert applied == Counter(FIXTURE + published)


async def _empty(transport: PostgresTransport) -> bool:
    return await transport.depth(TOPIC.name, "shoal") == Depth(0, 0, 0, None)
