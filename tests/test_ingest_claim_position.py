"""The postgres transport claims a topic after the last message it claimed.

A claim from the head of the claim index steps over the entry of every
message claimed since the last vacuum, and behind a long transaction reads
each one's row as well (tests/test_claim_position.py shows it for jobs). A
subscription claims after its position and from the head only now and then:
these tests hold a long transaction open for real and count what a claim
reads, and check that what waits behind the position is still delivered.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from shoal import Shoal
from shoal.ingest.message import Envelope, new_envelope
from shoal.ingest.postgres import PgSubscription, PostgresTransport
from shoal.queue.cursor import Position

from .test_claim_position import entries_read

TOPIC = "readings"
PUBLISHED_AT = datetime(2026, 12, 4, tzinfo=UTC)


def envelopes(n: int, *, start: int = 0) -> list[Envelope]:
    return [envelope(f"m-{i}") for i in range(start, start + n)]


def envelope(message_id: str) -> Envelope:
    return new_envelope({"id": message_id}, published_at=PUBLISHED_AT, id=message_id)


@pytest.fixture
async def transport(boss: Shoal) -> AsyncIterator[PostgresTransport]:
    t = PostgresTransport(boss)
    await t.start()
    yield t
    await t.close()


async def subscribe(transport: PostgresTransport) -> PgSubscription:
    return await transport.subscribe(TOPIC, "g", max_in_flight=1000)


async def entries_read_by_claim(
    transport: PostgresTransport, db_url: str, after: Position | None
) -> tuple[int, int]:
    """(messages claimed, claim index entries read) by one claim of the topic, rolled back."""
    params = {
        "topic": TOPIC,
        "limit": 10,
        "now": None,
        "ack_wait": timedelta(seconds=30),
        "after_id": None if after is None else after[1],
    }
    statement = transport.store.sql["claim_messages"].as_string()
    return await entries_read(db_url, statement, params, "shoal.topic_message_pkey")


async def test_behind_a_long_transaction_a_topic_claim_after_its_position_reads_no_claimed_entries(
    transport: PostgresTransport, db_url: str
) -> None:
    async with await psycopg.AsyncConnection.connect(db_url) as old:
        # The transaction vacuum must keep every row version for.
        await old.execute("SELECT txid_current()")
        await transport.publish(TOPIC, envelopes(5_000))
        (last_id,) = await (
            await old.execute("SELECT max(id) FROM shoal.topic_message WHERE topic = %s", (TOPIC,))
        ).fetchone() or (None,)
        sub = await subscribe(transport)
        for _ in range(10):
            deliveries = await sub.fetch(500, wait=timedelta(0))
            assert len(deliveries) == 500
            for delivery in deliveries:
                await delivery.ack()
        await transport.publish(TOPIC, envelopes(10, start=5_000))

        from_head, head_reads = await entries_read_by_claim(transport, db_url, None)
        after, after_reads = await entries_read_by_claim(transport, db_url, (0, last_id))
        # The subscription's own next claim starts after its position too: it
        # gets the 10 new messages, not the acknowledged ones' dead versions.
        latest = await sub.fetch(10, wait=timedelta(0))
        await old.rollback()
    assert from_head == after == 10
    # From the head, the claim reads the 5,000 entries of claimed messages
    # (and each one's row); from the position, only the 10 waiting ones.
    assert head_reads >= 5_010, head_reads
    assert after_reads <= 20, after_reads
    assert sorted(d.envelope.id for d in latest) == sorted(e.id for e in envelopes(10, start=5_000))
    await sub.close()


async def test_a_nakked_message_behind_the_position_is_delivered_after_those_ahead(
    transport: PostgresTransport,
) -> None:
    await transport.publish(TOPIC, envelopes(5))
    sub = await subscribe(transport)
    first = await sub.fetch(3, wait=timedelta(0))
    assert [d.envelope.id for d in first] == ["m-0", "m-1", "m-2"]
    await first[0].nak(timedelta(0))
    # The next claim goes on after m-2: m-0 waits behind the position.
    ahead = await sub.fetch(10, wait=timedelta(0))
    assert [d.envelope.id for d in ahead] == ["m-3", "m-4"]
    # With nothing after the position, a claim from the head finds m-0,
    # however soon it follows the last one.
    (again,) = await sub.fetch(10, wait=timedelta(0))
    assert (again.envelope.id, again.attempt) == ("m-0", 2)
    for delivery in [*first[1:], *ahead, again]:
        await delivery.ack()
    assert await sub.fetch(10, wait=timedelta(0)) == []
    await sub.close()


async def test_a_waiting_fetch_finds_a_message_that_committed_behind_its_position(
    transport: PostgresTransport, boss: Shoal, db_url: str
) -> None:
    async with await psycopg.AsyncConnection.connect(db_url) as late:
        # Takes its id first, commits last: the subscription claims the later
        # ids and moves its position past this one before it is visible.
        await late.execute(
            "INSERT INTO shoal.topic_message (topic, due_at, created_at, envelope)"
            " VALUES (%s, now(), now(), %s)",
            (TOPIC, envelope("late").encode().decode()),
        )
        await transport.publish(TOPIC, envelopes(3))
        sub = await subscribe(transport)
        taken = await sub.fetch(10, wait=timedelta(0))
        assert [d.envelope.id for d in taken] == ["m-0", "m-1", "m-2"]
        await late.commit()
    (found,) = await sub.fetch(10, wait=timedelta(seconds=30))
    assert found.envelope.id == "late"
    await sub.close()


async def test_pausing_the_topics_queue_name_stops_its_consumers_until_resumed(
    transport: PostgresTransport, boss: Shoal
) -> None:
    # As in 0.2.0, when a topic's messages were the jobs of the queue
    # 'topic.<name>': pausing that queue stops the topic's consumers.
    await transport.publish(TOPIC, envelopes(2))
    sub = await subscribe(transport)
    await boss.pause_queue(f"topic.{TOPIC}")
    assert await sub.fetch(10, wait=timedelta(0)) == []
    await boss.resume_queue(f"topic.{TOPIC}")
    resumed = await sub.fetch(10, wait=timedelta(0))
    assert [d.envelope.id for d in resumed] == ["m-0", "m-1"]
    for delivery in resumed:
        await delivery.ack()
    await sub.close()
