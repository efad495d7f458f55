"""One batch task of 1,000,000 items: create, drain by 2 workers, worker RSS, cost per item.

    .venv/bin/python -m bench.million_bench                  # 1,000,000 items, a server of its own
    .venv/bin/python -m bench.million_bench --n 200000       # a smaller task, same report
    .venv/bin/python -m bench.million_bench --sides batch    # the task alone, no queue baseline
    .venv/bin/python -m bench.million_bench --server url     # on DATABASE_URL's server

The bars (issue 18): the create call takes under 30 s; every item is
complete, and the task closed, under 3 minutes after the create call
started, with 2 worker processes on this machine; each worker's RSS stays
flat while they work. Issue 40: an item's server CPU and WAL, create and
drain together, at most 2x a plain queue job's (the queue side below).

What it does:

1. starts a throwaway PostgreSQL cluster from the machine's binaries with
   initdb's defaults (fsync on, synchronous_commit on, autovacuum on) and
   ``pg_stat_statements`` loaded (``--server own``, the default: WAL and
   server CPU are then this run's alone), or uses DATABASE_URL's server
   (``--server url``: its WAL and CPU are shared with whatever else runs on
   it, and the figures per item say so);
2. measures the commit rate (single-row INSERTs committed one by one on one
   connection for 3 s) and prints it in the header with the load average,
   cores and commit, so a run can be read against the machine it ran on;
3. the batch side: starts 2 ``shoal worker --app bench.batch_bench:app``
   processes (a no-op handler, concurrency 10 each; bench/batch_bench.py)
   and waits until both are ready; creates one task of ``--n`` items
   (``Batches.create``, the item cap raised to ``--n``), timed; then polls
   ``Batches.get`` until the task is closed (every 0.5 s, or 4x the last
   poll's duration when longer), sampling each worker's RSS every second;
   checks that every item ended exactly once: all ``completed``, each
   guarded once (``attempt = 1``), one job per item, no phantom skip, the
   task closed once as ``completed``;
4. the queue side, on the same server after emptying the tables: 2
   ``shoal worker --app bench.batch_bench:queue_app`` processes (a no-op
   plain job handler, concurrency 10 each); ``--n`` jobs enqueued with
   ``insert_many`` (calls of 100,000, its cap, in one transaction), timed;
   polls until none waits or runs; checks each job completed, run once;
5. reports, per side, the times, WAL bytes and server CPU per item (per job)
   with create and drain apart, and, when ``pg_stat_statements`` is loaded,
   the statements that took the server's time; for the batch side the RSS
   of each worker at each tenth of the items; with both sides, an item's
   WAL and server CPU over a job's, create and drain together, against 2x.

A CHECKPOINT starts each side, so each pays the full-page images of its own
WAL. The progress polls run on a connection of their own; that backend's
CPU during the drain is measured (psutil) and left out of the server CPU per
item and per job, and printed. ``--sides`` runs one side or both, in the
order given (``queue,batch``: the baseline first).

This is a measurement script, not a test (not in CI): it exits 1 only when
an item or job did not end exactly once or the run failed, never on a missed
bar.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

if not __package__:  # run as a file: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.batch_bench import (
    JOB_QUEUE,
    KIND,
    SETTLE_S,
    TRUNCATE_SQL,
    WorkerProcess,
    _kill_live_children,
    shoal_app,
)
from bench.machine import OwnServer
from bench.machine import commit_rate as commit_rate_sync
from bench.queue_bench import DEFAULT_URL, shoal_version

BENCH_DB = "shoal_million"
DEFAULT_N = 1_000_000
WORKERS = 2
CREATE_BAR_S = 30.0
COMPLETE_BAR_S = 180.0
# Poll the task this often, or POLL_SPACING times the last poll when longer:
# early on a poll counts a million pending index entries.
POLL_S = 0.5
POLL_SPACING = 4
RSS_EVERY_S = 1.0
RUN_TIMEOUT_S = 900.0
STALL_TIMEOUT_S = 60.0
COMMIT_PROBE_S = 3.0
# "Flat": after the first tenth of the items, a worker's RSS grows by less
# than this share of what it was then.
RSS_FLAT_SHARE = 0.10
OWN_SERVER_SETTINGS = ("shared_preload_libraries=pg_stat_statements",)
STATEMENT_ROWS = 14
BATCH_APP = "bench.batch_bench:app"
QUEUE_APP = "bench.batch_bench:queue_app"
# Issue 40: an item's server CPU and WAL, create and drain together, at most
# this many times a plain queue job's.
ITEM_COST_BAR = 2.0
SIDES = {
    "batch": "one task of {n:,} items (Batches.create), drained by the workers, closed",
    "queue": "{n:,} plain no-op jobs (insert_many, in one transaction), drained by the workers",
}


# == helpers shared with bench/soak_bench.py ===================================


class Server:
    """The PostgreSQL server a run measures: a throwaway cluster of its own, or DATABASE_URL's."""

    def __init__(self, which: str, *, track: str = "top") -> None:
        # pg_stat_statements.track: top (statements sent) or all (also those
        # run inside database functions).
        self.settings = (*OWN_SERVER_SETTINGS, f"pg_stat_statements.track={track}")
        self.own = (
            OwnServer(dict(s.split("=", 1) for s in self.settings), prefix="shoal-million-")
            if which == "own"
            else None
        )
        self.admin_url = (
            self.own.url if self.own else (os.environ.get("DATABASE_URL") or DEFAULT_URL)
        )
        self.postmaster_pid: int | None = None

    def __enter__(self) -> Server:
        if self.own is not None:
            self.own.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.own is not None:
            self.own.stop()

    def describe(self) -> str:
        if self.own is not None:
            return (
                "a throwaway cluster of its own (initdb defaults; " + ", ".join(self.settings) + ")"
            )
        return "DATABASE_URL's server (shared: its WAL and CPU include other databases' work)"

    async def fresh_database(self, name: str) -> str:
        """Drop and create ``name``; returns its URL."""
        async with await psycopg.AsyncConnection.connect(self.admin_url, autocommit=True) as c:
            ident = sql.Identifier(name)
            await c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
            await c.execute(sql.SQL("CREATE DATABASE {}").format(ident))
            cur = await c.execute("SELECT pg_backend_pid()")
            row = await cur.fetchone()
            assert row is not None
            import psutil

            self.postmaster_pid = psutil.Process(row[0]).ppid()
        return make_conninfo(self.admin_url, dbname=name)

    async def drop_database(self, name: str) -> None:
        async with await psycopg.AsyncConnection.connect(self.admin_url, autocommit=True) as c:
            await c.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


async def settings_line(conn: psycopg.AsyncConnection[Any]) -> str:
    cur = await conn.execute(
        "SELECT name, setting FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit',"
        " 'autovacuum', 'shared_buffers', 'max_wal_size', 'full_page_writes') ORDER BY name"
    )
    return ", ".join(f"{k}={v}" for k, v in await cur.fetchall())


async def commit_rate(url: str, seconds: float = COMMIT_PROBE_S) -> float:
    """Commits per second of single-row INSERTs on one connection (bench/machine.py's probe)."""
    return await asyncio.to_thread(commit_rate_sync, url, seconds)


def server_cpu_s(pid: int | None) -> float:
    """CPU seconds of the postmaster and its children, live and exited (0 when unreadable)."""
    if pid is None:
        return 0.0
    from bench.machine import server_cpu_s as cpu_of_tree

    try:
        return cpu_of_tree(pid)
    except Exception:  # psutil.Error: not on this machine, or not readable
        return 0.0


async def wal_lsn(conn: psycopg.AsyncConnection[Any]) -> int:
    cur = await conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def top_statements(conn: psycopg.AsyncConnection[Any], limit: int) -> list[str]:
    """The statements that took the most server time since the last reset, as lines."""
    cur = await conn.execute(
        "SELECT calls, total_exec_time, rows,"
        " regexp_replace(regexp_replace(query, '--[^\\n]*', '', 'g'), '\\s+', ' ', 'g')"
        " FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database"
        " WHERE datname = current_database()) ORDER BY total_exec_time DESC LIMIT %s",
        (limit,),
    )
    rows = await cur.fetchall()
    total = sum(r[1] for r in rows) or 1.0
    lines = [f"{'calls':>8} {'total s':>8} {'share':>6} {'ms/call':>8} {'rows/call':>9}  statement"]
    for calls, ms, nrows, query in rows:
        lines.append(
            f"{calls:>8,} {ms / 1000:>8.2f} {ms / total:>6.0%} {ms / max(calls, 1):>8.2f} "
            f"{nrows / max(calls, 1):>9.0f}  {query.strip()[:110]}"
        )
    return lines


async def has_statements(conn: psycopg.AsyncConnection[Any]) -> bool:
    cur = await conn.execute("SELECT current_setting('shared_preload_libraries')")
    row = await cur.fetchone()
    if not row or "pg_stat_statements" not in str(row[0]):
        return False
    await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return True


def machine_line() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"{now}; os.cpu_count() = {os.cpu_count()}; load average {load}"


@dataclass
class RssTrack:
    """RSS samples of worker processes: (seconds since start, MiB) per worker."""

    workers: Sequence[WorkerProcess]
    start: float
    samples: list[list[tuple[float, float]]] = field(default_factory=list)

    async def run(self) -> None:
        import psutil

        self.samples = [[] for _ in self.workers]
        procs = [psutil.Process(w.proc.pid) for w in self.workers]
        while True:
            t = time.perf_counter() - self.start
            for i, p in enumerate(procs):
                with contextlib.suppress(psutil.NoSuchProcess):
                    self.samples[i].append((t, p.memory_info().rss / 2**20))
            await asyncio.sleep(RSS_EVERY_S)

    def at(self, worker: int, t: float) -> float | None:
        """The worker's RSS at the last sample not after ``t``."""
        before = [mib for at, mib in self.samples[worker] if at <= t]
        return before[-1] if before else None

    def peak(self, worker: int, after: float = 0.0) -> float:
        return max((mib for at, mib in self.samples[worker] if at >= after), default=0.0)


async def start_workers(url: str, n: int, *, app: str = BATCH_APP) -> list[WorkerProcess]:
    workers = [await WorkerProcess.start("shoal", url, "asyncpg", app=app) for _ in range(n)]
    for w in workers:
        await w.wait_ready()
    await asyncio.sleep(SETTLE_S)
    return workers


async def stop_workers(workers: Sequence[WorkerProcess]) -> None:
    await asyncio.gather(*(w.stop() for w in workers))


# == the million ===============================================================


@dataclass
class Run:
    """One side of a run: the batch task's items, or the plain queue's jobs."""

    n: int
    side: str = "batch"  # "batch": items of one task; "queue": plain jobs
    create_s: float = 0.0
    closed_s: float = 0.0  # create start -> the parent sees the task closed / the jobs done
    detect_s: float = 0.0
    progress: list[tuple[float, int]] = field(default_factory=list)  # (t, items finished)
    wal_create: int = 0
    wal_drain: int = 0
    cpu_create_s: float = 0.0
    cpu_drain_s: float = 0.0  # the whole server's, the bench's polls included
    polls: int = 0
    poll_cpu_s: float = 0.0  # the server CPU of the bench's own polls, during the drain
    worker_cpu_s: list[float] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    statements: list[str] = field(default_factory=list)

    @property
    def unit(self) -> str:
        return "item" if self.side == "batch" else "job"

    @property
    def counted_drain_cpu_s(self) -> float:
        """The drain's server CPU without the bench's own polls."""
        return self.cpu_drain_s - self.poll_cpu_s

    def wal_per(self) -> float:
        return (self.wal_create + self.wal_drain) / self.n

    def cpu_per(self) -> float:
        return (self.cpu_create_s + self.counted_drain_cpu_s) / self.n


# The parent's connections: the create (or insert) and checks, and the polls,
# apart so the polls' server CPU can be read from their own backend.
PARENT_APP = "million_bench_parent"
POLL_APP = "million_bench_poll"

CHECKS_SQL = """
SELECT
  (SELECT count(*) FROM shoal.item WHERE task_id = %(t)s),
  (SELECT count(*) FROM shoal.item WHERE task_id = %(t)s AND status = 'completed'),
  (SELECT count(*) FROM shoal.item WHERE task_id = %(t)s AND attempt <> 1),
  (SELECT count(*) FROM shoal.job WHERE queue = %(q)s),
  (SELECT coalesce(sum(value), 0) FROM shoal.counter
    WHERE name IN ('phantom_skips', 'cancelled_skips')),
  (SELECT status::text || '/' || outcome::text FROM shoal.task WHERE id = %(t)s),
  (SELECT extract(epoch FROM completed_at - last_item_at)::float8 FROM shoal.task
    WHERE id = %(t)s)
"""

# The queue side's poll: jobs waiting (job_claim) and running (job_lease).
QUEUE_POLL_SQL = """
SELECT (SELECT count(*) FROM shoal.job WHERE queue = %(q)s AND state IN ('created', 'retry')),
       (SELECT count(*) FROM shoal.job WHERE queue = %(q)s AND state = 'active')
"""

QUEUE_CHECKS_SQL = """
SELECT count(*),
       count(*) FILTER (WHERE state = 'completed'),
       count(*) FILTER (WHERE attempt <> 1),
       extract(epoch FROM max(finished_at) - min(created_at))::float8
FROM shoal.job WHERE queue = %(q)s
"""


async def check_exactly_once(conn: psycopg.AsyncConnection[Any], run: Run, task_id: str) -> None:
    queue = shoal_app().kinds[KIND].queue
    cur = await conn.execute(CHECKS_SQL, {"t": task_id, "q": queue})
    row = await cur.fetchone()
    assert row is not None
    items, completed, reguarded, jobs, skips, closed, detect = row
    run.detect_s = float(detect or 0.0)
    facts = [
        (items == run.n, f"items {items:,} of {run.n:,}"),
        (completed == run.n, f"completed {completed:,}"),
        (reguarded == 0, f"items guarded other than once: {reguarded:,}"),
        # Each item's one job was taken (a taken item job is deleted), and
        # none was sent again: every item was guarded once, and no delivery
        # was skipped as a phantom.
        (jobs == 0, f"item jobs left: {jobs:,}"),
        (skips == 0, f"phantom or cancelled skips: {skips}"),
        (closed == "completed/completed", f"task {closed}"),
    ]
    for ok, text in facts:
        (run.checks if ok else run.failures).append(text)


async def check_jobs_once(conn: psycopg.AsyncConnection[Any], run: Run) -> None:
    cur = await conn.execute(QUEUE_CHECKS_SQL, {"q": JOB_QUEUE})
    row = await cur.fetchone()
    assert row is not None
    jobs, completed, rerun, _span = row
    facts = [
        (jobs == run.n, f"jobs {jobs:,} of {run.n:,}"),
        (completed == run.n, f"completed {completed:,}"),
        (rerun == 0, f"jobs run other than once: {rerun:,}"),
    ]
    for ok, text in facts:
        (run.checks if ok else run.failures).append(text)


async def backends_cpu_s(conn: psycopg.AsyncConnection[Any], application_name: str) -> float:
    """CPU seconds so far of the live backends of the clients named ``application_name``.

    A backend that exits between two readings takes its CPU out of this sum
    (it stays in the server's): the polls' pool keeps its one connection.
    """
    import psutil

    cur = await conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (application_name,)
    )
    total = 0.0
    for (pid,) in await cur.fetchall():
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


class Polls:
    """The parent's progress polls: paced, timed out, printed, and their server CPU counted."""

    def __init__(self, run: Run, workers: Sequence[WorkerProcess], track: RssTrack) -> None:
        self.run = run
        self.workers = workers
        self.track = track
        self.last_finished = -1
        self.last_change = time.perf_counter()
        self.last_print = 0.0

    async def pace(self, finished: int, polled: float) -> None:
        """After a poll that started at ``polled`` and saw ``finished``: check, print, wait."""
        run, start = self.run, self.track.start
        now = time.perf_counter()
        run.polls += 1
        run.progress.append((now - start, finished))
        if any(not w.alive for w in self.workers):
            raise RuntimeError("a worker died mid-run: " + self.workers[0].describe())
        if finished != self.last_finished:
            self.last_finished, self.last_change = finished, now
        elif now - self.last_change > STALL_TIMEOUT_S:
            raise RuntimeError(f"no {run.unit} finished for {STALL_TIMEOUT_S:.0f} s ({finished:,})")
        if now - start > RUN_TIMEOUT_S:
            raise RuntimeError(f"not done after {RUN_TIMEOUT_S:.0f} s ({finished:,})")
        if now - self.last_print >= 15:
            self.last_print = now
            rss = ", ".join(f"{self.track.at(i, now - start) or 0:.0f}" for i in range(WORKERS))
            print(
                f"  {now - start:6.1f} s: {finished:>9,} finished; RSS MiB {rss}; "
                f"load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
        await asyncio.sleep(max(POLL_S, POLL_SPACING * (now - polled)))


async def measure(url: str, server: Server, n: int, stats: bool) -> tuple[Run, RssTrack]:
    """The batch side: one task of ``n`` items created, drained and closed."""
    from shoal import Shoal
    from shoal.batch.service import Batches
    from shoal.batch.states import TaskStatus

    run = Run(n)
    boss = await Shoal.connect(url, listen=False, application_name=PARENT_APP)
    poller = await Shoal.connect(
        url, listen=False, application_name=POLL_APP, min_size=1, max_size=1
    )
    admin = await psycopg.AsyncConnection.connect(url, autocommit=True)
    workers: list[WorkerProcess] = []
    track: RssTrack | None = None
    sampler: asyncio.Task[None] | None = None
    try:
        batches = Batches(boss, shoal_app().kinds, max_items=n)
        polled_batches = Batches(poller, shoal_app().kinds, max_items=n)
        # One untimed create warms the parent's connection; emptied before the run.
        await batches.create(KIND, [f"warmup-{i}" for i in range(100)])
        await admin.execute(TRUNCATE_SQL["shoal"])
        refs = [f"item-{i}" for i in range(n)]
        workers = await start_workers(url, WORKERS)
        await admin.execute("CHECKPOINT")
        if stats:
            await admin.execute("SELECT pg_stat_statements_reset()")
        wal0, cpu0 = await wal_lsn(admin), server_cpu_s(server.postmaster_pid)
        wcpu0 = [w.cpu_s() for w in workers]
        start = time.perf_counter()
        track = RssTrack(workers, start)
        sampler = asyncio.create_task(track.run())
        created = await batches.create(KIND, refs)
        run.create_s = time.perf_counter() - start
        wal1, cpu1 = await wal_lsn(admin), server_cpu_s(server.postmaster_pid)
        poll0 = await backends_cpu_s(admin, POLL_APP)
        print(f"  created {n:,} items in {run.create_s:.1f} s", flush=True)
        polls = Polls(run, workers, track)
        while True:
            polled = time.perf_counter()
            view = await polled_batches.get(created.task_id)
            if view.status is not TaskStatus.PROCESSING:
                run.closed_s = time.perf_counter() - start
                run.polls += 1
                break
            await polls.pace(view.progress.finished, polled)
        run.poll_cpu_s = await backends_cpu_s(admin, POLL_APP) - poll0
        wal2, cpu2 = await wal_lsn(admin), server_cpu_s(server.postmaster_pid)
        run.worker_cpu_s = [w.cpu_s() - c for w, c in zip(workers, wcpu0, strict=True)]
        run.wal_create, run.wal_drain = wal1 - wal0, wal2 - wal1
        run.cpu_create_s, run.cpu_drain_s = cpu1 - cpu0, cpu2 - cpu1
        if stats:
            run.statements = await top_statements(admin, STATEMENT_ROWS)
        await check_exactly_once(admin, run, created.task_id)
    finally:
        if sampler is not None:
            sampler.cancel()
        await stop_workers(workers)
        await admin.close()
        await poller.close()
        await boss.close()
    assert track is not None
    return run, track


async def measure_queue(url: str, server: Server, n: int, stats: bool) -> tuple[Run, RssTrack]:
    """The plain queue side: ``n`` no-op jobs enqueued at once, run by the same 2 workers.

    A user enqueues many jobs with ``insert_many``, at most MAX_INSERT a
    call: the ``n`` jobs are sent in calls of MAX_INSERT in one transaction,
    so they commit (and wake the workers) together, as a task's item jobs do.
    """
    from shoal import Shoal
    from shoal.queue.enqueue import MAX_INSERT

    run = Run(n, side="queue")
    boss = await Shoal.connect(url, listen=False, application_name=PARENT_APP)
    admin = await psycopg.AsyncConnection.connect(url, autocommit=True)
    poll = await psycopg.AsyncConnection.connect(url, autocommit=True, application_name=POLL_APP)
    workers: list[WorkerProcess] = []
    track: RssTrack | None = None
    sampler: asyncio.Task[None] | None = None
    try:
        # One untimed insert warms the parent's connection; emptied before the run.
        await boss.insert_many(JOB_QUEUE, [{"ref": f"warmup-{i}"} for i in range(100)])
        await admin.execute(TRUNCATE_SQL["shoal"])
        # A job's payload names its work, as an item's ref does.
        payloads = [{"ref": f"item-{i}"} for i in range(n)]
        workers = await start_workers(url, WORKERS, app=QUEUE_APP)
        await admin.execute("CHECKPOINT")
        if stats:
            await admin.execute("SELECT pg_stat_statements_reset()")
        wal0, cpu0 = await wal_lsn(admin), server_cpu_s(server.postmaster_pid)
        wcpu0 = [w.cpu_s() for w in workers]
        start = time.perf_counter()
        track = RssTrack(workers, start)
        sampler = asyncio.create_task(track.run())
        async with boss.db.connection() as conn, conn.transaction():
            for at in range(0, n, MAX_INSERT):
                await boss.insert_many(JOB_QUEUE, payloads[at : at + MAX_INSERT], conn=conn)
        run.create_s = time.perf_counter() - start
        wal1, cpu1 = await wal_lsn(admin), server_cpu_s(server.postmaster_pid)
        poll0 = await backends_cpu_s(admin, POLL_APP)
        print(f"  enqueued {n:,} jobs in {run.create_s:.1f} s", flush=True)
        polls = Polls(run, workers, track)
        while True:
            polled = time.perf_counter()
            cur = await poll.execute(QUEUE_POLL_SQL, {"q": JOB_QUEUE})
            row = await cur.fetchone()
            assert row is not None
            waiting, active = row
            if waiting == 0 and active == 0:
                run.closed_s = time.perf_counter() - start
                run.polls += 1
                break
            await polls.pace(n - waiting - active, polled)
        run.poll_cpu_s = await backends_cpu_s(admin, POLL_APP) - poll0
        wal2, cpu2 = await wal_lsn(admin), server_cpu_s(server.postmaster_pid)
        run.worker_cpu_s = [w.cpu_s() - c for w, c in zip(workers, wcpu0, strict=True)]
        run.wal_create, run.wal_drain = wal1 - wal0, wal2 - wal1
        run.cpu_create_s, run.cpu_drain_s = cpu1 - cpu0, cpu2 - cpu1
        if stats:
            run.statements = await top_statements(admin, STATEMENT_ROWS)
        await check_jobs_once(admin, run)
    finally:
        if sampler is not None:
            sampler.cancel()
        await stop_workers(workers)
        await poll.close()
        await admin.close()
        await boss.close()
    assert track is not None
    return run, track


def rss_lines(run: Run, track: RssTrack) -> tuple[list[str], list[bool]]:
    """RSS of each worker at each tenth of the items finished, and whether each stayed flat."""
    lines = [f"{'finished':>9} {'at s':>7}  " + "  ".join(f"w{i + 1} MiB" for i in range(WORKERS))]
    first_tenth_t: float | None = None
    for tenth in range(1, 11):
        goal = run.n * tenth // 10
        t = next((at for at, done in run.progress if done >= goal), None)
        if t is None:
            continue
        if tenth == 1:
            first_tenth_t = t
        rss = "  ".join(f"{track.at(i, t) or 0:>6.1f}" for i in range(WORKERS))
        lines.append(f"{tenth * 10:>8}% {t:>7.1f}  {rss}")
    flat = []
    for i in range(WORKERS):
        base = track.at(i, first_tenth_t) if first_tenth_t is not None else None
        peak = track.peak(i, after=first_tenth_t or 0.0)
        ok = base is not None and peak <= base * (1 + RSS_FLAT_SHARE)
        flat.append(ok)
        lines.append(
            f"w{i + 1}: {base or 0:.1f} MiB at 10%, peak after it {peak:.1f} MiB "
            f"({(peak / base - 1) if base else 0:+.1%}); overall peak {track.peak(i):.1f} MiB"
        )
    return lines, flat


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def cost_lines(run: Run, shared: bool) -> list[str]:
    """WAL and server CPU per item (or job), create and drain apart, and what is counted."""
    n, unit = run.n, run.unit
    mark = "shared server: WAL and CPU include other databases' work" if shared else ""
    return [
        f"per {unit} " + (f"({mark})" if mark else "(this server did nothing else)") + ":",
        f"  create: WAL {run.wal_create / n:,.0f} bytes, "
        f"server CPU {run.cpu_create_s / n * 1e6:.0f} us "
        f"(total {run.wal_create / 1e6:,.0f} MB, {run.cpu_create_s:.1f} s)",
        f"  drain:  WAL {run.wal_drain / n:,.0f} bytes, "
        f"server CPU {run.counted_drain_cpu_s / n * 1e6:.0f} us "
        f"(total {run.wal_drain / 1e6:,.0f} MB, {run.counted_drain_cpu_s:.1f} s; "
        f"with the bench's polls {run.cpu_drain_s / n * 1e6:.0f} us)",
        f"  together: WAL {run.wal_per():,.0f} bytes, server CPU {run.cpu_per() * 1e6:.0f} us",
        f"  left out: the bench's {run.polls} progress polls, {run.poll_cpu_s:.1f} s of server "
        f"CPU (their backend's own CPU time; {run.poll_cpu_s / n * 1e6:.1f} us per {unit})",
    ]


def report(run: Run, track: RssTrack, shared: bool) -> list[str]:
    n = run.n
    drain_s = run.closed_s - run.create_s
    rate = n / drain_s if drain_s > 0 else 0.0
    rss, flat = rss_lines(run, track)
    lines = [
        f"create: {run.create_s:.1f} s "
        f"(bar {CREATE_BAR_S:.0f} s: {verdict(run.create_s < CREATE_BAR_S)})",
        f"all complete, task closed: {run.closed_s:.1f} s after the create call started "
        f"(bar {COMPLETE_BAR_S:.0f} s: {verdict(run.closed_s < COMPLETE_BAR_S)}); "
        f"drain after create {drain_s:.1f} s, {rate:,.0f} items/s; "
        f"detection {run.detect_s * 1000:.0f} ms",
        f"worker RSS flat (under +{RSS_FLAT_SHARE:.0%} after the first tenth): "
        + ", ".join(f"w{i + 1} {verdict(ok)}" for i, ok in enumerate(flat)),
        "worker CPU s: " + ", ".join(f"{c:.1f}" for c in run.worker_cpu_s),
        "",
        *cost_lines(run, shared),
        "",
        "RSS of each worker as the items finished:",
        *rss,
        "",
        "exactly once: " + "; ".join(run.checks),
    ]
    return lines + closing_lines(run)


def closing_lines(run: Run) -> list[str]:
    """What failed, and where the server's time went, after either side's report."""
    lines = ["FAILED: " + "; ".join(run.failures)] if run.failures else []
    if run.statements:
        lines += ["", "where the server's time went (pg_stat_statements):", *run.statements]
    return lines


def queue_report(run: Run, shared: bool) -> list[str]:
    n = run.n
    drain_s = run.closed_s - run.create_s
    rate = n / drain_s if drain_s > 0 else 0.0
    lines = [
        f"enqueue: {run.create_s:.1f} s; all {n:,} jobs completed {run.closed_s:.1f} s after "
        f"it started; drain after enqueue {drain_s:.1f} s, {rate:,.0f} jobs/s",
        "worker CPU s: " + ", ".join(f"{c:.1f}" for c in run.worker_cpu_s),
        "",
        *cost_lines(run, shared),
        "",
        "exactly once: " + "; ".join(run.checks),
    ]
    return lines + closing_lines(run)


def ratio_lines(batch: Run, queue: Run) -> list[str]:
    """An item's cost over a plain job's, create and drain together, against the bar of 2x."""

    def line(what: str, item: float, job: float, fmt: str) -> str:
        ratio = item / job if job > 0 else float("inf")
        return (
            f"  {what}: {format(item, fmt)} / {format(job, fmt)} = {ratio:.2f}x "
            f"(bar {ITEM_COST_BAR:.0f}x: {verdict(ratio <= ITEM_COST_BAR)})"
        )

    return [
        f"item / plain job, create and drain together ({batch.n:,} items beside "
        f"{queue.n:,} jobs, one server):",
        line("WAL bytes", batch.wal_per(), queue.wal_per(), ",.0f"),
        line("server CPU us", batch.cpu_per() * 1e6, queue.cpu_per() * 1e6, ",.1f"),
        "  counted: every process of the server between the samples (the backends of the "
        "workers and of the create or insert, autovacuum, checkpointer, WAL writer, the "
        "aggregator's and maintenance's statements); a checkpoint before each side, so "
        "each pays its own full-page images; the task's close is in the batch drain",
        "  not counted: the bench's progress polls (their backend's CPU, subtracted; they "
        "write no WAL), the workers' own CPU (above), archiving completed jobs later",
    ]


async def main_async(args: argparse.Namespace) -> int:
    main_task = asyncio.current_task()
    assert main_task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, main_task.cancel)
    with Server(args.server, track=args.track) as server:
        url = await server.fresh_database(BENCH_DB)
        try:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
                cur = await c.execute("SELECT version()")
                version = (await cur.fetchone() or ("?",))[0]
                settings = await settings_line(c)
                stats = await has_statements(c)
            rate = await commit_rate(url)
            header = [
                f"shoal million bench: one task of {args.n:,} items, {WORKERS} worker processes",
                f"{machine_line()}; commit rate {rate:,.0f}/s (one connection, "
                f"single-row INSERTs for {COMMIT_PROBE_S:.0f} s)",
                f"server: {server.describe()}",
                f"{version.split(',')[0]}; {settings}",
                f"shoal: {shoal_version()}",
            ]
            print("\n".join(header), flush=True)
            runs: dict[str, tuple[Run, RssTrack]] = {}
            failed: list[str] = []
            for side in args.sides:
                print(f"{side}: " + SIDES[side].format(n=args.n), flush=True)
                measure_side = measure if side == "batch" else measure_queue
                try:
                    runs[side] = await measure_side(url, server, args.n, stats)
                except RuntimeError as exc:  # a stall or a dead worker: report the other side
                    failed.append(f"{side}: {exc}")
                    print(f"  {side} FAILED: {exc}", flush=True)
        finally:
            await server.drop_database(BENCH_DB)
    print(f"\n(load average at end {', '.join(f'{x:.2f}' for x in os.getloadavg())})")
    shared = server.own is None
    for side, (run, track) in runs.items():
        print(f"\n== {side}: " + SIDES[side].format(n=args.n) + "\n")
        lines = report(run, track, shared) if side == "batch" else queue_report(run, shared)
        print("\n".join(lines))
    if "batch" in runs and "queue" in runs:
        print("\n" + "\n".join(ratio_lines(runs["batch"][0], runs["queue"][0])))
    for text in failed:
        print(f"\nFAILED: {text}")
    return 1 if failed or any(run.failures for run, _ in runs.values()) else 0


def sides(text: str) -> list[str]:
    """``--sides``: a comma-separated list of batch and queue, run in that order."""
    chosen = [s.strip() for s in text.split(",") if s.strip()]
    if not chosen or any(s not in SIDES for s in chosen) or len(set(chosen)) < len(chosen):
        raise argparse.ArgumentTypeError(f"{text!r}: batch, queue or both, comma-separated")
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--n", type=int, default=DEFAULT_N, help="items in the task (and jobs)")
    parser.add_argument(
        "--sides",
        type=sides,
        default=["batch", "queue"],
        help="what to run, in this order: batch (one task of N items), queue (N plain "
        "jobs, the baseline of an item's cost); default batch,queue",
    )
    parser.add_argument(
        "--server",
        choices=("own", "url"),
        default="own",
        help="own: a throwaway cluster (default); url: DATABASE_URL's server",
    )
    parser.add_argument(
        "--track",
        choices=("top", "all"),
        default="top",
        help="pg_stat_statements.track on its own server (all: statements inside functions too)",
    )
    args = parser.parse_args()
    if args.n < 1:
        raise SystemExit("--n: at least 1")
    try:
        code = asyncio.run(main_async(args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted: worker processes stopped", file=sys.stderr)
        code = 130
    finally:
        _kill_live_children()
    sys.exit(code)


if __name__ == "__main__":
    main()
