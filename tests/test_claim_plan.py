"""The claim's plan does not depend on planner statistics."""

from __future__ import annotations

import psycopg

from shoal import Shoal


async def claim_plan(db_url: str) -> str:
    notices: list[str] = []
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        await conn.execute("LOAD 'auto_explain'")
        await conn.execute("SET auto_explain.log_min_duration = 0")
        await conn.execute("SET auto_explain.log_nested_statements = on")
        await conn.execute("SET auto_explain.log_level = 'notice'")
        await conn.execute("SET client_min_messages = notice")
        await conn.execute("BEGIN")
        await conn.execute("SELECT * FROM shoal.claim_jobs_v1('q', 10, NULL)")
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
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        await conn.execute("LOAD 'auto_explain'")
        await conn.execute("SET auto_explain.log_min_duration = 0")
        await conn.execute("SET auto_explain.log_nested_statements = on")
        await conn.execute("SET auto_explain.log_level = 'notice'")
        await conn.execute("SET client_min_messages = notice")
        done = await boss.store.complete(
            [(c.id, c.attempt, None) for c in claimed], now=None, conn=conn
        )
    assert done == {c.id for c in claimed}
    plan = next(n for n in notices if "Update on job" in n)
    assert "Hash Join" in plan and "Index Cond: (id = ANY" in plan, plan
    assert "job_lease" not in plan and "Nested Loop" not in plan, plan
