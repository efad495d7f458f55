"""LISTEN/NOTIFY: wakes idle workers the moment jobs arrive.

One dedicated connection per process listens on the schema's channel; each
notification sets the event of the queue it names. Workers still poll, so a
lost notification (or a dropped listen connection) costs latency, not jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from psycopg import sql

from shoal.clock import Clock
from shoal.db.pool import Database

log = logging.getLogger("shoal.notifier")

RECONNECT_DELAY_S = 1.0


class Notifier:
    """Per-queue wake-up events fed by LISTEN.

    The listen task writes the events; workers wait on them and clear them.
    """

    def __init__(self, db: Database, channel: str, *, clock: Clock) -> None:
        self._db = db
        self._channel = channel
        self._clock = clock
        self._events: dict[str, set[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None
        self.listening = asyncio.Event()

    def subscribe(self, queue: str) -> asyncio.Event:
        event = asyncio.Event()
        self._events.setdefault(queue, set()).add(event)
        return event

    def unsubscribe(self, queue: str, event: asyncio.Event) -> None:
        self._events.get(queue, set()).discard(event)

    def wake(self, queue: str) -> None:
        for event in self._events.get(queue, ()):
            event.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._listen(), name="shoal-notifier")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _listen(self) -> None:
        while True:
            try:
                conn = await self._db.connect()
                try:
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
                    self.listening.set()
                    # Anything sent while we were away is lost: wake everyone once.
                    for queue in list(self._events):
                        self.wake(queue)
                    async for note in conn.notifies():
                        self.wake(note.payload)
                finally:
                    self.listening.clear()
                    with contextlib.suppress(Exception):
                        await conn.close()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # loop boundary: the listener must outlive a lost connection
                log.warning("listen connection lost (%s); reconnecting", exc)
            await self._clock.sleep(RECONNECT_DELAY_S)
