"""Where a worker's next claim of its queue starts in the claim index.

A claim from the head of ``job_claim`` steps over the entry each claimed job
left behind until the entry is dead to every transaction. With a long
transaction open anywhere in the database that takes as long as the
transaction lasts, and every claim gets slower with its age
(the claims of shoal/queue/functions.sql, "Claims from a position", say more).
So the worker remembers the position of the last job it claimed and claims
after it, and claims from the head only now and then, for the jobs a claim
after the position cannot see (inserts that committed late, retries, jobs
whose start time came, jobs another claim held locked):

- after a claim that came back short: the queue looked empty after the
  position, and a job behind it may be all that waits (the claimer, gone
  idle, wakes for it when the limit below allows);
- at least every :data:`SWEEP_EVERY_S` seconds, for a queue that never
  runs dry;
- but never sooner than :data:`SWEEP_COST_SHARE` of the time allows: a
  claim from the head that took ``d`` seconds is not repeated for
  ``d / SWEEP_COST_SHARE`` seconds. Normally a claim from the head takes
  under a millisecond and this never binds; behind a long transaction it
  keeps the head's cost to a twentieth of the claimer's time, and the jobs
  behind the position wait that much longer.

Its times are real seconds (:func:`shoal.clock.work_seconds`), whatever clock
the worker runs on: they pace claims by what they cost the database, and a
test's clock moved while a claim ran is no part of that cost.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

# A queue whose claims always come back full still looks behind its position
# this often.
SWEEP_EVERY_S = 1.0
# The most of a claimer's time that claims from the head may take.
SWEEP_COST_SHARE = 0.05

Position = tuple[int, int]  # (priority, id) of a job, in job_claim's order
# (priority, turn, id) of an item job with a turn, in job_item_turn's order
# (lock_item_jobs_v2, shoal/queue/functions.sql).
ItemPosition = tuple[int, int, int]

P = TypeVar("P", Position, ItemPosition)


class Claimed(Protocol):
    @property
    def id(self) -> int: ...

    @property
    def priority(self) -> int: ...


def job_order(position: Position) -> tuple[int, int]:
    """job_claim's order: higher priority first, then lower id."""
    priority, job_id = position
    return (-priority, job_id)


def item_order(position: ItemPosition) -> tuple[int, int, int]:
    """job_item_turn's order among jobs with a turn: higher priority, lower turn, lower id."""
    priority, turn, job_id = position
    return (-priority, turn, job_id)


def last_of(jobs: Sequence[Claimed]) -> Position | None:
    """The position of the job in ``jobs`` that comes last in the claim index."""
    if not jobs:
        return None
    return max(((job.priority, job.id) for job in jobs), key=job_order)


class ClaimCursor(Generic[P]):
    """One claimer's position in its queue and when it next claims from the head.

    A worker's plain claim keeps a :data:`Position` in ``job_claim``; the
    batch layer's claim of item jobs keeps an :data:`ItemPosition` in
    ``job_item_turn``: ``ClaimCursor(job_order)`` and ``ClaimCursor(item_order)``.
    """

    def __init__(self, order: Callable[[P], Any]) -> None:
        self._order: Callable[[P], Any] = order
        self.position: P | None = None
        self._short = True  # the last claim came back short (or none was made)
        self._from_head = True  # the last claim started at the head (or none was made)
        self._sweep_done_at = float("-inf")
        self._sweep_cost_s = 0.0

    def head_due_in(self, now: float) -> float | None:
        """Seconds until a claim from the head is due, if one is owed; else None.

        One is owed after a claim from the position came back short while the
        head was too dear to claim from: a job behind the position may be
        waiting, and nothing else would wake the claimer for it.
        """
        if self._from_head or not self._short:
            return None
        return max(0.0, self._sweep_done_at + self._sweep_cost_s / SWEEP_COST_SHARE - now)

    def start(self, now: float) -> P | None:
        """Where a claim beginning at ``now`` starts: after a position, or at the head (None)."""
        if self.position is None:
            return None
        since = now - self._sweep_done_at
        if since < self._sweep_cost_s / SWEEP_COST_SHARE:
            return self.position
        if self._short or since >= SWEEP_EVERY_S:
            return None
        return self.position

    def advance(
        self: ClaimCursor[Position],
        after: Position | None,
        jobs: Sequence[Claimed],
        *,
        limit: int,
        ended: float,
        cost_s: float,
    ) -> None:
        """Record a claim of ``job_claim`` that started at ``after`` (see :meth:`start`)."""
        self.moved(after, last_of(jobs), count=len(jobs), limit=limit, ended=ended, cost_s=cost_s)

    def moved(
        self,
        after: P | None,
        last: P | None,
        *,
        count: int,
        limit: int,
        ended: float,
        cost_s: float,
    ) -> None:
        """Record a claim that started at ``after``: ``count`` jobs, the last at ``last``.

        ``ended`` is when it ended and ``cost_s`` what its statement took on
        its connection, without the wait for one from the pool (seconds while
        the database fails over, which no claim from the head should be
        held off for twenty times over).
        """
        self._short = count < limit
        self._from_head = after is None
        if after is not None:
            if last is not None:
                self.position = last
            return
        self._sweep_done_at = ended
        self._sweep_cost_s = cost_s
        if self.position is None or not self._short:
            # A full claim from the head may have stopped short of the old
            # position with more jobs behind it: the next claims go on from
            # where it stopped.
            self.position = last if last is not None else self.position
        elif last is not None and self._order(last) > self._order(self.position):
            # A short one saw every waiting job: nothing behind either.
            self.position = last
