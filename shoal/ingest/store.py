"""Every statement of the ingest layer, behind typed methods."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from psycopg.types.json import Jsonb

from shoal.db.pool import AsyncConn, Database
from shoal.db.queries import (
    fetch_named_timed,
    float_array,
    int_array,
    load_queries,
    text_array,
)
from shoal.ingest.transport import Depth
from shoal.queue.cursor import Position


class ClaimedMessage(NamedTuple):
    """A message the postgres transport delivered: its id, the attempt it was
    delivered under (the fencing token of its ack, nak and touch), and the
    envelope's JSON text.

    A NamedTuple of the columns a delivery needs: one is read for every
    delivery, on the consumer's hot path.
    """

    id: int
    attempt: int
    envelope_json: str

    @property
    def priority(self) -> int:
        """Messages have none: with the id, the position of a claim cursor's
        (shoal.queue.cursor), whose order is then the ids'."""
        return 0


@dataclass(frozen=True, slots=True)
class DeadLetter:
    id: int
    topic: str
    message_id: str
    envelope_json: str
    reason: str  # poison | attempts | business
    error: str
    attempt: int
    dead_at: datetime
    redriven_at: datetime | None


@dataclass(frozen=True, slots=True)
class TopicState:
    topic: str
    depth: int
    ready: int
    in_flight: int
    delayed: int
    oldest_age_s: float | None
    wait_s: float | None
    paused: bool
    checked_at: datetime | None
    last_wait_s: float | None


@dataclass(frozen=True, slots=True)
class Backlog:
    paused: bool
    wait_s: float | None


class IngestStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.sql = load_queries("shoal.ingest", db.schema)

    async def _rows(
        self, name: str, params: dict[str, Any], conn: AsyncConn | None = None
    ) -> list[Any]:
        return await self.db.fetch(self.sql[name], params, conn)

    # -- the postgres transport ------------------------------------------------

    async def publish(
        self,
        messages: Sequence[tuple[str, str]],
        *,
        channel: str,
        queues: Sequence[str],
        now: datetime | None,
        conn: AsyncConn | None = None,
    ) -> None:
        """Store (topic, envelope JSON) messages in one statement, and NOTIFY
        ``channel`` with each of ``queues`` on commit."""
        await self._rows(
            "publish_messages",
            {
                "topics": text_array(m[0] for m in messages),
                "envelopes": text_array(m[1] for m in messages),
                "channel": channel,
                "queues": text_array(queues),
                "now": now,
            },
            conn,
        )

    async def claim(
        self,
        topic: str,
        limit: int,
        *,
        ack_wait: timedelta,
        now: datetime | None,
        after: Position | None = None,
    ) -> tuple[list[ClaimedMessage], float]:
        """Claim up to ``limit`` due messages of ``topic``, each leased for ``ack_wait`` from now.

        From the head of the topic, or with ``after`` (a position of
        shoal.queue.cursor, whose id is a message's) only the messages
        published after it. The lease is the claiming consumer's: a message
        it never settles is claimed again once ``ack_wait`` has passed, and a
        touch extends it by ``ack_wait`` again. Not flushed before returning,
        like the queue's claim: a claim lost to a crash only redelivers.

        With the claims comes what the statement cost on its connection, in
        seconds (shoal.db.queries.fetch_named_timed).
        """
        params = {
            "topic": topic,
            "limit": limit,
            "ack_wait": ack_wait,
            "now": now,
            "after_id": None if after is None else after[1],
        }
        query = self.sql["claim_messages"]
        _, rows, cost_s = await self.db.run(
            lambda c: fetch_named_timed(c, query, params), transaction=False
        )
        return [ClaimedMessage._make(r) for r in rows], cost_s

    async def ack(
        self,
        topic: str,
        done: Sequence[tuple[int, int]],
        *,
        marks: Mapping[str, timedelta] | None = None,
        now: datetime | None = None,
    ) -> None:
        """Delete acknowledged messages of ``topic``, each fenced by (message id, attempt).

        ``marks``: message id -> TTL of the done-markers the same statement writes.
        """
        marks = marks or {}
        # Sorted: concurrent markers of overlapping ids lock rows in one order.
        ids = sorted(marks)
        # Bound as array texts: psycopg's dump of a list costs about ten times
        # as much, and a consumer acks every message it takes (shoal.db.queries).
        await self._rows(
            "ack_messages",
            {
                "topic": topic,
                "ids": int_array(d[0] for d in done),
                "attempts": int_array(d[1] for d in done),
                "marks": text_array(ids),
                "ttls_s": float_array(marks[i].total_seconds() for i in ids),
                "now": now,
            },
        )

    async def settle(
        self, topic: str, message: tuple[int, int], *, delay: timedelta | None, now: datetime | None
    ) -> bool:
        """Nak the message (id, attempt) of ``topic`` to be due again after ``delay``, or with
        None delete it (a term: its dead letter holds it); False when that
        delivery was no longer the caller's to settle."""
        rows = await self._rows(
            "settle_messages",
            {
                "topic": topic,
                "ids": int_array([message[0]]),
                "attempts": int_array([message[1]]),
                "delays_s": None if delay is None else float_array([delay.total_seconds()]),
                "now": now,
            },
        )
        return bool(rows[0][0])

    async def touch(
        self, topic: str, message: tuple[int, int], *, ack_wait: timedelta, now: datetime | None
    ) -> bool:
        """Extend the lease of the message (id, attempt) of ``topic`` to ``ack_wait`` from now;
        False when that delivery is no longer held."""

        async def run(c: AsyncConn) -> int:
            params = {
                "topic": topic,
                "id": message[0],
                "attempt": message[1],
                "ack_wait": ack_wait,
                "now": now,
            }
            cur = await c.execute(self.sql["touch_messages"], params)
            return cur.rowcount

        return bool(await self.db.run(run, transaction=False))

    # -- de-duplication markers ---------------------------------------------

    async def seen(self, ids: Sequence[str], *, now: datetime | None) -> set[str]:
        rows = await self._rows("done_seen", {"ids": text_array(ids), "now": now})
        return {r[0] for r in rows}

    async def mark_done(self, ids: Sequence[str], ttl: timedelta, *, now: datetime | None) -> None:
        # Sorted: concurrent markers of overlapping ids lock rows in one order.
        await self._rows("mark_done", {"ids": text_array(sorted(set(ids))), "ttl": ttl, "now": now})

    async def prune_done(self, *, limit: int, now: datetime | None) -> int:
        async def run(c: AsyncConn) -> int:
            cur = await c.execute(self.sql["prune_done"], {"limit": limit, "now": now})
            return cur.rowcount

        return await self.db.run(run, transaction=False)

    # -- dead letters --------------------------------------------------------

    async def dead_letter(
        self,
        topic: str,
        reason: str,
        letters: Sequence[tuple[str, str, str, int]],
        *,
        now: datetime | None,
    ) -> None:
        """Store (message id, envelope JSON, error, attempt) rows for ``topic``."""
        if not letters:
            return
        await self._rows(
            "dead_letter",
            {
                "topic": topic,
                "reason": reason,
                "ids": [m[0] for m in letters],
                "envelopes": [Jsonb(json.loads(m[1])) for m in letters],
                "errors": [m[2] for m in letters],
                "attempts": [m[3] for m in letters],
                "now": now,
            },
        )

    async def dead_letters(
        self, topic: str, *, include_redriven: bool = False, limit: int = 1000
    ) -> list[DeadLetter]:
        rows = await self._rows(
            "dead_letters", {"topic": topic, "all": include_redriven, "limit": limit}
        )
        return [DeadLetter(*r) for r in rows]

    async def take_dead_letters(
        self,
        conn: AsyncConn,
        topic: str,
        *,
        ids: Sequence[int] | None = None,
        limit: int,
        now: datetime | None,
    ) -> list[str]:
        """Mark ``topic``'s waiting dead letters (those of ``ids``, or up to
        ``limit``) redriven in ``conn``'s transaction; their envelopes' JSON."""
        params = {"topic": topic, "ids": None if ids is None else list(ids), "limit": limit}
        rows = await self._rows("take_dead_letters", {**params, "now": now}, conn)
        return [r[0] for r in rows]

    # -- backlog -------------------------------------------------------------

    async def topic_depth(self, topic: str, *, now: datetime | None) -> Depth:
        """The postgres transport's backlog of ``topic``."""
        (row,) = await self._rows("topic_depth", {"topic": topic, "now": now})
        age = None if row[3] is None else timedelta(seconds=float(row[3]))
        return Depth(ready=row[0], in_flight=row[1], delayed=row[2], oldest_age=age)

    async def record_wait(self, topic: str, wait: timedelta, *, now: datetime | None) -> None:
        await self._rows(
            "record_wait", {"topic": topic, "wait_s": wait.total_seconds(), "now": now}
        )

    async def record_backlog(
        self,
        topic: str,
        depth: Depth,
        *,
        pause_depth: int,
        recent: timedelta,
        now: datetime | None,
    ) -> Backlog:
        (row,) = await self._rows(
            "record_backlog",
            {
                "topic": topic,
                "depth": depth.total,
                "ready": depth.ready,
                "in_flight": depth.in_flight,
                "delayed": depth.delayed,
                "oldest_age_s": None
                if depth.oldest_age is None
                else depth.oldest_age.total_seconds(),
                "recent": recent,
                "pause_depth": pause_depth,
                "now": now,
            },
        )
        return Backlog(*row)

    async def topic_states(self) -> list[TopicState]:
        return [TopicState(*r) for r in await self._rows("topic_states", {})]

    async def paused(self, topic: str) -> bool:
        rows = await self._rows("topic_paused", {"topic": topic})
        return bool(rows and rows[0][0])

    # -- configuration -------------------------------------------------------

    async def config_get(self, key: str) -> Any:
        rows = await self._rows("config_get", {"key": key})
        return json.loads(rows[0][0]) if rows else None

    async def config_set(self, key: str, value: Any, *, now: datetime | None) -> None:
        await self._rows("config_set", {"key": key, "value": json.dumps(value), "now": now})

    async def config_all(self) -> list[tuple[str, Any, datetime]]:
        return [(r[0], json.loads(r[1]), r[2]) for r in await self._rows("config_all", {})]
