"""Readers never fail on a time stored before the option ranges (shoal 0.1.0).

A database written by an older release may hold jobs whose start_after is
PostgreSQL's 'infinity', '-infinity' or a year past 9999 (the SQL API took
them). psycopg cannot load such a time into a datetime, so every reader of
the job (``get_job``, the console's job routes, ``shoal jobs``/``job``)
failed on it. They read it capped, 9999-12-31T00:00:00+00:00 (0001-01-02
for the past), in any session time zone, and the job can still be cancelled.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import httpx
import psycopg
import pytest
from psycopg import sql

from shoal import Shoal, SyncClient
from shoal.api import create_api
from shoal.batch.service import Batches
from shoal.cli import main
from shoal.queue.states import JobId, JobState

LATEST_READ = datetime(9999, 12, 31, tzinfo=UTC)
EARLIEST_READ = datetime(1, 1, 2, tzinfo=UTC)
# Stored as older releases could store them (through shoal.send in SQL).
STORED = {
    "infinity": LATEST_READ,
    "33715-01-01 00:00:00+00": LATEST_READ,
    "-infinity": EARLIEST_READ,
}


async def stored_jobs(boss: Shoal, db_url: str) -> tuple[dict[JobId, datetime], JobId]:
    """One job per stored time, its start_after written as an old release could,
    and an active job whose lease ends in 'infinity' (an old expire_in of
    thousands of years ends past 9999)."""
    read_as: dict[JobId, datetime] = {}
    with psycopg.connect(db_url, autocommit=True) as conn:
        # The session time zone furthest ahead of UTC (+14): a time capped at
        # the last instant Python holds in UTC would pass year 9999 here.
        dbname = conn.info.dbname
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET TimeZone = 'Pacific/Kiritimati'").format(
                sql.Identifier(dbname)
            )
        )
        for stored, expected in STORED.items():
            job_id = await boss.send("far_off", {"stored": stored})
            assert job_id is not None
            conn.execute(
                "UPDATE shoal.job SET start_after = %s::timestamptz WHERE id = %s",
                (stored, job_id),
            )
            read_as[job_id] = expected
        leased = await boss.send("far_off", {"stored": "lease"})
        assert leased is not None
        conn.execute(
            "UPDATE shoal.job SET state = 'active', attempt = 1, started_at = now(),"
            " lease_expires_at = 'infinity' WHERE id = %s",
            (leased,),
        )
    return read_as, leased


async def test_clients_read_a_job_whose_stored_start_after_python_cannot_hold(
    db_url: str,
) -> None:
    # A client opened after the time zone is set: its connections take it.
    async with await Shoal.connect(db_url, listen=False) as setup:
        read_as, leased = await stored_jobs(setup, db_url)
    async with await Shoal.connect(db_url, listen=False) as boss:
        for job_id, expected in read_as.items():
            job = await boss.get_job(job_id)
            assert job is not None and job.start_after == expected
            assert job.lease_expires_at is None  # no lease stays none
        leased_job = await boss.get_job(leased)
        assert leased_job is not None and leased_job.lease_expires_at == LATEST_READ
        with SyncClient.connect(db_url) as sync:
            for job_id, expected in read_as.items():
                sync_job = sync.get_job(job_id)
                assert sync_job is not None and sync_job.start_after == expected
            sync_leased = sync.get_job(leased)
            assert sync_leased is not None and sync_leased.lease_expires_at == LATEST_READ
        # The remedy for a job that would never run: it can be cancelled.
        infinite = next(iter(read_as))
        assert await boss.cancel(infinite)
        cancelled = await boss.get_job(infinite)
        assert cancelled is not None and cancelled.state is JobState.CANCELLED


async def test_console_job_routes_answer_for_a_job_whose_stored_start_after_is_infinite(
    db_url: str,
) -> None:
    async with await Shoal.connect(db_url, listen=False) as setup:
        read_as, leased = await stored_jobs(setup, db_url)
    async with await Shoal.connect(db_url, listen=False) as boss:
        api = create_api(boss, Batches(boss, {}), token=None)
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://127.0.0.1",
            headers={"X-Shoal-Request": "1"},  # as the console's page sends
        ) as client:
            listed = await client.get("/v1/jobs")
            assert listed.status_code == 200, listed.text
            assert {j["id"] for j in listed.json()["jobs"]} == {*read_as, leased}
            infinite = next(iter(read_as))
            found = await client.get("/v1/jobs", params={"queue": "far_off", "q": str(infinite)})
            assert found.status_code == 200, found.text
            assert [j["id"] for j in found.json()["jobs"]] == [infinite]
            for job_id, expected in read_as.items():
                one = await client.get(f"/v1/jobs/{job_id}")
                assert one.status_code == 200, one.text
                assert datetime.fromisoformat(one.json()["start_after"]) == expected
                assert one.json()["lease_expires_at"] is None
            one = await client.get(f"/v1/jobs/{leased}")
            assert one.status_code == 200, one.text
            assert datetime.fromisoformat(one.json()["lease_expires_at"]) == LATEST_READ
            cancelled = await client.post(f"/v1/jobs/{infinite}/cancel")
            assert cancelled.status_code == 200, cancelled.text
            assert cancelled.json()["state"] == "cancelled"


def test_shoal_jobs_and_job_print_a_job_whose_stored_start_after_is_infinite(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async def setup() -> tuple[dict[JobId, datetime], JobId]:
        async with await Shoal.connect(db_url, listen=False) as boss:
            return await stored_jobs(boss, db_url)

    read_as, leased = asyncio.run(setup())
    capsys.readouterr()
    assert main(["--database-url", db_url, "jobs", "--queue", "far_off"]) == 0
    listed = capsys.readouterr().out
    assert all(str(job_id) in listed for job_id in [*read_as, leased])
    for job_id in [*read_as, leased]:
        assert main(["--database-url", db_url, "job", str(job_id)]) == 0
        assert str(job_id) in capsys.readouterr().out
