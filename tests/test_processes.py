"""Real worker processes on a real database: crashes, drains, shutdowns, lost connections.

Each worker is ``python -m shoal.cli worker --app tests.procapp:app``, a separate
OS process started, signalled and killed by the test. The test itself talks to
the database through a client of its own (application_name ``shoal-test``), so
it can tell its connections from the workers'.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

import pytest

from shoal import Shoal
from shoal.db import Database
from shoal.db.pool import AsyncConn
from tests.conftest import wait_for
from tests.procapp import SCHEDULE_NAME

REPO = Path(__file__).resolve().parent.parent
GRACE_S = 5
# A worker that took SIGTERM exits within its grace period plus a little.
EXIT_TIMEOUT_S = GRACE_S + 10
# Starting a worker (interpreter, imports, pool, migrate) on a loaded 2-core box.
START_TIMEOUT_S = 30


class WorkerProcesses:
    """Worker subprocesses of one test; any still running at teardown are SIGKILLed."""

    def __init__(
        self,
        url: str,
        log_dir: Path,
        *,
        app: str = "tests.procapp:app",
        env: dict[str, str] | None = None,
    ) -> None:
        self.url = url
        self.log_dir = log_dir
        self.app = app
        self.env = env or {}
        self.procs: list[tuple[subprocess.Popen[bytes], Path, IO[bytes]]] = []

    def start(self, *, schedule: bool = False, args: Sequence[str] = ()) -> subprocess.Popen[bytes]:
        env = dict(os.environ) | self.env
        env.pop("PROCAPP_SCHEDULE", None)
        if schedule:
            env["PROCAPP_SCHEDULE"] = "1"
        log_path = self.log_dir / f"worker-{len(self.procs)}.log"
        log_file = open(log_path, "wb")  # noqa: SIM115 - closed at teardown, after the process ends
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "shoal.cli",
                "--database-url",
                self.url,
                "worker",
                "--app",
                self.app,
                "--pool-size",
                "50",
                "--grace",
                str(GRACE_S),
                *args,
            ],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        self.procs.append((proc, log_path, log_file))
        return proc

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        for p, path, _ in self.procs:
            if p is proc:
                return path.read_text(errors="replace")
        raise KeyError(proc.pid)

    async def wait_exit(self, proc: subprocess.Popen[bytes], timeout_s: float) -> int:
        try:
            await wait_for(lambda: proc.poll() is not None, timeout_s=timeout_s)
        except AssertionError:
            raise AssertionError(
                f"worker {proc.pid} still running after {timeout_s}s:\n{self.log(proc)[-3000:]}"
            ) from None
        assert proc.returncode is not None
        return proc.returncode

    def cleanup(self) -> None:
        for proc, path, log_file in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
            log_file.close()
            # Shown by pytest for a failed test only.
            print(f"--- worker {proc.pid} (exit {proc.returncode}) ---")
            print(path.read_text(errors="replace")[-4000:])


@pytest.fixture
def workers(db_url: str, tmp_path: Path) -> Iterator[WorkerProcesses]:
    procs = WorkerProcesses(db_url, tmp_path)
    try:
        yield procs
    finally:
        procs.cleanup()


@pytest.fixture
def client(observer: Shoal) -> Shoal:
    """The test's own client: not named 'shoal', so it never counts as a worker connection."""
    return observer


async def rows(boss: Shoal, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    async def run(conn: AsyncConn) -> list[tuple[Any, ...]]:
        cur = await conn.execute(query, params)
        return await cur.fetchall() if cur.description else []

    return await boss.db.run(run)


async def value(boss: Shoal, query: str, params: Sequence[Any] = ()) -> Any:
    result = await rows(boss, query, params)
    return result[0][0]


async def wait_started(boss: Shoal, count: int) -> list[int]:
    """Pids of the workers that have run procapp's start hook, once there are ``count``."""

    async def enough() -> bool:
        exists = await value(boss, "SELECT to_regclass('public.proc_started') IS NOT NULL")
        if not exists:
            return False
        return int(await value(boss, "SELECT count(*) FROM public.proc_started")) >= count

    await wait_for(enough, timeout_s=START_TIMEOUT_S, interval_s=0.1)
    return [r[0] for r in await rows(boss, "SELECT pid FROM public.proc_started ORDER BY pid")]


async def state_counts(boss: Shoal, queue: str) -> dict[str, int]:
    result = await rows(
        boss,
        "SELECT state::text, count(*) FROM shoal.job WHERE queue = %s GROUP BY state",
        (queue,),
    )
    return {state: count for state, count in result}


async def wait_drained(boss: Shoal, queue: str, total: int, *, timeout_s: float) -> None:
    """Wait until ``total`` jobs of ``queue`` are completed; on timeout, say where they are."""

    async def drained() -> bool:
        return (await state_counts(boss, queue)).get("completed", 0) == total

    try:
        await wait_for(drained, timeout_s=timeout_s, interval_s=0.25)
    except AssertionError:
        activity = await rows(
            boss,
            "SELECT pid, state, wait_event_type, wait_event, left(query, 80) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        raise AssertionError(
            f"{queue} not drained in {timeout_s}s: {await state_counts(boss, queue)}; "
            f"connections: {activity}"
        ) from None


@pytest.mark.slow
async def test_job_of_a_killed_worker_runs_again_on_another_and_completes_once(
    client: Shoal, workers: WorkerProcesses
) -> None:
    # Attempt 1 would sleep long past its lease; the second attempt is quick.
    job_id = await client.send(
        "proc_slow",
        {"sleep_s": 0.2, "first_attempt_sleep_s": 60},
        expire_in=timedelta(seconds=3),
    )
    assert job_id is not None
    first = workers.start()

    async def started() -> bool:
        (exists,) = (await rows(client, "SELECT to_regclass('public.exec_log') IS NOT NULL"))[0]
        return bool(exists) and bool(
            await rows(client, "SELECT 1 FROM public.exec_log WHERE job_id = %s", (job_id,))
        )

    await wait_for(started, timeout_s=START_TIMEOUT_S)
    os.kill(first.pid, signal.SIGKILL)
    assert await workers.wait_exit(first, timeout_s=10) == -signal.SIGKILL
    # Killed mid-job: still active under the dead worker's lease.
    job = await client.get_job(job_id)
    assert (job.state, job.attempt) == ("active", 1)

    second = workers.start()

    async def completed() -> bool:
        await client.maintain()  # rescue the lease as soon as it runs out
        return (await client.get_job(job_id)).state == "completed"

    await wait_for(completed, timeout_s=START_TIMEOUT_S, interval_s=0.2)

    job = await client.get_job(job_id)
    assert job.attempt == 2
    assert [(e.attempt, e.type) for e in job.errors] == [(1, "LeaseExpired")]
    assert job.output == {"pid": second.pid}
    log = await rows(
        client,
        "SELECT attempt, pid, finished_at IS NOT NULL FROM public.exec_log "
        "WHERE job_id = %s ORDER BY attempt",
        (job_id,),
    )
    assert log == [(1, first.pid, False), (2, second.pid, True)]


@pytest.mark.slow
async def test_four_worker_processes_drain_20000_jobs_each_exactly_once(
    client: Shoal, workers: WorkerProcesses
) -> None:
    procs = [workers.start() for _ in range(4)]
    pids = await wait_started(client, 4)
    assert sorted(pids) == sorted(p.pid for p in procs)

    ids = await client.insert([{"queue": "proc_noop", "data": {"i": i}} for i in range(20_000)])
    assert None not in ids

    await wait_drained(client, "proc_noop", 20_000, timeout_s=50)

    (total, completed, first_attempt, clean, ran_by) = (
        await rows(
            client,
            """
            SELECT count(*),
                   count(*) FILTER (WHERE state = 'completed'),
                   count(*) FILTER (WHERE attempt = 1),
                   count(*) FILTER (WHERE errors = '[]'),
                   array_agg(DISTINCT (output->>'pid')::int)
            FROM shoal.job WHERE queue = 'proc_noop'
            """,
        )
    )[0]
    assert (total, completed, first_attempt, clean) == (20_000, 20_000, 20_000, 20_000)
    # Every job ran in one of the workers, and all four competed for them.
    assert sorted(ran_by) == sorted(pids)

    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert await workers.wait_exit(proc, EXIT_TIMEOUT_S) == 0


@pytest.mark.slow
async def test_sigterm_finishes_the_running_job_and_hands_back_claimed_ones(
    client: Shoal, workers: WorkerProcesses
) -> None:
    ids = await client.insert([{"queue": "proc_slow", "data": {"sleep_s": 1}} for _ in range(4)])
    first, running, prefetched, untouched = [job_id for job_id in ids if job_id is not None]
    proc = workers.start()

    async def second_running() -> bool:
        if not await value(client, "SELECT to_regclass('public.exec_log') IS NOT NULL"):
            return False
        started = await rows(client, "SELECT job_id FROM public.exec_log ORDER BY started_at")
        return [r[0] for r in started] == [first, running]

    await wait_for(second_running, timeout_s=START_TIMEOUT_S)

    # Once a job has finished, the worker prefetches: it holds one job more
    # than it runs. The third job waits, claimed, in its buffer.
    async def third_claimed() -> bool:
        return (await client.get_job(prefetched)).state == "active"

    await wait_for(third_claimed, timeout_s=5)
    sigterm_at = await value(client, "SELECT clock_timestamp()")
    proc.send_signal(signal.SIGTERM)

    assert await workers.wait_exit(proc, EXIT_TIMEOUT_S) == 0

    assert (await client.get_job(first)).state == "completed"
    # The running job was let finish after the signal, and counted once.
    job = await client.get_job(running)
    assert (job.state, job.attempt, job.output) == ("completed", 1, {"pid": proc.pid})
    finished_at = await value(
        client, "SELECT finished_at FROM public.exec_log WHERE job_id = %s", (running,)
    )
    assert finished_at is not None and finished_at > sigterm_at
    # The claimed-but-not-started job went back without spending an attempt,
    # with a note naming the process that handed it back.
    job = await client.get_job(prefetched)
    assert (job.state, job.attempt, job.started_at) == ("created", 0, None)
    (note,) = job.errors
    assert note.type == "Interrupted" and f":{proc.pid} without spending" in note.message
    job = await client.get_job(untouched)
    assert (job.state, job.attempt, job.started_at, job.errors) == ("created", 0, None, ())
    started = [r[0] for r in await rows(client, "SELECT job_id FROM public.exec_log")]
    assert set(started) == {first, running}


@pytest.mark.slow
async def test_worker_reconnects_after_its_connections_are_terminated_mid_drain(
    client: Shoal, workers: WorkerProcesses
) -> None:
    total = 20_000
    proc = workers.start()
    await wait_started(client, 1)
    await client.insert([{"queue": "proc_noop", "data": {"i": i}} for i in range(total)])

    terminate = """
        SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
        FROM pg_stat_activity
        WHERE datname = current_database() AND application_name = 'shoal'
          AND pid <> pg_backend_pid()
    """
    for threshold in (total // 10, total // 2):

        async def reached(threshold: int = threshold) -> bool:
            return (await state_counts(client, "proc_noop")).get("completed", 0) >= threshold

        await wait_for(reached, timeout_s=40, interval_s=0.05)
        terminated = await value(client, terminate)
        left = (await state_counts(client, "proc_noop")).get("created", 0)
        assert terminated >= 1
        assert left > 0, "the drain finished before its connections were cut"

    await wait_drained(client, "proc_noop", total, timeout_s=30)
    assert proc.poll() is None, "the worker died instead of reconnecting"
    (count, first_attempt, clean) = (
        await rows(
            client,
            "SELECT count(*), count(*) FILTER (WHERE attempt = 1), "
            "count(*) FILTER (WHERE errors = '[]') FROM shoal.job WHERE queue = 'proc_noop'",
        )
    )[0]
    assert (count, first_attempt, clean) == (total, total, total)
    proc.send_signal(signal.SIGTERM)
    assert await workers.wait_exit(proc, EXIT_TIMEOUT_S) == 0


@pytest.mark.slow
async def test_cron_tick_is_enqueued_once_across_three_scheduler_processes(
    client: Shoal, workers: WorkerProcesses
) -> None:
    # Records, in the enqueuing transaction itself, which tick each job was
    # for: the scheduler moves last_tick and inserts the job in one transaction.
    async def install(conn: AsyncConn) -> None:
        await conn.execute(
            "CREATE TABLE public.tick_log (job_id bigint NOT NULL, tick timestamptz NOT NULL)"
        )
        await conn.execute(
            """
            CREATE FUNCTION public.log_tick() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO public.tick_log (job_id, tick)
                SELECT NEW.id, last_tick FROM shoal.schedule WHERE queue = NEW.queue;
                RETURN NEW;
            END $$
            """
        )
        await conn.execute(
            "CREATE TRIGGER log_tick AFTER INSERT ON shoal.job FOR EACH ROW "
            "WHEN (NEW.queue = 'proc_tick') EXECUTE FUNCTION public.log_tick()"
        )

    await client.db.run(install)
    procs = [workers.start(schedule=True) for _ in range(3)]
    await wait_started(client, 3)
    all_up = await value(client, "SELECT clock_timestamp()")
    assert [(s.name, s.queue) for s in await client.schedules()] == [(SCHEDULE_NAME, "proc_tick")]

    async def ticks_with_all_three_up() -> bool:
        count = await value(
            client, "SELECT count(*) FROM public.tick_log WHERE tick > %s", (all_up,)
        )
        return int(count) >= 4

    await wait_for(ticks_with_all_three_up, timeout_s=20, interval_s=0.1)
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert await workers.wait_exit(proc, EXIT_TIMEOUT_S) == 0

    jobs = await value(client, "SELECT count(*) FROM shoal.job WHERE queue = 'proc_tick'")
    logged = await rows(client, "SELECT tick FROM public.tick_log ORDER BY tick")
    ticks = [r[0] for r in logged]
    assert jobs == len(ticks), "a proc_tick job was enqueued outside the scheduler"
    duplicates = sorted({t for t in ticks if ticks.count(t) > 1})
    assert duplicates == [], f"ticks enqueued more than once: {duplicates}"
    assert all(t.microsecond == 0 for t in ticks)
    assert len([t for t in ticks if t > all_up]) >= 4


async def test_concurrent_sends_with_one_singleton_key_create_one_job(db_url: str) -> None:
    db = await Database(db_url, min_size=50, max_size=50, application_name="shoal-test").open()
    boss = Shoal(db, listen=False)
    try:
        await db.pool.wait(timeout=30)
        for round_ in range(5):
            key = f"only-one-{round_}"
            results = await asyncio.gather(
                *(boss.send("singleton_q", {"sender": i}, singleton_key=key) for i in range(50))
            )
            created = [r for r in results if r is not None]
            assert len(created) == 1, results
            assert results.count(None) == 49
            stored = await rows(boss, "SELECT id FROM shoal.job WHERE singleton_key = %s", (key,))
            assert stored == [(created[0],)]
    finally:
        await boss.close()
