"""A primary whose commits all stall says so: /readyz, the console, one worker ERROR.

The stall is real: a cluster of the test's own (never the shared server)
names a synchronous standby that does not exist (``ALTER SYSTEM SET
synchronous_standby_names = 'nobody'``), so every commit that wrote WAL waits
for it, while reads answer as usual. Clearing the setting releases the
waiting commits, as a standby coming back would. The cluster keeps
``synchronous_commit`` on (``throwaway_pg`` turns it off, and with it off a
commit waits for no standby).

Turning the setting on or off takes effect once the server has reloaded its
configuration, a moment after ``pg_reload_conf()``: the tests await the
effect (a probe that stalls, or commits) with a deadline.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import psycopg
import pytest

from shoal import FakeClock, Shoal
from shoal.api import create_api
from shoal.app import App
from shoal.db import Database, EmbeddedPostgres, migrate
from tests.conftest import wait_for
from tests.test_processes import START_TIMEOUT_S, WorkerProcesses, wait_started

# Every stalled probe waits out its 2 s timeout; reloads take a moment on a
# loaded machine.
STALL_TIMEOUT_S = 60
STALL_MESSAGE = re.compile(
    r"answers reads but is not accepting writes \(commits do not complete within 2 s; "
    r"synchronous_standby_names = 'nobody': is a synchronous standby down\?\)"
)
WORKER_ERROR = "database writes have not completed for"
# Seconds of stall before a worker's ERROR, for the worker process test.
WORKER_STALL_AFTER_S = 3


@pytest.fixture
def stall_pg(pg_dir: Path) -> Iterator[EmbeddedPostgres]:
    """A cluster of the test's own with synchronous_commit on (the default)."""
    server = EmbeddedPostgres(pg_dir / "pg", fsync=True)
    server.start()
    try:
        yield server
    finally:
        server.stop("immediate")


@pytest.fixture
async def stall_url(stall_pg: EmbeddedPostgres) -> str:
    url = stall_pg.url()
    async with Database(url) as db:
        await migrate(db)
    return url


def set_standby_names(url: str, names: str | None) -> None:
    """Name synchronous standbys (None: none) and have the server reload its configuration."""
    with psycopg.connect(url, autocommit=True) as conn:
        if names is None:
            conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
        else:
            conn.execute(
                psycopg.sql.SQL("ALTER SYSTEM SET synchronous_standby_names = {}").format(
                    psycopg.sql.Literal(names)
                )
            )
        conn.execute("SELECT pg_reload_conf()")


async def sync_rep_waiters(url: str) -> int:
    """Server processes waiting for a synchronous standby to acknowledge a commit."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
async def stall_api(stall_url: str) -> AsyncIterator[tuple[httpx.AsyncClient, FakeClock]]:
    clock = FakeClock()
    boss = Shoal(await Database(stall_url).open(), clock=clock, listen=False)
    api = create_api(boss, App().batches(boss), token=None)
    transport = httpx.ASGITransport(app=api)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            yield client, clock
    finally:
        await boss.close()


async def readyz_after_cache(client: httpx.AsyncClient, clock: FakeClock) -> httpx.Response:
    """/readyz with a fresh probe: the clock moved past the cached answer's age."""
    clock.advance(timedelta(seconds=10))
    return await client.get("/readyz")


async def test_ready_answers_503_while_commits_stall_and_reads_still_answer(
    stall_api: tuple[httpx.AsyncClient, FakeClock], stall_url: str
) -> None:
    client, clock = stall_api
    assert (await client.get("/readyz")).json() == {"status": "ready"}

    set_standby_names(stall_url, "nobody")
    answers: list[httpx.Response] = []

    async def not_ready() -> bool:
        answers.append(await readyz_after_cache(client, clock))
        return answers[-1].status_code == 503

    await wait_for(not_ready, timeout_s=STALL_TIMEOUT_S, interval_s=0)
    body = answers[-1].json()
    assert body["error"] == "not_ready"
    assert body["field"] == "database"
    assert STALL_MESSAGE.search(body["message"]), body["message"]
    # Reads answer as before; the console says what /readyz says, in the same words.
    assert (await client.get("/v1/queues")).status_code == 200
    overview = await client.get("/v1/overview")
    assert overview.status_code == 200
    assert overview.json()["database"] == {"state": "stalled", "message": body["message"]}
    # The probe cancelled its own commit: no server process is left waiting
    # for the standby, holding a connection slot.
    assert await sync_rep_waiters(stall_url) == 0

    set_standby_names(stall_url, None)

    async def ready() -> bool:
        answers.append(await readyz_after_cache(client, clock))
        return answers[-1].status_code == 200

    await wait_for(ready, timeout_s=STALL_TIMEOUT_S, interval_s=0)
    assert answers[-1].json() == {"status": "ready"}
    assert (await client.get("/v1/overview")).json()["database"]["state"] == "writable"


async def test_a_burst_of_readiness_checks_makes_one_probe_write(stall_url: str) -> None:
    from shoal.db.writes import CHECK_MAX_AGE, CachedWriteCheck, WriteCheck, WriteProbe

    class CountedProbe(WriteProbe):
        made = 0

        async def check(self) -> WriteCheck:
            CountedProbe.made += 1
            return await super().check()

    clock = FakeClock()
    async with Database(stall_url) as db:
        writes = CachedWriteCheck(db, clock=clock)
        writes.probe = CountedProbe(db, keep_connection=False)
        burst = await asyncio.gather(*(writes.get() for _ in range(20)))
        assert all(check.is_writable for check in burst)
        assert CountedProbe.made == 1
        clock.advance(CHECK_MAX_AGE / 2)
        assert (await writes.get()).is_writable
        assert CountedProbe.made == 1  # still fresh
        clock.advance(CHECK_MAX_AGE)
        assert (await writes.get()).is_writable
        assert CountedProbe.made == 2
        await writes.close()


async def test_the_stall_watch_logs_one_error_per_stall_and_the_recovery(
    stall_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    from shoal.db.writes import WriteStallWatch, WriteState

    clock = FakeClock()
    caplog.set_level(logging.INFO, logger="shoal.db")
    async with Database(stall_url) as db:
        watch = WriteStallWatch(db, clock=clock, error_after=timedelta(seconds=30))
        try:

            def errors() -> list[str]:
                return [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]

            async def state_is(state: WriteState) -> bool:
                return (await watch.run_once()).state is state

            assert await state_is(WriteState.WRITABLE)
            for stall in (1, 2):
                set_standby_names(stall_url, "nobody")
                await wait_for(lambda: state_is(WriteState.STALLED), STALL_TIMEOUT_S, 0)
                assert len(errors()) == stall - 1  # not before 30 s of stall
                clock.advance(timedelta(seconds=31))
                for _ in range(2):  # stalled on: nothing more
                    assert (await watch.run_once()).state is WriteState.STALLED
                assert len(errors()) == stall
                assert errors()[-1].startswith(f"{WORKER_ERROR} 31 s: commits stall ")
                assert "synchronous_standby_names = 'nobody'" in errors()[-1]
                set_standby_names(stall_url, None)
                await wait_for(lambda: state_is(WriteState.WRITABLE), STALL_TIMEOUT_S, 0)
                assert "database writes complete again" in caplog.records[-1].getMessage()
            assert len(errors()) == 2
        finally:
            await watch.close()


async def test_the_stall_watch_probes_first_one_interval_after_it_starts(db_url: str) -> None:
    # A process that lives shorter than the interval (a drain, a command)
    # opens no probe connection and commits no probe.
    from shoal.db.writes import WATCH_INTERVAL, WriteCheck, WriteProbe, WriteStallWatch

    class CountedProbe(WriteProbe):
        made = 0

        async def check(self) -> WriteCheck:
            CountedProbe.made += 1
            return await super().check()

    clock = FakeClock()
    async with Database(db_url) as db:
        watch = WriteStallWatch(db, clock=clock)
        watch.probe = CountedProbe(db)
        running = asyncio.create_task(watch.run())
        try:
            await asyncio.wait_for(clock.wait_for_sleepers(), START_TIMEOUT_S)
            assert CountedProbe.made == 0
            clock.advance(WATCH_INTERVAL)
            await wait_for(lambda: CountedProbe.made == 1, START_TIMEOUT_S, 0.01)
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            await watch.close()


async def test_a_worker_process_logs_one_error_naming_the_cause_while_commits_stall(
    stall_url: str, tmp_path: Path
) -> None:
    procs = WorkerProcesses(
        stall_url, tmp_path, env={"SHOAL_WRITE_STALL_AFTER": str(WORKER_STALL_AFTER_S)}
    )
    observer = Shoal(await Database(stall_url).open(), listen=False)
    try:
        proc = procs.start()
        await wait_started(observer, 1)
        set_standby_names(stall_url, "nobody")

        def errors() -> list[str]:
            return [line for line in procs.log(proc).splitlines() if WORKER_ERROR in line]

        await wait_for(lambda: errors(), timeout_s=STALL_TIMEOUT_S, interval_s=0.2)
        (line,) = errors()
        assert "ERROR" in line
        assert "commits stall (synchronous_standby_names = 'nobody'" in line
        # The watch probes on through the stall (each probe ends by reading
        # the setting on its own connection): two more probes, no second ERROR.
        seen = await last_cause_read(stall_url)
        for _ in range(2):
            await wait_for(
                lambda s=seen: newer_cause_read(stall_url, s), START_TIMEOUT_S, interval_s=0.2
            )
            seen = await last_cause_read(stall_url)
        assert len(errors()) == 1

        set_standby_names(stall_url, None)
        await wait_for(
            lambda: "database writes complete again" in procs.log(proc),
            timeout_s=STALL_TIMEOUT_S,
            interval_s=0.2,
        )
        assert len(errors()) == 1
    finally:
        set_standby_names(stall_url, None)
        procs.cleanup()
        await observer.close()


CAUSE_READS = (
    "SELECT max(state_change) FROM pg_stat_activity "
    "WHERE query = 'SELECT current_setting(''synchronous_standby_names'')'"
)


async def last_cause_read(url: str) -> object:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        row = await (await conn.execute(CAUSE_READS)).fetchone()
    assert row is not None
    return row[0]


async def newer_cause_read(url: str, seen: object) -> bool:
    latest = await last_cause_read(url)
    return latest is not None and (seen is None or latest > seen)  # type: ignore[operator]


def test_a_probe_the_server_refuses_is_told_apart_from_one_it_never_answered() -> None:
    from shoal.db.writes import failed_message

    # A standby in recovery refuses the probe's write with an error of its own.
    refused = psycopg.errors.ReadOnlySqlTransaction("cannot execute in a read-only transaction")
    assert failed_message(refused) == "database: refuses writes (ReadOnlySqlTransaction)"
    lost = psycopg.OperationalError("connection to server at 10.0.0.5 failed")
    assert failed_message(lost) == "database: not answering (TransientError)"
    assert failed_message(TimeoutError()) == "database: not answering (TimeoutError)"
