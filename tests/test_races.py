"""Races between real connections: one winner, every time."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from shoal import Shoal
from shoal.db import Database, migrate
from tests.conftest import hold_like_pg_dump


async def test_claimers_on_separate_connections_never_share_a_job(boss: Shoal) -> None:
    await boss.insert([{"queue": "q", "data": {"i": i}} for i in range(2_000)])
    claimed: list[list[int]] = [[] for _ in range(8)]

    async def claimer(n: int) -> None:
        while jobs := await boss.store.claim("q", 25, now=None):
            claimed[n].extend(job.id for job in jobs)

    await asyncio.gather(*(claimer(n) for n in range(8)))
    everything = [job_id for ids in claimed for job_id in ids]
    assert len(everything) == len(set(everything)) == 2_000
    assert sum(1 for ids in claimed if ids) > 1, "the claimers did not actually race"


async def test_two_migrations_at_once_both_succeed(empty_db_url: str) -> None:
    async def run() -> list[int]:
        async with Database(empty_db_url) as db:
            return await migrate(db)

    from shoal.db.migrate import load_migrations

    every = [m.version for m in load_migrations()]
    first, second = await asyncio.gather(run(), run())
    assert sorted([first, second], key=len) == [[], every]
    async with Database(empty_db_url) as db:
        assert await migrate(db) == []


async def test_a_schema_built_from_other_migration_text_is_refused_by_name(
    empty_db_url: str,
) -> None:
    from shoal.errors import MigrationChanged

    async with Database(empty_db_url) as db:
        await migrate(db)
        await db.run(
            lambda conn: conn.execute("UPDATE shoal.migration SET checksum = 'x' WHERE version = 2")
        )
        with pytest.raises(MigrationChanged) as raised:
            await migrate(db)
        message = str(raised.value)
        assert "migration 0002_batch (shoal.batch.migrations)" in message
        assert "checksum x, this code's file " in message
        assert "never edited" in message
        assert "DROP SCHEMA" not in message


async def test_a_start_on_a_migrated_schema_does_not_wait_for_a_dump_in_progress(
    empty_db_url: str,
) -> None:
    # pg_dump takes every table it dumps in ACCESS SHARE mode, in one
    # transaction held for the whole dump. A process starting meanwhile (a
    # worker restarted, a CLI command) used to queue for ACCESS EXCLUSIVE on
    # the migration record table, and every later start behind it on the
    # advisory lock, until the dump ended.
    async with Database(empty_db_url) as db:
        await migrate(db)
    dump = await psycopg.AsyncConnection.connect(empty_db_url)
    try:
        await hold_like_pg_dump(dump)
        starts = [Shoal.connect(empty_db_url) for _ in range(3)]
        bosses = await asyncio.wait_for(asyncio.gather(*starts), timeout=60)
        try:
            assert await bosses[0].send("q", {"x": 1}) is not None
        finally:
            for boss in bosses:
                await boss.close()
    finally:
        await dump.close()


async def test_schema_name_is_configurable(empty_db_url: str) -> None:
    boss = await Shoal.connect(empty_db_url, schema="jobs_v2")
    try:
        job_id = await boss.send("q", {"x": 1})
        assert job_id is not None
        assert (await boss.get_job(job_id)).data == {"x": 1}
        async with Database(empty_db_url) as db:

            async def tables(conn):  # type: ignore[no-untyped-def]
                cur = await conn.execute(
                    "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'jobs_v2'"
                )
                return (await cur.fetchone())[0]

            assert await db.run(tables) >= 4
    finally:
        await boss.close()


async def test_concurrent_completion_and_rescue_have_one_winner(boss: Shoal) -> None:
    from datetime import timedelta

    from shoal import FakeClock

    ids = await boss.insert([{"queue": "q", "expire_in": 1}] * 200)
    jobs = await boss.fetch("q", batch_size=200)
    clock = FakeClock(await _db_now(boss) + timedelta(seconds=5))
    rescuer = Shoal(boss.db, clock=clock, listen=False).maintenance()
    won, (retried, failed) = await asyncio.gather(
        boss.store.complete([(j.id, j.attempt, None) for j in jobs], now=None),
        rescuer.expire_leases(),
    )
    assert len(won) + retried + failed == len(ids)


async def _db_now(boss: Shoal):  # type: ignore[no-untyped-def]
    async def now(conn):  # type: ignore[no-untyped-def]
        cur = await conn.execute("SELECT now()")
        return (await cur.fetchone())[0]

    return await boss.db.run(now)
