"""The plans of the claims, completions, acks and marker checks do not depend on statistics."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from shoal import Shoal
from shoal.ingest.store import IngestStore


async def explain_into(conn: psycopg.AsyncConnection[Any], notices: list[str]) -> None:
    """Every statement ``conn`` runs from now on, nested ones too, has its plan in ``notices``."""
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    await conn.execute("LOAD 'auto_explain'")
    await conn.execute("SET auto_explain.log_min_duration = 0")
    await conn.execute("SET auto_explain.log_nested_statements = on")
    await conn.execute("SET auto_explain.log_level = 'notice'")
    await conn.execute("SET client_min_messages = notice")


async def claim_plan(db_url: str) -> str:
    notices: list[str] = []
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await explain_into(conn, notices)
        await conn.execute("BEGIN")
        await conn.execute("SELECT * FROM shoal.claim_jobs_v4('q', 10, NULL, NULL, NULL, NULL)")
        await conn.execute("ROLLBACK")
    return "\n".join(notices)


async def test_claim_walks_the_claim_index_with_statistics_from_an_empty_queue(
    boss: Shoal, db_url: str
) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("ALTER TABLE shoal.job SET (autovacuum_enabled = false)")
        await conn.execute("ANALYZE shoal.job")  # statistics say: empty
    await boss.insert([{"queue": "q"}] * 5_000 + [{"queue": "other"}] * 5_000)
    stale = await claim_plan(db_url)
    assert "Index Scan using job_claim" in stale, stale
    assert "Seq Scan" not in stale and "Sort" not in stale, stale
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("ANALYZE shoal.job")  # statistics say: full
    fresh = await claim_plan(db_url)
    assert "Index Scan using job_claim" in fresh, fresh


async def test_completion_probes_the_primary_key_while_statistics_say_no_job_is_active(
    boss: Shoal, db_url: str
) -> None:
    # Statistics taken while every job waited: the planner expects one active
    # row. complete_jobs_v1's fence (state = 'active') then let it scan
    # job_lease once per unnested id, (active x batch) work per completion.
    await boss.insert([{"queue": "q"}] * 200)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("ALTER TABLE shoal.job SET (autovacuum_enabled = false)")
        await conn.execute("ANALYZE shoal.job")
    claimed = await boss.store.claim("q", 200, now=None)
    notices: list[str] = []
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await explain_into(conn, notices)
        done = await boss.store.complete(
            [(c.id, c.attempt, None) for c in claimed], now=None, conn=conn
        )
    assert done == {c.id for c in claimed}
    plan = next(n for n in notices if "Update on job" in n)
    assert "Hash Join" in plan and "Index Cond: (id = ANY" in plan, plan
    assert "job_lease" not in plan and "Nested Loop" not in plan, plan


async def test_an_item_claim_takes_its_jobs_by_primary_key_while_statistics_say_none_waits(
    fake_boss: Shoal, db_url: str
) -> None:
    # Statistics taken while no job waited (every job of the table taken):
    # the planner expects no waiting row. A fence of state IN ('created',
    # 'retry') (job_claim's predicate) then let it scan every
    # waiting job's entry of job_claim for each job taken: 37 s for a claim
    # of 500 with 290,000 jobs waiting.
    from .batch_helpers import make_batches

    batches = make_batches(fake_boss)
    await fake_boss.insert([{"queue": "done", "data": i} for i in range(300)])
    await fake_boss.store.claim("done", 300, now=None)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("ALTER TABLE shoal.job SET (autovacuum_enabled = false)")
        await conn.execute("ANALYZE shoal.job")
    await batches.create("test.kind", [f"r{i}" for i in range(200)])
    notices: list[str] = []
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await explain_into(conn, notices)
        cur = await conn.execute(
            "SELECT count(*) FROM shoal.claim_items_v4('batch.test.kind', 100, NULL,"
            " NULL, NULL, NULL, NULL) WHERE job_id IS NOT NULL"
        )
        assert await cur.fetchone() == (100,)
    plan = next(n for n in notices if "Delete on job" in n)
    assert "Index Scan using job_pkey" in plan and "Index Cond: (id = ANY" in plan, plan
    assert "job_claim" not in plan and "Nested Loop" not in plan, plan


async def ack_plan(
    db_url: str, function: str, claimed: Sequence[tuple[int, int]]
) -> tuple[int, str]:
    """(jobs deleted, the plan of the delete) of one ack through ``function``, rolled back."""
    notices: list[str] = []
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        await explain_into(conn, notices)
        cur = await conn.execute(
            f"SELECT count(*) FROM shoal.{function}(%s::bigint[], %s::int[])",
            ([c[0] for c in claimed], [c[1] for c in claimed]),
        )
        row = await cur.fetchone()
        await conn.rollback()
    return (row or (0,))[0], next(n for n in notices if "Delete on job" in n)


async def test_an_ack_deletes_by_primary_key_while_statistics_say_no_job_is_active(
    boss: Shoal, db_url: str
) -> None:
    # Statistics taken while every job waited: the planner expects one active
    # row. A fence of state = 'active' then let it scan
    # job_lease, every active job of every queue, once per id acked.
    await boss.insert([{"queue": "q"}] * 200 + [{"queue": "other"}] * 300)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("ALTER TABLE shoal.job SET (autovacuum_enabled = false)")
        await conn.execute("ANALYZE shoal.job")
    await boss.store.claim("other", 300, now=None)  # active, and none of the ack's
    claimed = [(c.id, c.attempt) for c in await boss.store.claim("q", 200, now=None)]
    # Twice: the plan kept after the first call is the one every later call runs.
    for _ in range(2):
        deleted, plan = await ack_plan(db_url, "delete_jobs_v2", claimed)
        assert deleted == 200
        assert "Hash Join" in plan and "Index Cond: (id = ANY" in plan, plan
        assert "job_lease" not in plan and "Nested Loop" not in plan, plan
    # A stale attempt is not the caller's to delete.
    deleted, _ = await ack_plan(db_url, "delete_jobs_v2", [(i, a + 1) for i, a in claimed])
    assert deleted == 0


async def test_the_done_marker_check_probes_the_primary_key_with_statistics_from_no_markers(
    boss: Shoal, db_url: str
) -> None:
    # Statistics taken while ingest_done was empty (a new database). With
    # the TTL test beside the ids, PostgreSQL 15 scanned ingest_done_expires
    # for every live marker, all 20,000 of them, and filtered them by id;
    # with the TTL test apart, it read the whole table.
    store = IngestStore(boss.db)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("ANALYZE shoal.ingest_done")
    # Ids as publishers make them by default (uuid4).
    applied = [str(uuid.uuid4()) for _ in range(20_000)]
    await store.mark_done(applied, timedelta(hours=48), now=None)
    await store.mark_done(["expired"], -timedelta(hours=1), now=None)  # its TTL ran out
    # Fetches of a consumer (120) and of a batch sink (500): two applied, one
    # expired, the rest new.
    for size in (120, 500):
        wanted = [applied[7], applied[-1], "expired", *(str(uuid.uuid4()) for _ in range(size - 3))]
        notices: list[str] = []
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            await explain_into(conn, notices)
            # Twice: the plan kept after the first call is the one every later call runs.
            for _ in range(2):
                cur = await conn.execute(
                    store.sql["done_seen"], {"ids": "{" + ",".join(wanted) + "}", "now": None}
                )
                found = {row[0] for row in await cur.fetchall()}
                assert found == {applied[7], applied[-1]}  # an expired marker no longer counts
        plans = [n for n in notices if "on ingest_done" in n or "using ingest_done" in n]
        assert plans, notices
        for plan in plans:
            assert "ingest_done_pkey" in plan, plan
            assert "ingest_done_expires" not in plan and "Seq Scan" not in plan, plan
    assert await store.seen(wanted, now=None) == {applied[7], applied[-1]}


async def test_the_workers_claim_and_completion_keep_their_plans_for_the_session(
    boss: Shoal, db_url: str
) -> None:
    # claim_jobs_v5 and complete_jobs_v3 plan their statements once a session
    # (generic plans: the parameters show as $n in the plan), where v4 and v2
    # planned them on every call. A generic plan must still walk job_claim in
    # every branch, from the head and after a position, with statistics from
    # an empty table and from a full one: with an equality on the position's
    # priority the planner could take the primary key's order by id.
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("ALTER TABLE shoal.job SET (autovacuum_enabled = false)")
        await conn.execute("ANALYZE shoal.job")  # statistics say: empty
    await boss.insert([{"queue": "q"}] * 3_000 + [{"queue": "other"}] * 3_000)
    for stats in ("stale", "fresh"):
        if stats == "fresh":
            async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
                await conn.execute("ANALYZE shoal.job")
        notices: list[str] = []
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            await explain_into(conn, notices)
            claimed: list[tuple[int, int]] = []
            for after in (None, 500, 1_000, None, 1_500, 2_000):
                cur = await conn.execute(
                    "SELECT id, attempt FROM shoal.claim_jobs_v5('q', 20, NULL, %s, %s, NULL)",
                    (None if after is None else 0, after),
                )
                claimed += await cur.fetchall()
            # Twice: the second finds every job completed already (its fence).
            for expected in (len(claimed), 0):
                cur = await conn.execute(
                    "SELECT count(*) FROM shoal.complete_jobs_v3(%s, %s, '{}', NULL)",
                    ([c[0] for c in claimed], [c[1] for c in claimed]),
                )
                assert await cur.fetchone() == (expected,)
            await conn.rollback()
        # Two claims from the head (one select each), four after a position
        # (the higher priorities, none here, then the position's own).
        picks = [n for n in notices if "LockRows" in n]
        assert len(picks) == 2 + 4 * 2, (stats, picks)
        for plan in picks:
            assert "Index Scan using job_claim" in plan, (stats, plan)
            assert "Index Cond: ((queue = $1)" in plan or "Index Cond: (queue = $1)" in plan, plan
            assert "job_pkey" not in plan and "Sort" not in plan, (stats, plan)
        updates = [n for n in notices if "Update on job" in n]
        for plan in updates:
            assert "Index Scan using job_pkey" in plan and "= ANY ($" in plan, (stats, plan)
            assert "Nested Loop" not in plan and "job_lease" not in plan, (stats, plan)


@pytest.mark.parametrize("stale", ["analyzed_finished", "vacuumed_mid_create"])
async def test_an_item_claim_and_its_result_find_items_by_primary_key_whatever_the_statistics(
    fake_boss: Shoal, db_url: str, stale: str
) -> None:
    # Statistics taken while every item had finished: the planner expects no
    # pending and no running item. The guard's fence (status = 'pending') let
    # it walk item_task_status's whole pending range with the claimed ids as
    # a filter, and the result write's (status = 'running') the running one.
    # Or a vacuum while a big create was in flight (autovacuum does, on a
    # table that many inserts wait in): it counts no uncommitted row, and the
    # table's pages then hold "no row" for the planner. The claim's lock of
    # the jobs' items then walked the whole item table for each claim, outer
    # to the jobs. With a task of 1,000,000 items waiting, each claim outran
    # the statement timeout and the task stalled (bench/million_bench.py
    # --sides queue,batch).
    from .batch_helpers import make_batches

    batches = make_batches(fake_boss)
    refs = [f"r{i}" for i in range(3_000)]
    if stale == "analyzed_finished":
        await batches.create("test.kind", [f"old{i}" for i in range(300)])
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            await conn.execute(
                "UPDATE shoal.item SET status = 'completed', finished_at = now(),"
                " updated_at = now()"
            )
            await conn.execute("ALTER TABLE shoal.item SET (autovacuum_enabled = false)")
            await conn.execute("ANALYZE shoal.item")
        await batches.create("test.kind", refs)
    else:
        await batches.store_kinds()  # for the SQL API's create
        async with (
            await psycopg.AsyncConnection.connect(db_url) as creating,
            await psycopg.AsyncConnection.connect(db_url, autocommit=True) as vacuuming,
        ):
            await vacuuming.execute("ALTER TABLE shoal.item SET (autovacuum_enabled = false)")
            await creating.execute(
                "SELECT shoal.create_task('test.kind', %s::jsonb)", (json.dumps(refs),)
            )
            await vacuuming.execute("VACUUM shoal.item")
            await creating.commit()
    store = batches.store
    notices: list[str] = []
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await explain_into(conn, notices)
        cur = await conn.execute(
            store.sql["claim_items"],
            {
                "queue": "batch.test.kind",
                "limit": 100,
                "now": None,
                "after_priority": None,
                "after_turn": None,
                "after_id": None,
                "holder": None,
            },
        )
        claimed = [(row[16], row[17]) for row in await cur.fetchall() if row[16] is not None]
        guard = next(n for n in notices if "Update on item" in n)
        held = next(n for n in notices if "CTE held" in n)
        notices.clear()
        cur = await conn.execute(
            store.sql["complete_items"],
            {
                "ids": [c[0] for c in claimed],
                "attempts": [c[1] for c in claimed],
                "results": [None] * len(claimed),
                "job_ids": [],
                "job_attempts": [],
                "now": None,
            },
        )
        done = [row for row in await cur.fetchall() if row[0] == "item"]
    assert len(claimed) == len(done) > 0
    result = next(n for n in notices if "Update on item" in n)
    if stale == "analyzed_finished":
        for plan in (guard, result):
            assert "Index Scan using item_pkey" in plan, plan
            assert "item_task_status" not in plan, plan
    # Each job's item is found by its own probe of the primary key.
    assert re.search(r"Index Cond: \(id = n(_\d+)?\.item_id\)", held), held


async def test_a_big_create_leaves_the_item_statistics_counting_its_items(
    fake_boss: Shoal, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The claims' plans above hold whatever the statistics say where a form
    # of the statement could make them; the probes of items by id cannot
    # tell item_pkey from item_task_status when the table looks empty. So a
    # big create analyzes the table once committed: after an autovacuum that
    # ran while it was in flight, the table's pages otherwise held no row
    # for the planner until autovacuum came round again.
    from shoal.batch import service

    from .batch_helpers import make_batches

    monkeypatch.setattr(service, "ANALYZE_AFTER_ITEMS", 1_000)
    batches = make_batches(fake_boss)
    reltuples = "SELECT reltuples FROM pg_class WHERE oid = 'shoal.item'::regclass"
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("ALTER TABLE shoal.item SET (autovacuum_enabled = false)")
        await batches.create("test.kind", [f"small{i}" for i in range(999)])
        cur = await conn.execute(reltuples)
        assert await cur.fetchone() == (-1,)  # never analyzed: a small create leaves it
        await batches.create("test.kind", [f"big{i}" for i in range(1_000)])
        cur = await conn.execute(reltuples)
        assert await cur.fetchone() == (1_999,)
