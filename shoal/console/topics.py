"""The console's topics: their backlog, their dead letters, and redrive.

What ``shoal api``'s topic routes call. An unknown topic is
:class:`~shoal.errors.NotFound` naming the field and listing the known ones;
nothing is written.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from shoal.console.queues import known_list
from shoal.console.store import ConsoleStore
from shoal.db.pool import AsyncConn
from shoal.errors import InvalidInput, NotFound
from shoal.ingest.message import Envelope
from shoal.ingest.postgres import QUEUE_PREFIX
from shoal.ingest.store import DeadLetter, IngestStore
from shoal.ingest.transport import Transport
from shoal.queue.client import Shoal

MAX_PAGE = 500
MAX_REDRIVE = 10_000
_CURSOR = re.compile(r"[1-9][0-9]{0,18}")


@dataclass(frozen=True, slots=True)
class TopicSummary:
    topic: str
    depth: int
    ready: int
    in_flight: int
    delayed: int
    oldest_age_s: float | None
    wait_s: float | None
    paused: bool
    checked_at: datetime | None  # when the backlog monitor last looked
    dead: int  # dead letters waiting for a redrive


@dataclass(frozen=True, slots=True)
class DeadPage:
    letters: list[DeadLetter]
    next_cursor: str | None


class TopicInspector:
    def __init__(self, boss: Shoal) -> None:
        self.boss = boss
        self.clock = boss.clock
        self.console = ConsoleStore(boss.db)
        self.store = IngestStore(boss.db)

    async def topics(self) -> list[TopicSummary]:
        return [TopicSummary(*r) for r in await self.console.topics()]

    async def require_topic(self, topic: str, field: str = "name") -> str:
        if not await self.console.topic_known(topic):
            names = await self.console.topic_names()
            raise NotFound(f"no topic {topic!r:.130}; {known_list('topic', names)}", field=field)
        return topic

    async def dead(
        self,
        topic: str,
        *,
        limit: int = 50,
        cursor: str | None = None,
        include_redriven: bool = False,
    ) -> DeadPage:
        """A page of ``topic``'s dead letters, oldest first."""
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidInput("limit", f"must be 1 to {MAX_PAGE}, got {limit}")
        if cursor is not None and not _CURSOR.fullmatch(cursor):
            raise InvalidInput("cursor", f"{cursor!r:.80} is not a cursor this list returned")
        await self.require_topic(topic)
        rows = await self.console.dead_page(
            topic,
            include_redriven=include_redriven,
            after_id=None if cursor is None else int(cursor),
            limit=limit + 1,
        )
        letters = rows[:limit]
        more = len(rows) > limit
        return DeadPage(letters, str(letters[-1].id) if more else None)

    async def redrive(
        self,
        topic: str,
        transport: Transport,
        *,
        ids: Sequence[int] | None = None,
        limit: int = MAX_REDRIVE,
    ) -> int:
        """Publish ``topic``'s waiting dead letters again (those of ``ids``, or up
        to ``limit``); how many. A failed publish leaves them waiting."""
        await self.require_topic(topic)
        now = self.clock.sql_now()

        async def run(conn: AsyncConn) -> int:
            texts = await self.store.take_dead_letters(conn, topic, ids=ids, limit=limit, now=now)
            envelopes = [Envelope.decode(text) for text in texts]
            if envelopes:
                if transport.in_database:
                    await transport.publish(topic, envelopes, conn=conn)
                else:
                    await transport.publish(topic, envelopes)
            return len(envelopes)

        return await self.boss.db.run(run)

    async def discard(self, topic: str, letter_id: int) -> str:
        """Delete dead letter ``letter_id`` of ``topic`` for good, waiting or redriven;
        its message id. NotFound (naming ``dead_id``) when the topic has no such letter.

        Both transports keep their dead letters in shoal's table, so the
        discard is the same for both, and needs no connection to the transport.
        A dead-lettered message is gone from either transport (deleted from
        the postgres transport's table, terminated in its nats stream); but a
        process of 0.2.0, whose postgres transport kept topics as queues,
        leaves it as a failed job in the topic's queue: that job goes with the
        letter, in the same transaction.
        """
        await self.require_topic(topic)
        queue = QUEUE_PREFIX + topic

        async def run(conn: AsyncConn) -> str | None:
            return await self.console.discard_dead(conn, topic, letter_id, queue=queue)

        message_id = await self.boss.db.run(run)
        if message_id is None:
            raise NotFound(f"topic {topic!r:.130} has no dead letter {letter_id}", field="dead_id")
        return message_id


__all__ = ["DeadPage", "TopicInspector", "TopicSummary"]
