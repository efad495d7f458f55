"""A topic's claim, ack and nak touch only the messages they name, whatever plan a session keeps.

claim_messages_v1 and settle_messages_v1 keep their plans for the session,
built at their first call. A consumer's first claim comes when the topic is
empty (statistics and size alike): with its claimed rows updated by
"topic = $1 AND id = ANY($2)" the plan kept walked the whole topic with the
ids as a filter, and at a backlog of 50,000 each claim read about 1,500
pages (the ingest bench: 380 us of claim per observation).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import psycopg

from shoal import Shoal
from shoal.ingest.message import new_envelope
from shoal.ingest.postgres import PostgresTransport

from .test_claim_plan import explain_into

TOPIC = "readings"
BACKLOG = 2_000
PUBLISHED_AT = datetime(2026, 12, 7, tzinfo=UTC)


async def call(conn: psycopg.AsyncConnection[Any], statement: str, *params: Any) -> list[Any]:
    cur = await conn.execute(statement, params)
    return await cur.fetchall()


CLAIM = "SELECT id, attempt FROM shoal.claim_messages_v1(%s, %s, NULL, interval '30 s', %s)"
SETTLE = "SELECT id FROM shoal.settle_messages_v1(%s, %s::bigint[], %s::int[], %s, NULL)"


async def test_claims_acks_and_naks_read_only_their_rows_with_plans_kept_from_an_empty_topic(
    boss: Shoal, db_url: str
) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("ALTER TABLE shoal.topic_message SET (autovacuum_enabled = false)")
        await conn.execute("ANALYZE shoal.topic_message")  # statistics say: empty
    transport = PostgresTransport(boss)
    notices: list[str] = []
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        # The session's first calls, on an empty table: their plans are kept.
        assert await call(conn, CLAIM, TOPIC, 10, None) == []
        assert await call(conn, SETTLE, TOPIC, [1], [1], None) == []
        assert await call(conn, SETTLE, TOPIC, [1], [1], [5.0]) == []
        envelopes = [
            new_envelope({"n": n}, published_at=PUBLISHED_AT, id=f"m-{n}") for n in range(BACKLOG)
        ]
        await transport.publish(TOPIC, envelopes)
        await conn.execute("SET auto_explain.log_analyze = on")
        await explain_into(conn, notices)

        claimed = await call(conn, CLAIM, TOPIC, 10, None)
        assert len(claimed) == 10
        ids, attempts = [c[0] for c in claimed], [c[1] for c in claimed]
        nakked = await call(conn, SETTLE, TOPIC, ids[:1], attempts[:1], [5.0])
        assert nakked == [(ids[0],)]
        # The nakked delivery is no longer the caller's: its ack is fenced off.
        acked = await call(conn, SETTLE, TOPIC, ids, attempts, None)
        assert sorted(a[0] for a in acked) == ids[1:]
        again = await call(conn, CLAIM, TOPIC, 10, ids[-1])
        assert len(again) == 10 and min(a[0] for a in again) > ids[-1]

    plans = [n for n in notices if "on topic_message" in n or "using topic_message" in n]
    assert len(plans) >= 6, notices
    for plan in plans:
        # Each statement reads the rows it names, or the claim's walk from
        # where it starts: none steps over the rest of the backlog (the ack
        # steps over the nakked message, fenced off).
        removed = [int(n) for n in re.findall(r"Rows Removed by Filter: (\d+)", plan)]
        assert all(n <= 1 for n in removed), plan
        assert "Seq Scan" not in plan, plan
    changes = [p for p in plans if "Update on topic_message" in p or "Delete on topic_message" in p]
    assert len(changes) == 4, changes
    for plan in changes:
        assert "Tid Scan" in plan, plan
    lookups = [p for p in plans if "u.id" in p]
    assert lookups and all("(id = u.id)" in p and "Index Cond" in p for p in lookups), lookups
    remaining = await transport.depth(TOPIC, "g")
    assert remaining.in_flight == 10 and remaining.delayed == 1
    assert remaining.ready == BACKLOG - 10 - 10
    await transport.close()
