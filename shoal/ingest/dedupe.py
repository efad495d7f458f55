"""Done-markers: a message id applied once is not applied again within the TTL.

The consumer asks ``seen`` before applying a batch of deliveries and calls
``mark`` after the apply committed (the reference's decision D5). A crash
between the commit and the marker leaves a window in which a redelivery is
applied a second time; sinks are written to make that replay harmless
(``ON CONFLICT DO NOTHING``, day snapshots that keep the maximum), and the
tests show it. The marker is an optimisation on top of idempotent sinks, not
a substitute for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Protocol

from shoal.clock import SYSTEM_CLOCK, Clock
from shoal.db.coalesce import Coalescer
from shoal.ingest.store import IngestStore

DEFAULT_DONE_TTL = timedelta(hours=48)


class DoneStore(Protocol):
    async def seen(self, ids: Sequence[str]) -> set[str]: ...

    async def mark(self, message_id: str) -> None: ...

    async def close(self) -> None: ...


class PostgresDoneStore:
    """Markers in ``ingest_done``; concurrent marks go out as one statement."""

    def __init__(
        self, store: IngestStore, *, ttl: timedelta = DEFAULT_DONE_TTL, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.store = store
        self.ttl = ttl
        self.clock = clock
        self._marks: Coalescer[str, None] = Coalescer(self._mark_many, name="shoal-done-marks")

    async def seen(self, ids: Sequence[str]) -> set[str]:
        return await self.store.seen(ids, now=self.clock.sql_now()) if ids else set()

    async def mark(self, message_id: str) -> None:
        await self._marks.submit(message_id)

    async def _mark_many(self, ids: Sequence[str]) -> list[None]:
        await self.store.mark_done(ids, self.ttl, now=self.clock.sql_now())
        return [None] * len(ids)

    async def close(self) -> None:
        await self._marks.close()


class RedisDoneStore:
    """Markers as Redis keys ``<prefix><id>`` with ``EX`` = TTL (the reference's store)."""

    def __init__(
        self, redis: Any, *, ttl: timedelta = DEFAULT_DONE_TTL, prefix: str = "shoal:ingest:done:"
    ) -> None:
        self.redis = redis  # a redis.asyncio.Redis
        self.ttl = ttl
        self.prefix = prefix

    async def seen(self, ids: Sequence[str]) -> set[str]:
        if not ids:
            return set()
        values = await self.redis.mget([self.prefix + i for i in ids])
        return {i for i, v in zip(ids, values, strict=True) if v is not None}

    async def mark(self, message_id: str) -> None:
        await self.redis.set(self.prefix + message_id, b"1", ex=int(self.ttl.total_seconds()))

    async def close(self) -> None:
        return None
