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
