"""Item jobs claimed after the last one claimed, and deleted when taken.

A batch kind's claim walked ``job_item_turn`` from its head, over the entry
every taken item job leaves there until vacuum; behind a long transaction
(or between two autovacuum passes of a busy table) every claim of a task
got slower as the task drained. These tests hold such a transaction open for
real and count the index entries a claim reads, and check that the claim
from a position keeps the kind's order: retries first, then turns.
"""

from __future__ import annotations

import psycopg

from shoal import FakeClock, Shoal
from shoal.batch.service import Batches
from shoal.clock import work_seconds
from shoal.queue.cursor import ClaimCursor, item_order

from .batch_helpers import make_batches, running, settle, sql

QUEUE = "batch.test.kind"
ENTRIES_READ = "SELECT pg_stat_get_xact_tuples_returned('shoal.job_item_turn'::regclass)"


async def entries_read_by_claim(db_url: str, after: tuple[int, int, int] | None) -> tuple[int, int]:
    """(item jobs claimed, job_item_turn entries read) by one claim, rolled back."""
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        before = (await (await conn.execute(ENTRIES_READ)).fetchone() or [0])[0]
        priority, turn, job_id = after if after is not None else (None, None, None)
        cur = await conn.execute(
            "SELECT count(*) FROM shoal.claim_items_v4(%s, 10, NULL, %s, %s, %s, NULL)"
            " WHERE job_id IS NOT NULL",
            (QUEUE, priority, turn, job_id),
        )
        claimed = (await cur.fetchone() or [0])[0]
        read = (await (await conn.execute(ENTRIES_READ)).fetchone() or [0])[0]
        await conn.rollback()
    return claimed, read - before


async def test_behind_a_long_transaction_an_item_claim_after_its_position_reads_no_taken_entries(
    fake_boss: Shoal, clock: FakeClock, db_url: str
) -> None:
    batches = make_batches(fake_boss)
    runner = batches.runners["test.kind"]
    async with await psycopg.AsyncConnection.connect(db_url) as old:
        # The transaction vacuum must keep every row version for.
        await old.execute("SELECT txid_current()")
        await batches.create("test.kind", [f"r{i}" for i in range(3_010)])
        for _ in range(3):
            assert len(await runner.claim(QUEUE, 1_000, now=clock.now())) == 1_000
        position = runner.cursor.position
        assert position is not None

        from_head, head_reads = await entries_read_by_claim(db_url, None)
        after, after_reads = await entries_read_by_claim(db_url, position)
        await old.rollback()
    assert from_head == after == 10
    # From the head, the claim reads the 3,000 entries of taken jobs (and each
    # one's row, to see it no longer waits); from the position, only the 10
    # waiting ones.
    assert head_reads >= 3_010, head_reads
    assert after_reads <= 20, after_reads


async def test_a_taken_item_job_is_deleted_and_the_item_records_the_run(
    fake_boss: Shoal, clock: FakeClock, db_url: str
) -> None:
    batches = make_batches(fake_boss)
    created = await batches.create("test.kind", ["a", "b"])
    claimed = await batches.runners["test.kind"].claim(QUEUE, 10, now=clock.now())
    assert len(claimed) == 2
    assert await sql(db_url, "SELECT count(*) FROM shoal.job WHERE queue = %s", QUEUE) == [(0,)]
    assert await sql(db_url, "SELECT ref, status::text, attempt FROM shoal.item ORDER BY ref") == [
        ("a", "running", 1),
        ("b", "running", 1),
    ]
    assert (await batches.get(created.task_id)).status == "processing"


async def test_an_item_claim_from_a_position_takes_retries_first_then_the_turns_after_it(
    fake_boss: Shoal, clock: FakeClock, db_url: str
) -> None:
    batches = make_batches(fake_boss)
    runner = batches.runners["test.kind"]
    await batches.create("test.kind", ["a1", "a2", "a3", "a4", "a5"])
    first = await runner.claim(QUEUE, 2, now=clock.now())
    assert await refs_of(db_url, [int(j.data["item"]) for j in first]) == ["a1", "a2"]
    at = runner.cursor.position
    assert at is not None and at[1] == 1  # turns count from 0: a2 had turn 1
    # Behind the position: a3's job with an earlier turn (as a task whose
    # jobs committed late). Ahead of it whatever the position: a4's at a
    # higher priority, and a5's without a turn (a retry, a re-dispatch).
    await set_job(db_url, "a3", "data = jsonb_set(data, '{turn}', '0')")
    await set_job(db_url, "a4", "priority = 5")
    await set_job(db_url, "a5", "data = data - 'turn'")
    # A claim from the head just now, full: the next one starts at the position.
    now = work_seconds()
    runner.cursor.moved(None, at, count=2, limit=2, ended=now, cost_s=0.0)
    nxt = await runner.claim(QUEUE, 10, now=clock.now())
    assert await refs_of(db_url, [int(j.data["item"]) for j in nxt]) == ["a4", "a5"]
    # The claim from the head that this short claim owes finds a3 (a new
    # cursor claims from the head at once).
    runner.cursor = ClaimCursor(item_order)
    last = await runner.claim(QUEUE, 10, now=clock.now())
    assert await refs_of(db_url, [int(j.data["item"]) for j in last]) == ["a3"]


async def set_job(db_url: str, ref: str, assignment: str) -> None:
    (item,) = await sql(db_url, "SELECT id FROM shoal.item WHERE ref = %s", ref)
    await sql(db_url, f"UPDATE shoal.job SET {assignment} WHERE data->>'item' = %s", str(item[0]))


async def refs_of(db_url: str, item_ids: list[int]) -> list[str]:
    rows = await sql(
        db_url,
        "SELECT i.ref FROM unnest(%s::bigint[]) WITH ORDINALITY u(id, n)"
        " JOIN shoal.item i ON i.id = u.id ORDER BY u.n",
        item_ids,
    )
    return [str(r[0]) for r in rows]


async def test_a_task_whose_jobs_commit_behind_the_position_still_completes(
    fake_boss: Shoal, clock: FakeClock, db_url: str
) -> None:
    """Jobs with turns behind a worker's position are found by its claims from the head."""
    batches: Batches = make_batches(fake_boss)
    runner = batches.runners["test.kind"]
    await batches.create("test.kind", [f"b{i}" for i in range(5)])
    assert len(await runner.claim(QUEUE, 5, now=clock.now())) == 5
    # A worker whose position is past every turn the next task's jobs get
    # (its first claims from the head were full a moment ago): its claim
    # after the position finds nothing, and its claims from the head must.
    runner.cursor = ClaimCursor(item_order)
    now = work_seconds()
    runner.cursor.moved(None, (0, 1_000, 10**12), count=1, limit=1, ended=now, cost_s=0.0)
    small = await batches.create("test.kind", ["s1", "s2"])
    async with running(batches):
        await settle(batches, small.task_id)
    assert (await batches.get(small.task_id)).progress.completed == 2
