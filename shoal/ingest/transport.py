"""The interface both transports implement, and what a consumer needs of them.

Semantics follow NSQ's, as the reference used it (docs/ingest.md has the full
mapping): ``ack`` is FIN, ``nak(delay)`` is REQ with a delay and counts a
delivery, ``touch`` is TOUCH (more time for a slow apply). A message that is
neither acked nor nakked before its ack deadline is delivered again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Protocol

from shoal.db.pool import AsyncConn
from shoal.errors import TransientError
from shoal.ingest.message import Envelope

if TYPE_CHECKING:  # dedupe -> store -> this module (Depth)
    from shoal.ingest.dedupe import DoneStore

DEFAULT_PUBLISH_TIMEOUT = timedelta(seconds=5)
# How long a delivery may stay unacknowledged before it is delivered again.
DEFAULT_ACK_WAIT = timedelta(minutes=5)


class PublishError(TransientError):
    """The publish was not confirmed within its timeout: nothing may be assumed stored."""


@dataclass(frozen=True, slots=True)
class Depth:
    """A topic's backlog: everything not yet acknowledged, and how old the oldest is."""

    ready: int  # deliverable now
    in_flight: int  # delivered, not yet acked
    delayed: int  # nakked with a delay, not yet due
    oldest_age: timedelta | None  # now minus published_at of the oldest unacked message

    @property
    def total(self) -> int:
        return self.ready + self.in_flight + self.delayed


class Delivery(Protocol):
    """One delivery of one message; exactly one of ack / nak / term should follow."""

    @property
    def envelope(self) -> Envelope: ...

    @property
    def attempt(self) -> int: ...  # 1 on the first delivery

    async def ack(self) -> None: ...

    async def ack_done(self, done: DoneStore) -> None:
        """Mark the message done in ``done``, then ack (an applied message).

        The marker comes first, so a redelivery after a lost ack meets it. A
        transport whose messages live in the database ``done`` keeps its
        markers in writes both in one statement.
        """
        ...

    async def nak(self, delay: timedelta) -> None: ...

    async def term(self) -> None:
        """Never deliver again (the consumer has dead-lettered it)."""
        ...

    async def touch(self) -> None:
        """Extend the ack deadline by another ack wait."""
        ...


class Subscription(Protocol):
    async def fetch(self, limit: int, *, wait: timedelta) -> Sequence[Delivery]:
        """Up to ``limit`` deliveries; waits up to ``wait`` when none is ready."""
        ...

    async def ack_many(
        self, deliveries: Sequence[Delivery], *, done: DoneStore | None = None
    ) -> list[BaseException | None]:
        """Ack deliveries of this subscription together; with ``done``, as applied ones.

        The same as ``ack`` (``ack_done(done)``) on each, in as few writes as
        the transport allows, and without a task or a future per delivery.
        One entry per delivery, in order: None when it was acked, else the
        error that kept it from being acked (it is then delivered again
        after its ack wait). Never raises for a failed ack.
        """
        ...

    async def close(self) -> None: ...


async def mark_first(
    deliveries: Sequence[Delivery], done: DoneStore | None
) -> list[BaseException | None]:
    """Write the done-markers of ``deliveries`` (all at once) before their acks.

    For a marker store the ack cannot write to: one entry per delivery, None
    when its marker is written (or ``done`` is None), else the error, and
    such a delivery must not be acked.
    """
    if done is None:
        return [None] * len(deliveries)
    marks = await asyncio.gather(
        *(done.mark(d.envelope.id) for d in deliveries), return_exceptions=True
    )
    return [m if isinstance(m, BaseException) else None for m in marks]


class Transport(Protocol):
    name: str
    # The messages are rows of shoal's own database: ``publish`` can join the
    # caller's transaction (``conn``), and an ack commits in the database the
    # applies write to, after them.
    in_database: bool

    async def start(self) -> None:
        """Connect, create what is missing, and check durability settings (raise if unsafe)."""
        ...

    async def close(self) -> None: ...

    async def publish(
        self,
        topic: str,
        envelopes: Sequence[Envelope],
        *,
        timeout: timedelta = DEFAULT_PUBLISH_TIMEOUT,  # noqa: ASYNC109 - a deadline the transport owns
        conn: AsyncConn | None = None,
    ) -> None:
        """Store every envelope durably, or raise :class:`PublishError`: never buffer silently.

        With ``conn`` (only where :attr:`in_database`), inside that transaction.
        """
        ...

    async def subscribe(
        self, topic: str, group: str, *, max_in_flight: int, ack_wait: timedelta = DEFAULT_ACK_WAIT
    ) -> Subscription:
        """Take deliveries of ``topic`` for ``group``.

        ``ack_wait`` is the lease of each delivery: one neither acked nor
        nakked within it (its consumer died or hung) is delivered again, and
        ``touch`` extends it by another ``ack_wait``. It is the subscriber's,
        whatever the publisher's transport was built with.
        """
        ...

    async def depth(self, topic: str, group: str) -> Depth: ...
