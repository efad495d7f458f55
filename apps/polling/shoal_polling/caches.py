"""The poll step's read caches (D9): its reads before the gateway call barely touch the database.

- cards: loaded in bulk for the cards a round claimed, kept until the card's
  next ingest commit, which invalidates it (``pg_notify`` in the apply's
  transaction, delivered on commit, heard by :class:`CardInvalidator`), or
  at most ``card_ttl``;
- accounts (the real-name switch): one minute, in process;
- a failed load is never cached: the next read tries again.

The same LISTEN connection delivers new priority items to the poller's
priority set (D9's "add it to the set at once").

The caches belong to one poller: written by its steps and its invalidator,
read by its steps; all on one event loop, so no locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Generic, TypeVar

from shoal import Clock, Database
from shoal_polling.apply import CARD_CHANNEL, PRIORITY_CHANNEL
from shoal_polling.domain import AsyncConn

log = logging.getLogger("shoal_polling.caches")

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

DEFAULT_CARD_TTL = timedelta(minutes=5)
DEFAULT_ACCOUNT_TTL = timedelta(minutes=1)
NOTIFY_WAIT_S = 1.0


class TtlCache(Generic[K, V]):
    """Values for ``ttl`` after they were loaded; loads that raise store nothing."""

    def __init__(self, ttl: timedelta, clock: Clock) -> None:
        self.ttl = ttl.total_seconds()
        self.clock = clock
        self._values: dict[K, tuple[V, float]] = {}
        self.hits = 0
        self.loads = 0

    def peek(self, key: K) -> V | None:
        entry = self._values.get(key)
        if entry is None or self.clock.monotonic() - entry[1] >= self.ttl:
            return None
        return entry[0]

    def put(self, key: K, value: V) -> None:
        self._values[key] = (value, self.clock.monotonic())

    async def get(self, key: K, load: Callable[[K], Awaitable[V]]) -> V:
        value = self.peek(key)
        if value is not None:
            self.hits += 1
            return value
        self.loads += 1
        value = await load(key)  # raises: nothing cached
        self.put(key, value)
        return value

    def missing(self, keys: Sequence[K]) -> list[K]:
        return [k for k in keys if self.peek(k) is None]

    def invalidate(self, key: K) -> None:
        self._values.pop(key, None)

    def clear(self) -> None:
        self._values.clear()


@dataclass(frozen=True, slots=True)
class CardInfo:
    card_id: str
    account_id: str
    polling_enabled: bool
    flow_evaluated_until: datetime | None


async def load_cards(db: Database, ids: Sequence[str]) -> dict[str, CardInfo]:
    async def run(conn: AsyncConn) -> dict[str, CardInfo]:
        cur = await conn.execute(
            "SELECT id, account_id, polling_enabled, flow_evaluated_until"
            " FROM shoal_polling.card WHERE id = ANY(%s)",
            (list(ids),),
        )
        return {row[0]: CardInfo(*row) for row in await cur.fetchall()}

    return await db.run(run, transaction=False)


async def load_real_name_enabled(db: Database, account_id: str) -> bool:
    async def run(conn: AsyncConn) -> bool:
        cur = await conn.execute(
            "SELECT real_name_enabled FROM shoal_polling.account WHERE id = %s", (account_id,)
        )
        row = await cur.fetchone()
        return bool(row and row[0])

    return await db.run(run, transaction=False)


class CardInvalidator:
    """Drops a card from the cache when an ingest commit announces it (LISTEN).

    On the same connection it hears new priority items (:data:`PRIORITY_CHANNEL`)
    and hands their payload to ``on_priority``; ``on_listen`` runs each time
    LISTEN is (re)established, since whatever was announced while nobody
    listened is lost.
    """

    def __init__(
        self,
        db: Database,
        cards: TtlCache[str, CardInfo],
        *,
        on_priority: Callable[[str], None] | None = None,
        on_listen: Callable[[], None] | None = None,
    ) -> None:
        self.db = db
        self.cards = cards
        self.on_priority = on_priority
        self.on_listen = on_listen
        self.listening = asyncio.Event()  # set while LISTEN is active
        self.invalidated = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            conn: AsyncConn | None = None
            try:
                conn = await self.db.connect()
                await conn.execute(f"LISTEN {CARD_CHANNEL}")
                if self.on_priority is not None:
                    await conn.execute(f"LISTEN {PRIORITY_CHANNEL}")
                # Whatever changed while nobody listened is unknown: start afresh.
                self.cards.clear()
                if self.on_listen is not None:
                    self.on_listen()
                self.listening.set()
                while not stop.is_set():
                    # A timeout, so that ``stop`` is seen within a second.
                    async for notify in conn.notifies(timeout=NOTIFY_WAIT_S):
                        if notify.channel == PRIORITY_CHANNEL:
                            if self.on_priority is not None:
                                self.on_priority(notify.payload)
                            continue
                        self.cards.invalidate(notify.payload)
                        self.invalidated += 1
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("card cache invalidation: %s; listening again", exc)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await stop.wait()
            finally:
                self.listening.clear()
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()
