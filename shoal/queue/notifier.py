"""LISTEN/NOTIFY: wakes idle workers the moment jobs arrive, and stops cancelled runs.

One dedicated connection per process listens on the schema's two channels.
A notification on the jobs channel sets the event of the queue it names.
Workers still poll, so a lost notification (or a dropped listen connection)
costs latency, not jobs.

A notification on the cancel channel names a run that was cancelled (a job's
id and attempt, or a batch item's id and fence, with their queue); it is
handed to the cancel listeners of that queue, which stop the run if they hold
it and ignore it otherwise (a dictionary lookup). Cancels sent while the
connection was down are lost: when it comes back, every cancel listener is
told to look up its runs itself (``cancels_missed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Protocol

from psycopg import sql

from shoal.clock import Clock
from shoal.db.pool import Database

log = logging.getLogger("shoal.notifier")

RECONNECT_DELAY_S = 1.0


@dataclass(frozen=True, slots=True)
class CancelNote:
    """A run that was cancelled: a job's (id, attempt), or a batch item's (id, fence)."""

    queue: str
    id: int
    attempt: int
    item: bool


class CancelListener(Protocol):
    """What holds runs of a queue: a worker (jobs), a batch item runner (items)."""

    def cancelled(self, note: CancelNote) -> None:
        """Stop the run ``note`` names if this listener holds it; else nothing."""

    def cancels_missed(self) -> None:
        """Cancels may have been lost (the listen connection was down): look them up."""


def parse_cancel(payload: str) -> CancelNote | None:
    """A cancel channel payload, or None when it is not one (logged)."""
    try:
        body = json.loads(payload)
        if "item" in body:
            return CancelNote(str(body["queue"]), int(body["item"]), int(body["fence"]), True)
        return CancelNote(str(body["queue"]), int(body["id"]), int(body["attempt"]), False)
    except (ValueError, TypeError, KeyError) as exc:
        log.warning("ignoring a malformed cancel notification %r (%s)", payload, exc)
        return None


class Notifier:
    """Per-queue wake-up events fed by LISTEN.

    The listen task writes the events; workers wait on them and clear them.
    """

    def __init__(
        self, db: Database, channel: str, *, clock: Clock, cancel_channel: str | None = None
    ) -> None:
        self._db = db
        self._channel = channel
        self._cancel_channel = cancel_channel
        self._clock = clock
        self._events: dict[str, set[asyncio.Event]] = {}
        # Registered by workers and item runners as they start, dropped as they
        # stop; called by the listen task.
        self._cancel_listeners: dict[str, set[CancelListener]] = {}
        self._task: asyncio.Task[None] | None = None
        self.listening = asyncio.Event()

    def subscribe(self, queue: str) -> asyncio.Event:
        event = asyncio.Event()
        self._events.setdefault(queue, set()).add(event)
        return event

    def unsubscribe(self, queue: str, event: asyncio.Event) -> None:
        self._events.get(queue, set()).discard(event)

    def listen_cancels(self, queue: str, listener: CancelListener) -> None:
        self._cancel_listeners.setdefault(queue, set()).add(listener)

    def unlisten_cancels(self, queue: str, listener: CancelListener) -> None:
        self._cancel_listeners.get(queue, set()).discard(listener)

    def cancel(self, note: CancelNote) -> None:
        """Hand a cancelled run to the listeners of its queue."""
        for listener in list(self._cancel_listeners.get(note.queue, ())):
            listener.cancelled(note)

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
                    if self._cancel_channel is not None:
                        await conn.execute(
                            sql.SQL("LISTEN {}").format(sql.Identifier(self._cancel_channel))
                        )
                    self.listening.set()
                    # Anything sent while we were away is lost: wake everyone
                    # once, and have every holder of runs look up its cancels.
                    for queue in list(self._events):
                        self.wake(queue)
                    for listeners in list(self._cancel_listeners.values()):
                        for listener in list(listeners):
                            listener.cancels_missed()
                    async for note in conn.notifies():
                        if note.channel == self._cancel_channel:
                            cancel = parse_cancel(note.payload)
                            if cancel is not None:
                                self.cancel(cancel)
                        else:
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
