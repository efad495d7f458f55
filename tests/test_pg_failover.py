"""Workers and the API ride out a PostgreSQL failover to a synchronous standby by themselves.

A primary and a synchronous streaming standby (tests/pg_pair.py, Debian's
PostgreSQL binaries; run through ``runuser -u postgres`` when the tests run as
root, since PostgreSQL refuses root). Two worker processes and ``shoal api``
get one multi-host connection string, ``host=127.0.0.1,127.0.0.1
port=P1,P2 target_session_attrs=read-write``, and nothing else. Mid-way
through a batch task and a queue drain the primary is stopped with ``-m
immediate`` (a crash: no shutdown checkpoint, connections cut) and the
standby promoted. Nobody restarts or reconfigures a worker: their pools
reconnect, libpq skipping the dead host for the writable one.

What a user relies on: every item and every job ends exactly once (completed,
none lost, none left running), the task closes once and its completion hook
runs once, and the API answers from the new primary. The time from the
promotion to the first work completed on the new primary is printed, not
asserted.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from shoal import Shoal
from shoal.db import Database
from tests.conftest import PROGRAM_SKIP, REQUIRE_PROGRAMS, free_port, wait_for
from tests.pg_pair import SERVER_USER, PgPair, debian_bin_dir

ROOT = Path(__file__).resolve().parent.parent
ITEMS = 3000
JOBS = 3000
WORKERS = 2
START_TIMEOUT_S = 30

SETUP_SQL = """
CREATE TABLE public.failover_task_done (
    task_id text NOT NULL,
    pid int NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


def unavailable(reason: str) -> None:
    if os.environ.get(REQUIRE_PROGRAMS):
        pytest.fail(f"{reason} ({REQUIRE_PROGRAMS} is set)")
    pytest.skip(PROGRAM_SKIP + reason)


@pytest.fixture
def pair() -> Iterator[PgPair]:
    bin_dir = debian_bin_dir()
    if bin_dir is None:
        unavailable(
            "/usr/lib/postgresql/<n>/bin/pg_basebackup is missing: install it with "
            "`apt-get install -y postgresql`"
        )
    assert bin_dir is not None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            unavailable(f"running as root needs the {SERVER_USER!r} OS user (Debian's postgresql)")
    pair = PgPair(bin_dir)
    try:
        pair.start()
        yield pair
    finally:
        pair.close()


class Processes:
    """The workers and the API, each with its log; killed at teardown if still running."""

    def __init__(self, url: str, log_dir: Path) -> None:
        self.url = url
        self.log_dir = log_dir
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.names: dict[int, str] = {}

    def start(self, *command: str) -> subprocess.Popen[bytes]:
        log_path = self.log_dir / f"{command[0]}-{len(self.procs)}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "shoal.cli", "--database-url", self.url, *command],
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs.append((proc, log_path))
        self.names[proc.pid] = command[0]
        return proc

    def check_running(self) -> None:
        for proc, path in self.procs:
            if proc.poll() is not None:
                tail = path.read_text(errors="replace")[-3000:]
                raise AssertionError(
                    f"{self.names[proc.pid]} {proc.pid} exited {proc.returncode}:\n{tail}"
                )

    def stop(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, path in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            # Shown by pytest for a failed test only.
            print(f"--- {self.names[proc.pid]} {proc.pid} (exit {proc.returncode}) ---")
            print(path.read_text(errors="replace")[-3000:])


async def scalar(url: str, query: str) -> Any:
    """One value, on a connection of its own (a pooled one would be the old primary's)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(query)
        row = await cur.fetchone()
        return None if row is None else row[0]


async def done_count(url: str) -> int:
    """Items and jobs completed so far, or -1 while no writable server answers."""
    try:
        return int(
            await scalar(
                url,
                "SELECT (SELECT count(*) FROM shoal.item WHERE status = 'completed') "
                "+ (SELECT count(*) FROM shoal.job WHERE queue = 'failover.job' "
                "AND state = 'completed')",
            )
        )
    except psycopg.OperationalError:
        return -1


@pytest.mark.slow
async def test_workers_and_the_api_go_on_after_the_standby_is_promoted(
    pair: PgPair, tmp_path: Path
) -> None:
    url = pair.multi_host_url("postgres")
    boss = await Shoal.connect(url)  # migrates the primary; the standby follows
    await boss.db.run(lambda conn: conn.execute(SETUP_SQL))
    await boss.close()

    processes = Processes(url, tmp_path)
    api_port = free_port()
    base = f"http://127.0.0.1:{api_port}"
    try:
        processes.start("api", "--app", "tests.failoverapp:app", "--port", str(api_port))
        for _ in range(WORKERS):
            processes.start("worker", "--app", "tests.failoverapp:app", "--grace", "5")
        async with httpx.AsyncClient(base_url=base, timeout=10) as api:

            async def api_up() -> bool:
                processes.check_running()
                try:
                    return (await api.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            await wait_for(api_up, START_TIMEOUT_S, interval_s=0.1)
            created = await api.post(
                "/v1/tasks",
                json={"kind": "failover.item", "items": [f"doc-{i}" for i in range(ITEMS)]},
            )
            assert created.status_code == 202, created.text
            task_id = created.json()["task_id"]
            async with await Shoal.connect(url, run_migrations=False) as client:
                await client.insert(
                    {
                        "queue": "failover.job",
                        "data": {"n": i},
                        "retry_limit": 50,
                        "retry_delay": timedelta(milliseconds=200),
                    }
                    for i in range(JOBS)
                )

            # Mid-run of both: some of each done, most of each still to do.
            async def both_under_way() -> bool:
                processes.check_running()
                items = await scalar(
                    url, "SELECT count(*) FROM shoal.item WHERE status = 'completed'"
                )
                jobs = await scalar(
                    url,
                    "SELECT count(*) FROM shoal.job WHERE queue = 'failover.job' "
                    "AND state = 'completed'",
                )
                return bool(items >= ITEMS // 5 and jobs >= JOBS // 5)

            await wait_for(both_under_way, 60, interval_s=0.05)
            at_stop = await done_count(url)
            assert at_stop < ITEMS + JOBS - 1000, "the run was nearly over before the failover"

            await asyncio.to_thread(pair.primary.stop, "immediate")
            await asyncio.to_thread(pair.standby.promote)
            loop = asyncio.get_running_loop()
            promoted_at = loop.time()
            promoted_sql = await scalar(url, "SELECT clock_timestamp()::text")
            on_promotion = await done_count(url)
            await wait_for(lambda: _more_done_than(url, on_promotion), 60, interval_s=0.02)
            resumed_s = loop.time() - promoted_at

            async def task_closed() -> bool:
                processes.check_running()
                try:
                    answer = await api.get(f"/v1/tasks/{task_id}")
                except httpx.TransportError:
                    return False
                return answer.status_code == 200 and answer.json()["status"] != "processing"

            await wait_for(task_closed, 90, interval_s=0.1)
            task = (await api.get(f"/v1/tasks/{task_id}")).json()

            async def drained() -> bool:
                processes.check_running()
                return bool(
                    await scalar(
                        url,
                        "SELECT count(*) FROM shoal.job WHERE queue = 'failover.job' "
                        "AND state = 'completed'",
                    )
                    == JOBS
                )

            try:
                await wait_for(drained, 90, interval_s=0.1)
            except AssertionError:
                raise AssertionError(f"jobs left after 90 s: {await _jobs_left(url)}") from None
            await wait_for(lambda: scalar(url, "SELECT count(*) FROM failover_task_done"), 30)
    finally:
        processes.stop()

    # Every item completed once; the task closed once and its hook ran once.
    assert task["status"] == "completed", task
    assert task["progress"]["completed"] == ITEMS, task
    assert await scalar(url, "SELECT count(*) FROM shoal.item") == ITEMS
    assert await scalar(url, "SELECT count(*) FROM failover_task_done") == 1
    # Every job completed once: none lost, none still waiting or running.
    states = await scalar(
        url,
        "SELECT json_object_agg(state, n) FROM (SELECT state, count(*) n FROM shoal.job "
        "WHERE queue = 'failover.job' GROUP BY state) s",
    )
    assert states == {"completed": JOBS}
    assert await scalar(url, "SELECT count(*) FROM shoal.job WHERE state = 'active'") == 0
    # The work resumed on the promoted standby, in every worker.
    assert await scalar(url, "SELECT inet_server_port()") == pair.standby.port
    pids_after = await scalar(
        url,
        "SELECT count(DISTINCT pid) FROM ("
        " SELECT output->>'pid' AS pid FROM shoal.job"
        f" WHERE queue = 'failover.job' AND finished_at > '{promoted_sql}'"
        f" UNION ALL SELECT result->>'pid' FROM shoal.item WHERE finished_at > '{promoted_sql}'"
        ") s",
    )
    assert pids_after == WORKERS
    retried = await scalar(
        url,
        "SELECT (SELECT count(*) FROM shoal.item WHERE attempt > 1) + "
        "(SELECT count(*) FROM shoal.job WHERE queue = 'failover.job' AND attempt > 1)",
    )
    print(
        f"\nfailover at {at_stop} of {ITEMS + JOBS} items and jobs done: work resumed "
        f"{resumed_s:.2f}s after the promotion; {retried} items and jobs took a second attempt"
    )


async def _jobs_left(url: str) -> Any:
    """The queue's jobs not completed, by state and attempt: what a failed drain left."""
    return await scalar(
        url,
        "SELECT json_agg(s) FROM (SELECT state, attempt, count(*) AS jobs, min(id) AS first,"
        " max(id) AS last, min(lease_expires_at)::text AS lease_until FROM shoal.job"
        " WHERE queue = 'failover.job' AND state <> 'completed' GROUP BY state, attempt) s",
    )


async def _more_done_than(url: str, count: int) -> bool:
    return await done_count(url) > max(count, 0)


async def test_a_process_started_while_only_the_standby_answers_waits_for_its_promotion(
    pair: PgPair,
) -> None:
    await asyncio.to_thread(pair.primary.stop, "immediate")
    db = Database(pair.multi_host_url("postgres"), deadline=timedelta(seconds=20))
    opening = asyncio.create_task(db.open())
    try:
        # libpq finds only a read-only server: not a refusal to give up on
        # (as a wrong password is), but a failover under way. Still trying:
        done, _ = await asyncio.wait({opening}, timeout=1)
        assert not done, f"open() ended before the promotion: {opening.exception()!r}"
        await asyncio.to_thread(pair.standby.promote)
        await asyncio.wait_for(opening, 20)
        assert await db.run(lambda conn: _port(conn)) == pair.standby.port
    finally:
        opening.cancel()
        await asyncio.gather(opening, return_exceptions=True)
        await db.close()


async def _port(conn: Any) -> int:
    cur = await conn.execute("SELECT inet_server_port()")
    row = await cur.fetchone()
    return int(row[0])
