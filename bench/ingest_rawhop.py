"""The raw hop: the postgres transport's guarantees, written by hand in plain SQL.

A baseline for bench/ingest_bench.py (``--transports postgres,rawhop``). The
bare write applies each observation straight from memory: it stores no
message, so it has nothing to lose, redeliver or de-duplicate. This is the
floor of a pipeline that keeps the promises shoal's postgres transport makes,
written the short way a careful engineer would, with no library code:

- publish: one INSERT per chunk of 500 envelopes into a message table keyed
  by (topic, id), committed before the producer goes on (durable); the table
  leaves half of each page free, as shoal's does, so that a claim can update
  a message in its page;
- delivery: one UPDATE per claim that leases up to the free slots' worth of
  due messages (FOR UPDATE SKIP LOCKED, the attempt counted: the fence),
  after the id of the last claimed message, and from the head of the topic
  when that came back short (at most once a second);
- de-duplication: a done-marker per applied message id with a 48-hour TTL
  (primary key, and an index on the expiry for its pruning), checked for each
  claim's ids before applying;
- ack: the markers written and the messages deleted, fenced by their
  attempt, in one statement for all the acks gathered meanwhile;
- the collection sink: batches of up to 200 (or what came in a second),
  written in one INSERT, then deleted, fenced, without markers (the writes
  are idempotent).

Its statements are planned at each call (:data:`PLANNED`). It has no dead
letters, naks or retries (nothing fails in the bench), no pause, no backlog
monitor and no wake-up by NOTIFY (an idle claimer polls every 10 ms): what
it leaves out costs nothing while nothing fails.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from psycopg_pool import AsyncConnectionPool

SCHEMA = """
DROP TABLE IF EXISTS hop_message, hop_done;
CREATE TABLE hop_message (
    topic text COLLATE "C" NOT NULL,
    id bigint GENERATED ALWAYS AS IDENTITY,
    attempt integer NOT NULL DEFAULT 0,
    due_at timestamptz NOT NULL DEFAULT now(),
    envelope text NOT NULL,
    PRIMARY KEY (topic, id)
) WITH (fillfactor = 50);
CREATE TABLE hop_done (
    message_id text COLLATE "C" PRIMARY KEY,
    expires_at timestamptz NOT NULL
);
CREATE INDEX hop_done_expires ON hop_done (expires_at);
"""
PUBLISH = "INSERT INTO hop_message (topic, envelope) SELECT %s, unnest(%s::text[])"
CLAIM = """
UPDATE hop_message m SET attempt = m.attempt + 1, due_at = now() + interval '5 minutes'
WHERE m.topic = %(topic)s AND m.id = ANY(ARRAY(
    SELECT h.id FROM hop_message h
    WHERE h.topic = %(topic)s AND h.id > %(after)s AND h.due_at <= now()
    ORDER BY h.topic, h.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED))
RETURNING m.id, m.attempt, m.envelope
"""
SEEN = "SELECT message_id FROM hop_done WHERE message_id = ANY(%s::text[]) AND expires_at > now()"
ACK = """
WITH marked AS (
    INSERT INTO hop_done (message_id, expires_at)
    SELECT unnest(%(marks)s::text[]), now() + interval '48 hours'
    ON CONFLICT (message_id) DO UPDATE SET expires_at = excluded.expires_at
)
DELETE FROM hop_message m
USING unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS a(id, attempt)
WHERE m.topic = %(topic)s AND m.id = a.id AND m.attempt = a.attempt
"""
# Connections for claims and acks (the user's writes have their own pool).
POOL = 4
# Each statement planned at each call, for the tables as they are then. A plan
# kept from the first calls, made while the tables were nearly empty, scans
# them whole once they hold a backlog (the claim's update of its ids, the
# marker lookup): at 100,000 messages the raw hop's statements took 3.5x
# the server CPU per message that they take planned each time. shoal's
# functions keep their plans, each of one shape whatever the statistics.
PLANNED = {"options": "-c plan_cache_mode=force_custom_plan"}
CHUNK = 500
HEAD_EVERY_S = 1.0
IDLE_S = 0.01

# (message row id, attempt, envelope id, body, published_at)
Claimed = tuple[int, int, str, Any, datetime]


def envelope(body: Any) -> str:
    published_at = datetime.now(UTC).isoformat()
    return json.dumps({"id": str(uuid.uuid4()), "published_at": published_at, "body": body})


async def publish(pool: AsyncConnectionPool, topics: dict[str, list[Any]]) -> None:
    """Each topic's bodies in chunks of :data:`CHUNK`, the topics at once."""

    async def one(topic: str, bodies: list[Any]) -> None:
        for i in range(0, len(bodies), CHUNK):
            texts = [envelope(b) for b in bodies[i : i + CHUNK]]
            async with pool.connection() as conn:
                await conn.execute(PUBLISH, (topic, texts))

    await asyncio.gather(*(one(topic, bodies) for topic, bodies in topics.items()))


class Claimer:
    """Claims of one topic after the last claimed id, from the head when short."""

    def __init__(self, pool: AsyncConnectionPool, topic: str) -> None:
        self.pool = pool
        self.topic = topic
        self.after = 0
        self.head_at = 0.0

    async def _claim(self, limit: int, after: int) -> list[Claimed]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                CLAIM, {"topic": self.topic, "after": after, "limit": limit}, prepare=True
            )
            rows = await cur.fetchall()
        claimed = []
        for row_id, attempt, text in rows:
            doc = json.loads(text)
            published_at = datetime.fromisoformat(doc["published_at"])
            claimed.append((row_id, attempt, doc["id"], doc["body"], published_at))
        if claimed:
            self.after = max(self.after, max(c[0] for c in claimed))
        return claimed

    async def claim(self, limit: int) -> list[Claimed]:
        claimed = await self._claim(limit, self.after)
        now = time.monotonic()
        if len(claimed) < limit and self.after and now - self.head_at >= HEAD_EVERY_S:
            self.head_at = now
            claimed += await self._claim(limit - len(claimed), 0)
        return claimed

    async def ack(self, acked: list[Claimed], *, marks: bool) -> None:
        params = {
            "topic": self.topic,
            "ids": [c[0] for c in acked],
            "attempts": [c[1] for c in acked],
            "marks": sorted(c[2] for c in acked) if marks else [],
        }
        async with self.pool.connection() as conn:
            await conn.execute(ACK, params, prepare=True)


async def consume(
    url: str,
    *,
    n: int,
    obs_topic: str,
    collection_topic: str,
    apply: Callable[[Any, datetime], Awaitable[None]],
    write: Callable[[list[Any]], Awaitable[None]],
    concurrency: int,
) -> None:
    """Apply ``n`` observations (``concurrency`` at a time) and write ``n`` collection
    records in batches, returning when all are acknowledged."""
    async with AsyncConnectionPool(url, min_size=POOL, max_size=POOL, kwargs=PLANNED) as pool:
        await asyncio.gather(
            _observations(pool, obs_topic, n, apply, concurrency),
            _collection(pool, collection_topic, n, write),
        )


async def _observations(
    pool: AsyncConnectionPool,
    topic: str,
    n: int,
    apply: Callable[[Any, datetime], Awaitable[None]],
    concurrency: int,
) -> None:
    claimer = Claimer(pool, topic)
    most = 4 * concurrency
    ready: asyncio.Queue[Claimed | None] = asyncio.Queue()
    room = asyncio.Event()
    acks_wanted = asyncio.Event()
    to_ack: list[Claimed] = []
    held = 0
    acked = 0

    async def fetch() -> None:
        nonlocal held, acked
        while acked < n:
            if held > most // 2:
                room.clear()
                await room.wait()
                continue
            claimed = await claimer.claim(most - held)
            if not claimed:
                await asyncio.sleep(IDLE_S)
                continue
            held += len(claimed)
            async with pool.connection() as conn:
                cur = await conn.execute(SEEN, ([c[2] for c in claimed],), prepare=True)
                seen = {row[0] for row in await cur.fetchall()}
            duplicates = [c for c in claimed if c[2] in seen]
            if duplicates:  # none in the bench; acknowledged without applying
                await claimer.ack(duplicates, marks=False)
                held -= len(duplicates)
                acked += len(duplicates)
            for c in claimed:
                if c[2] not in seen:
                    ready.put_nowait(c)

    async def slot() -> None:
        while (c := await ready.get()) is not None:
            await apply(c[3], c[4])
            to_ack.append(c)
            acks_wanted.set()

    async def acker() -> None:
        nonlocal held, acked
        while acked < n:
            if not to_ack:
                acks_wanted.clear()
                await acks_wanted.wait()
                continue
            batch = to_ack[:]
            to_ack.clear()
            await claimer.ack(batch, marks=True)
            acked += len(batch)
            held -= len(batch)
            if held <= most // 2:
                room.set()
        room.set()

    slots = [asyncio.create_task(slot()) for _ in range(concurrency)]
    await asyncio.gather(fetch(), acker())
    for _ in slots:
        ready.put_nowait(None)
    await asyncio.gather(*slots)


async def _collection(
    pool: AsyncConnectionPool, topic: str, n: int, write: Callable[[list[Any]], Awaitable[None]]
) -> None:
    claimer = Claimer(pool, topic)
    batch_size, max_wait_s = 200, 1.0
    written = 0
    buffer: list[Claimed] = []
    first_at = 0.0
    while written < n:
        claimed = await claimer.claim(batch_size - len(buffer))
        if claimed and not buffer:
            first_at = time.monotonic()
        buffer += claimed
        if buffer and (len(buffer) >= batch_size or time.monotonic() - first_at >= max_wait_s):
            await write([c[3] for c in buffer])
            await claimer.ack(buffer, marks=False)
            written += len(buffer)
            buffer = []
        elif not claimed:
            await asyncio.sleep(IDLE_S)
