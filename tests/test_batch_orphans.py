"""The aggregator's orphan sweep re-sends only items that truly have no job,
and the claim takes item jobs without ever waiting for a lock."""

from __future__ import annotations

from datetime import timedelta

import psycopg

from shoal import FakeClock, Shoal
from shoal.batch.states import ItemStatus
from shoal.queue.cursor import ClaimCursor, item_order

from .batch_helpers import make_batches, sql


async def test_sweep_leaves_pending_items_whose_job_waits_alone(
    fake_boss: Shoal, clock: FakeClock, db_url: str
) -> None:
    batches = make_batches(fake_boss, zombie_timeout=timedelta(seconds=2))
    created = await batches.create("test.kind", ["a", "b", "c"])
    before = await sql(db_url, "SELECT id, updated_at FROM shoal.item ORDER BY id")
    # Long past the zombie timeout, and nobody has claimed the jobs yet (busy workers).
    clock.advance(timedelta(minutes=10))
    report = await batches.aggregator.run_once()
    assert report.redispatched == 0
    # Not touched, not locked, not re-sent: a waiting job makes an item no orphan.
    assert await sql(db_url, "SELECT id, updated_at FROM shoal.item ORDER BY id") == before
    assert await sql(db_url, "SELECT count(*) FROM shoal.job WHERE queue = 'batch.test.kind'") == [
        (3,)
    ]
    view = await batches.get(created.task_id)
    assert view.progress.pending == 3


async def test_sweep_resends_an_item_whose_job_is_gone(
    fake_boss: Shoal, clock: FakeClock, db_url: str
) -> None:
    batches = make_batches(fake_boss, zombie_timeout=timedelta(seconds=2))
    created = await batches.create("test.kind", ["a", "b"])
    ((kept, lost),) = await sql(
        db_url,
        "SELECT (SELECT id FROM shoal.item WHERE ref = 'a'), "
        "(SELECT id FROM shoal.item WHERE ref = 'b')",
    )
    # Its job was cancelled through the queue's API: the item is stranded.
    await sql(
        db_url,
        "UPDATE shoal.job SET state = 'cancelled', finished_at = now() WHERE singleton_key = %s",
        f"item-{lost}:0",
    )
    clock.advance(timedelta(seconds=1))
    assert (await batches.aggregator.run_once()).redispatched == 0  # not yet a zombie timeout
    clock.advance(timedelta(seconds=2))
    assert (await batches.aggregator.run_once()).redispatched == 1
    waiting = await sql(
        db_url,
        "SELECT data->>'item', singleton_key FROM shoal.job "
        "WHERE queue = 'batch.test.kind' AND state = 'created' ORDER BY id",
    )
    assert sorted(waiting) == sorted([(str(kept), f"item-{kept}:0"), (str(lost), f"item-{lost}:0")])
    # Its new job is waiting now: the next pass leaves it alone.
    clock.advance(timedelta(minutes=10))
    assert (await batches.aggregator.run_once()).redispatched == 0
    # And the item runs from it.
    claimed = await batches.runners["test.kind"].claim("batch.test.kind", 10, now=clock.now())
    assert len(claimed) == 2
    items = (await batches.items(created.task_id, status=ItemStatus.RUNNING)).items
    assert sorted(i.ref for i in items) == ["a", "b"]


async def test_claim_skips_a_job_whose_item_is_locked_and_takes_it_later(
    fake_boss: Shoal, clock: FakeClock, db_url: str
) -> None:
    batches = make_batches(fake_boss)
    await batches.create("test.kind", ["a", "b"])
    runner = batches.runners["test.kind"]
    async with await psycopg.AsyncConnection.connect(db_url) as holder:
        # Another transaction holds item a for a moment (an aggregator pass, say).
        await holder.execute("SELECT id FROM shoal.item WHERE ref = 'a' FOR UPDATE")
        # The claim neither waits for it nor takes its job.
        first = await runner.claim("batch.test.kind", 10, now=clock.now())
        assert [job.data["item"] for job in first] == [
            (await sql(db_url, "SELECT id FROM shoal.item WHERE ref = 'b'"))[0][0]
        ]
        await holder.rollback()
    # The job skipped lies behind the runner's position now: the claim from
    # the head that the short claim owes takes it (a new cursor claims from
    # the head at once; the worker's waits until the head's cost allows).
    runner.cursor = ClaimCursor(item_order)
    second = await runner.claim("batch.test.kind", 10, now=clock.now())
    assert [job.data["item"] for job in second] == [
        (await sql(db_url, "SELECT id FROM shoal.item WHERE ref = 'a'"))[0][0]
    ]
    assert await sql(db_url, "SELECT count(*) FROM shoal.item WHERE status = 'running'") == [(2,)]


async def test_sweep_probes_each_candidates_job_by_queue_and_key(
    fake_boss: Shoal, clock: FakeClock, db_url: str
) -> None:
    batches = make_batches(fake_boss, zombie_timeout=timedelta(seconds=2))
    await batches.create("test.kind", [f"doc-{i}" for i in range(200)])
    clock.advance(timedelta(minutes=1))
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        # Any plan the statistics may suggest must still probe, never scan, the queue's jobs.
        await conn.execute("SET enable_hashjoin = off")
        await conn.execute("SET enable_mergejoin = off")
        cur = await conn.execute(
            psycopg.sql.SQL("EXPLAIN ") + batches.store.sql["sweep_orphans"],
            {"limit": 1000, "now": clock.now()},
        )
        plan = "\n".join(str(row[0]) for row in await cur.fetchall())
        # Each candidate is asked of the queue's function, never joined with its jobs.
        assert "singleton_held_v1(" in plan and "job " not in plan, plan
        # And the function's own statement, under its own planner settings,
        # probes job_singleton by both.
        cur = await conn.execute(
            "SELECT prosrc, proconfig FROM pg_proc WHERE proname = 'singleton_held_v1'"
        )
        ((body, config),) = await cur.fetchall()
        for setting in config:
            name, _, value = setting.partition("=")
            await conn.execute(
                psycopg.sql.SQL("SET {} = {}").format(
                    psycopg.sql.Identifier(name), psycopg.sql.Literal(value)
                )
            )
        statement = body.strip().rstrip(";")
        statement = statement.replace("p_queue", "'batch.test.kind'")
        statement = statement.replace("p_singleton_key", "'item-1:0'")
        cur = await conn.execute(psycopg.sql.SQL("EXPLAIN " + statement))  # type: ignore[arg-type]
        inner = "\n".join(str(row[0]) for row in await cur.fetchall())
    probe = inner[inner.index("job_singleton") :].splitlines()[1]
    assert "queue =" in probe and "singleton_key =" in probe, inner
