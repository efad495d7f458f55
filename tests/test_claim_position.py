"""Claims that start after the last claimed job, and the claims from the head that find the rest.

A long transaction anywhere in the database keeps the claim index's entries
of every job claimed since it began; a claim from the head steps over all of
them. These tests hold such a transaction open for real and count the blocks
a claim reads, and check that no waiting job is left behind the position.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, NamedTuple

import psycopg
import pytest

from shoal import FakeClock, Job, Shoal
from shoal.clock import work_seconds
from shoal.db import Database
from shoal.queue.cursor import SWEEP_COST_SHARE, SWEEP_EVERY_S, ClaimCursor, job_order, last_of
from shoal.testing import Probe

from .conftest import wait_for

# Index entries read from job_claim in this transaction (idx_tup_read).
ENTRIES_READ = "SELECT pg_stat_get_xact_tuples_returned(%s::regclass)"


async def entries_read(
    db_url: str,
    statement: str,
    params: Sequence[Any] | Mapping[str, Any],
    index: str = "shoal.job_claim",
) -> tuple[int, int]:
    """(rows returned, ``index`` entries read) by one run of ``statement``, rolled back."""
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        before = (await (await conn.execute(ENTRIES_READ, (index,))).fetchone() or [0])[0]
        cur = await conn.execute(statement, params)
        returned = len(await cur.fetchall())
        read = (await (await conn.execute(ENTRIES_READ, (index,))).fetchone() or [0])[0]
        await conn.rollback()
    return returned, read - before


async def entries_read_by_claim(db_url: str, after: tuple[int, int] | None) -> tuple[int, int]:
    """(jobs claimed, job_claim entries read) by one claim, rolled back."""
    priority, job_id = after if after is not None else (None, None)
    return await entries_read(
        db_url, "SELECT * FROM shoal.claim_jobs_v4('q', 10, NULL, %s, %s, NULL)", (priority, job_id)
    )


async def test_behind_a_long_transaction_a_claim_after_its_position_reads_no_claimed_entries(
    boss: Shoal, db_url: str
) -> None:
    async with await psycopg.AsyncConnection.connect(db_url) as old:
        # The transaction vacuum must keep every row version for.
        await old.execute("SELECT txid_current()")
        await boss.insert([{"queue": "q"}] * 5_000)
        position = None
        for _ in range(10):
            claimed = await boss.store.claim("q", 500, now=None, after=position)
            assert len(claimed) == 500
            position = last_of(claimed) or position
        await boss.insert([{"queue": "q"}] * 10)

        from_head, head_reads = await entries_read_by_claim(db_url, None)
        after, after_reads = await entries_read_by_claim(db_url, position)
        await old.rollback()
    assert from_head == after == 10
    # From the head, the claim reads the 5,000 entries of claimed jobs (and
    # each one's row, to see it no longer waits); from the position, only
    # the 10 waiting ones.
    assert head_reads >= 5_010, head_reads
    assert after_reads <= 20, after_reads


async def test_a_claim_after_a_position_keeps_priority_order_and_skips_only_what_is_behind(
    boss: Shoal,
) -> None:
    ids = await boss.insert([{"queue": "q", "data": i} for i in range(6)])
    first = await boss.store.claim("q", 3, now=None)
    assert [c.id for c in first] == ids[:3]
    position = last_of(first)
    assert position == (0, ids[2])
    # Arriving after the claim: a higher priority (found first whatever the
    # position), a lower one (found once the position's priority runs out).
    (high,) = await boss.insert([{"queue": "q", "priority": 5}])
    (low,) = await boss.insert([{"queue": "q", "priority": -1}])
    nxt = await boss.store.claim("q", 10, now=None, after=position)
    assert [c.id for c in nxt] and {c.id for c in nxt} == {high, *ids[3:], low}
    assert last_of(nxt) == (-1, low)


async def test_a_job_that_commits_behind_the_position_is_run(boss: Shoal, db_url: str) -> None:
    ran: list[int] = []
    late_ran = asyncio.Event()

    async def handler(job: Job) -> None:
        ran.append(job.data)
        if job.data == "late":
            late_ran.set()

    probe = Probe(boss)
    assert boss.notifier is not None
    async with await psycopg.AsyncConnection.connect(db_url) as late:
        # Takes its id first, commits last: the worker claims the later ids
        # and moves its position past this one before it is visible.
        await late.execute("SELECT shoal.send('q', '\"late\"')")
        await boss.insert([{"queue": "q", "data": i} for i in range(3)])
        # The test ends long before the poll interval: only the NOTIFY and a
        # claim from the head can find it.
        worker = boss.work("q", handler, poll_interval=timedelta(seconds=60))
        await asyncio.wait_for(boss.notifier.listening.wait(), 30)
        await wait_for(lambda: worker.stats.completed == 3)
        await probe.idle("q")
        await late.commit()
    await asyncio.wait_for(late_ran.wait(), 30)
    await wait_for(lambda: worker.stats.completed == 4)
    await worker.stop()
    assert sorted(map(str, ran)) == ["0", "1", "2", "late"]


class Claimed(NamedTuple):
    id: int
    priority: int


def claimed(job_id: int, priority: int = 0) -> Claimed:
    return Claimed(job_id, priority)


def test_the_last_position_is_the_lowest_priority_then_the_highest_id() -> None:
    jobs = [claimed(7, 5), claimed(3, 0), claimed(9, 0), claimed(1, 0)]
    assert last_of(jobs) == (0, 9)
    assert last_of([*jobs, claimed(2, -3)]) == (-3, 2)
    assert last_of([]) is None


def test_the_cursor_claims_from_the_head_when_short_and_each_second_when_full() -> None:
    cursor = ClaimCursor(job_order)
    assert cursor.start(0.0) is None  # nothing claimed yet
    cursor.advance(None, [claimed(1), claimed(2)], limit=2, ended=0.0001, cost_s=0.0001)
    assert cursor.start(0.01) == (0, 2)  # full: go on after the last one
    cursor.advance((0, 2), [claimed(3), claimed(4)], limit=2, ended=0.02, cost_s=0.01)
    assert cursor.start(0.5) == (0, 4)
    # A queue whose claims never come back short still looks behind its
    # position every SWEEP_EVERY_S.
    assert cursor.start(0.0001 + SWEEP_EVERY_S) is None
    # A short claim after the position: the next one starts at the head.
    cursor.advance((0, 4), [claimed(5)], limit=2, ended=0.61, cost_s=0.01)
    assert cursor.start(0.62) is None


def test_a_slow_claim_from_the_head_is_not_repeated_until_its_share_of_time_has_passed() -> None:
    cursor = ClaimCursor(job_order)
    cursor.advance(None, [claimed(1), claimed(2)], limit=2, ended=0.0, cost_s=0.0)
    # Behind a long transaction, the head took 0.5 s to walk.
    cursor.advance(None, [claimed(3)], limit=2, ended=1.5, cost_s=0.5)
    assert cursor.position == (0, 3)
    quiet_until = 1.5 + 0.5 / SWEEP_COST_SHARE
    assert cursor.start(2.0) == (0, 3)  # short, but the head is too dear yet
    assert cursor.start(quiet_until - 0.01) == (0, 3)
    assert cursor.start(quiet_until) is None


@pytest.mark.parametrize("full", [True, False])
def test_a_claim_from_the_head_moves_the_position_back_only_when_it_came_back_full(
    full: bool,
) -> None:
    cursor = ClaimCursor(job_order)
    cursor.advance(None, [claimed(100)], limit=1, ended=0.0, cost_s=0.0)
    assert cursor.position == (0, 100)
    # Jobs behind the position turned up (late commits, retries).
    found = [claimed(10), claimed(11)] if full else [claimed(10)]
    cursor.advance(None, found, limit=2, ended=2.0, cost_s=0.0)
    # Full: more may wait between 11 and 100, and the next claims go through
    # them. Short: the head claim saw everything waiting, 100 stays.
    assert cursor.position == ((0, 11) if full else (0, 100))


def test_a_short_claim_after_the_position_owes_a_claim_from_the_head() -> None:
    cursor = ClaimCursor(job_order)
    assert cursor.head_due_in(0.0) is None
    cursor.advance(None, [claimed(1)], limit=1, ended=0.1, cost_s=0.1)
    assert cursor.head_due_in(0.2) is None  # from the head: nothing owed
    cursor.advance((0, 1), [claimed(2)], limit=1, ended=0.2, cost_s=0.0)
    assert cursor.head_due_in(0.3) is None  # full: the next claim comes anyway
    cursor.advance((0, 2), [], limit=1, ended=0.3, cost_s=0.0)
    # Short behind a head claim that took 0.1 s: owed once its share passed.
    assert cursor.head_due_in(0.3) == pytest.approx(0.1 + 0.1 / SWEEP_COST_SHARE - 0.3)
    assert cursor.head_due_in(5.0) == 0.0


async def test_a_clock_moved_during_a_claim_does_not_hold_off_the_claims_from_the_head(
    fake_boss: Shoal, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A due job behind the position runs, though the test's clock jumped while a claim ran.

    The claim's cost is real time: measured on the clock, the jump made the
    claim look six minutes dear, and the worker held off claiming from the
    head for twenty times that, so the job waited on a clock nobody moved.
    """
    ran: list[str] = []
    probe = Probe(fake_boss)
    # Lowest id, due in 5 minutes: once due, it waits behind the position.
    await fake_boss.insert([{"queue": "q", "data": "later", "start_after": timedelta(minutes=5)}])
    await fake_boss.insert([{"queue": "q", "data": i} for i in range(3)])

    async def handler(job: Job) -> None:
        ran.append(str(job.data))

    worker = fake_boss.work("q", handler, poll_interval=timedelta(hours=1))
    await probe.job_finished("q", outcome="completed", count=3)
    await probe.idle("q")

    claim = fake_boss.store.claim_with_cost
    jumps = [timedelta(minutes=6)]

    async def claim_while_the_clock_jumps(*args: Any, **kwargs: Any) -> Any:
        if jumps:
            clock.advance(jumps.pop())
        return await claim(*args, **kwargs)

    monkeypatch.setattr(fake_boss.store, "claim_with_cost", claim_while_the_clock_jumps)
    # Wakes the worker (NOTIFY); its claim from the head, with the clock
    # jumping past the later job's start, finds the new job only: the claim
    # was given the time from before the jump.
    await fake_boss.insert([{"queue": "q", "data": "woke"}])
    await probe.job_finished("q", outcome="completed")
    assert sorted(ran) == ["0", "1", "2", "woke"]
    # The next wake claims after the position, and finds only what is after
    # it; the due job behind it is found by the claim from the head that the
    # short claim owes, as soon as the head's real cost allows.
    await fake_boss.insert([{"queue": "q", "data": "again"}])
    await probe.job_finished("q", outcome="completed", count=2)
    await worker.stop()
    assert sorted(ran) == ["0", "1", "2", "again", "later", "woke"]


async def test_a_claims_cost_leaves_out_its_wait_for_a_pooled_connection(db_url: str) -> None:
    """What paces the claims from the head is the statement's time, not the pool's.

    While the database fails over, a claim can wait seconds for a pooled
    connection. Counted as the claim's cost, that wait held off the claims
    from the head for twenty times as long, and the jobs a lost claim had put
    back behind the position waited past a minute (tests/test_pg_failover.py).
    """
    db = await Database(db_url, min_size=1, max_size=1).open()
    boss = Shoal(db)
    try:
        await boss.insert([{"queue": "q"}] * 3)
        async with db.connection():  # the pool's only connection, held
            claiming = asyncio.create_task(boss.store.claim_with_cost("q", 10, now=None))
            await wait_for(lambda: db.pool.get_stats().get("requests_waiting", 0) == 1)
            released = work_seconds()
        claim = await claiming
        ended = work_seconds()
        assert len(claim.jobs) == 3
        # The statement ran after the connection came back, so within that
        # stretch; counted from the call, the cost would include the wait.
        assert 0.0 < claim.cost_s <= ended - released
    finally:
        await boss.close()
