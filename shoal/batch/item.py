"""What a batch handler receives: one item of a task."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from shoal._deprecation import warn_renamed
from shoal.batch.rows import GuardedItem
from shoal.batch.states import ItemId, TaskId
from shoal.errors import JobCancelled
from shoal.queue.job import Job


class Item:
    """One item, running under the phantom guard.

    ``attempt`` numbers this run: 1 on the first, at most ``retry_limit + 1``
    (counted again from 1 when ``retry_failed`` reopens the item). ``fence``
    is the fencing token of this claim, not a run number. The worker keeps the item's sign of
    life fresh on its own while the handler runs; a handler that may run past
    its kind's ``expire_in`` calls ``await item.heartbeat()`` to extend it.

    When the item's task is cancelled while the handler runs, ``cancelled``
    becomes True and an async handler is stopped (its task cancelled); a plain
    ``def`` handler, in a thread that cannot be interrupted, checks
    ``item.cancelled`` or calls ``item.raise_if_cancelled()`` between steps.
    """

    __slots__ = ("_cancelled", "_guarded", "_heartbeat", "job")

    def __init__(
        self, guarded: GuardedItem, job: Job, heartbeat: Callable[[Item], Awaitable[bool]]
    ) -> None:
        self._guarded = guarded
        self._heartbeat = heartbeat
        self.job = job
        # Set by the item runner (a cancel notification, or a heartbeat that
        # found the item cancelled), read by the handler, maybe from its own
        # thread: a bool written once, False to True.
        self._cancelled = False

    @property
    def id(self) -> ItemId:
        return self._guarded.id

    @property
    def ref(self) -> str:
        return self._guarded.ref

    @property
    def data(self) -> Any:
        return self._guarded.data

    @property
    def task_id(self) -> TaskId:
        return self._guarded.task_id

    @property
    def kind(self) -> str:
        return self._guarded.kind

    @property
    def params(self) -> Any:
        """The task's ``params``, shared by all its items."""
        return self._guarded.params

    @property
    def attempt(self) -> int:
        """Which run of the item this is: 1 on the first (the store's ``run``)."""
        return self._guarded.run

    @property
    def retry_limit(self) -> int:
        """How many runs may follow the first (the kind's ``retry_limit``)."""
        return self._guarded.max_attempts - 1

    @property
    def is_last_attempt(self) -> bool:
        """True when a transient failure of this run will not be retried."""
        return self.attempt > self.retry_limit

    @property
    def max_attempts(self) -> int:
        """Deprecated: ``retry_limit + 1``."""
        warn_renamed("Item.max_attempts", "Item.retry_limit + 1")
        return self._guarded.max_attempts

    @property
    def fence(self) -> int:
        """The fencing token of this claim: the item's claim counter (its row's ``attempt`` column).

        It grows with every claim of the item, handed-back ones included, so
        it may run ahead of :attr:`attempt`; the run's final write counts only
        while the item row still holds it.
        """
        return self._guarded.fence

    def report_cost(self, cost: int) -> None:
        """What this run really cost against its kind's ``rate_limit`` (docs/limits.md).

        Each start takes one token; when the run ends, the kind's bucket is
        charged the difference (an LLM call's tokens, say). On a kind
        without a rate it changes nothing.

        >>> item.report_cost(4_120)  # doctest: +SKIP
        """
        self.job.report_cost(cost)

    @property
    def cancelled(self) -> bool:
        """True once the item's task was cancelled while this run held it."""
        return self._cancelled

    def mark_cancelled(self) -> None:
        """Called by the item runner when it learns the item was cancelled."""
        self._cancelled = True

    def raise_if_cancelled(self) -> None:
        """Raise :class:`~shoal.JobCancelled` once the item's task was cancelled; else nothing."""
        if self._cancelled:
            raise JobCancelled(f"item {self.id}: its task was cancelled while it ran")

    async def heartbeat(self) -> bool:
        """Extend the job's execution deadline and the item's sign of life.

        False when the item is no longer this worker's (reaped, cancelled).
        """
        return await self._heartbeat(self)

    def __repr__(self) -> str:
        return f"Item(id={self.id}, ref={self.ref!r}, task={self.task_id}, attempt={self.attempt})"
