"""Queue (Level 1) benchmark: shoal beside procrastinate, pgqueuer and raw psycopg.

    .venv/bin/python bench/queue_bench.py            # 3 repetitions, median reported
    .venv/bin/python bench/queue_bench.py --quick    # 1 repetition
    .venv/bin/python bench/queue_bench.py --n 20000 --libs shoal,raw
    .venv/bin/python bench/queue_bench.py --libs shoal \
        --pg-setting plan_cache_mode=force_custom_plan

What it measures, all in one run against one Postgres server:

- enqueue: N jobs in one call of each library's batch API, timed in this
  process (turning the payloads into the library's input is inside the timing),
  once per drain repetition, and after the drains ``--enqueue-rounds`` times
  (default 9) with the libraries taking turns: the ratio to the raw insert is
  taken round by round, so a slow moment of the machine's disk hits both;
- drain: the same N no-op jobs worked off by one worker at concurrency 10, in a
  child process of its own (so its peak RSS is its own), timed from the moment
  the worker is started until the database shows every job finished. The
  cases take turns, one repetition each per round, and shoal's drain rate and
  server CPU are also compared with the raw loops' round by round;
- stale planner statistics (shoal and the raw loops only): the job table is
  filled, emptied and analyzed while it holds no rows (keeping its pages), with
  autovacuum off, before the N jobs arrive;
- ``rawjob``: the two-claimer raw loop run on a copy of ``shoal.job`` (its
  checks, its indexes, its fillfactor), writing what that row requires of a claim and a
  completion: it parts what shoal spends above the raw loop into what the
  job row costs any loop and what shoal's own statements and worker add.

A drain child that cannot tell from its own loop that the jobs are done (all
but the raw loops) watches the database on a connection of its own; that
connection's statements and its server process's CPU are left out of the
library's per-job figures.

``--pg-setting`` sets a server setting for every session of the bench database,
to test a hypothesis (the output names it; don't publish such a run as the
default one).

The database named by DATABASE_URL (default: the local server) is only used to
drop and create ``shoal_bench``; every library gets a schema of its own there.
This is a measurement script, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Sized
from dataclasses import dataclass, field
from typing import Any

import psutil
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

if not __package__:  # run as a file: make ``bench`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.machine import (
    STORAGE_OPTIONS_SQL,
    OwnServer,
    ServerMeter,
    Usage,
    add_slow_commits_option,
    describe,
    own_server_settings,
)

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
BENCH_DB = "shoal_bench"
QUEUE = "bench_noop"
CONCURRENCY = 10
# The raw baseline claims this many jobs per statement (the issue's figure).
RAW_CLAIM_BATCH = 100
# The second raw baseline runs this many claim loops at once, each on its own
# connection: as many as shoal's worker keeps busy during a drain (the
# fetcher's and the completer's; its LISTEN connection only waits). The shoal
# child reports its pool's size, to check.
RAW_CLAIMERS = 2
# pgqueuer runs with its own default batch size (PgQueuer.run(batch_size=10)),
# and again with the batch the raw baseline and shoal claim (up to 100); the
# "vs pgqueuer" column compares with the second, which drained faster in every
# run on the 2-core machine.
PGQ_BATCH_SIZES = (10, 100)
PGQ_REFERENCE_BATCH = 100
# How often a drain child looks at the database once its handler has seen N jobs.
DONE_POLL_S = 0.002
# A drain that takes longer than this is reported as failed, not waited for.
DRAIN_TIMEOUT_S = 180.0
# ... and so is one whose finished count stops moving for this long.
STALL_TIMEOUT_S = 20.0
# How often the parent samples a child's RSS (the child also reports VmHWM).
RSS_SAMPLE_S = 0.02
# The child passes the connection string through the environment, not argv,
# so a password in DATABASE_URL never shows in the process list.
URL_ENV = "SHOAL_BENCH_URL"
SCRIPT = os.path.abspath(__file__)

SCHEMA_SHOAL = "shoal"
SCHEMA_RAW = "bench_raw"
SCHEMA_PROCRASTINATE = "bench_procrastinate"
SCHEMA_PGQUEUER = "bench_pgqueuer"
SCHEMA_RAWJOB = "bench_rawjob"

LIBS = ("raw", "rawjob", "shoal", "pgqueuer", "procrastinate")
# Libraries measured a second time with planner statistics taken on an empty table.
STALE_LIBS = ("raw", "rawjob", "shoal")

SETTINGS = {
    "raw": (
        f"one connection (x1) or {RAW_CLAIMERS} at once (x{RAW_CLAIMERS}), each a loop: "
        f"claim {RAW_CLAIM_BATCH} per UPDATE ... WHERE id IN (SELECT ... "
        "FOR UPDATE SKIP LOCKED LIMIT n) RETURNING, then complete them in one UPDATE"
    ),
    "rawjob": (
        f"the raw loop x{RAW_CLAIMERS} on a copy of shoal.job (LIKE ... INCLUDING ALL, and its "
        "fillfactor), claiming and completing as shoal's row requires (lease, holder, "
        "start_after, finished_at)"
    ),
    "shoal": f"boss.work(queue, handler, concurrency={CONCURRENCY}) (batch_size default)",
    "pgqueuer": (
        "PgQueuer.from_psycopg_connection(conn).run(batch_size=10 | 100); "
        "max_concurrent_tasks unset (pgqueuer's default: no cap); enqueue: "
        "Queries.enqueue(list, list, list)"
    ),
    "procrastinate": (
        f"App(PsycopgConnector(default pool)).run_worker_async(concurrency={CONCURRENCY}, "
        "wait=False); enqueue: task.batch_defer_async(*kwargs)"
    ),
}

# -- the raw psycopg baseline ----------------------------------------------

RAW_SCHEMA_SQL = """
CREATE TABLE {schema}.job (
    id          bigserial PRIMARY KEY,
    queue       text NOT NULL,
    state       text NOT NULL DEFAULT 'queued',
    data        jsonb NOT NULL,
    attempt     integer NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now(),
    started_at  timestamptz,
    finished_at timestamptz
);
CREATE INDEX job_claim ON {schema}.job (queue, id) WHERE state = 'queued';
"""

RAW_INSERT = """
INSERT INTO bench_raw.job (queue, data)
SELECT %s, d FROM unnest(%s::jsonb[]) AS d
RETURNING id
"""

RAW_CLAIM = """
UPDATE bench_raw.job
SET state = 'running', attempt = attempt + 1, started_at = now()
WHERE id IN (
    SELECT id FROM bench_raw.job
    WHERE queue = %s AND state = 'queued'
    ORDER BY id
    LIMIT %s
    FOR UPDATE SKIP LOCKED)
RETURNING id, data
"""

RAW_COMPLETE = """
UPDATE bench_raw.job SET state = 'done', finished_at = now()
WHERE id = ANY(%s) AND state = 'running'
"""

# The raw loop on a copy of shoal's job table: the same two statements a
# round, writing what the row's checks require of a claim (a lease and a
# holder) and of a completion (the lease cleared, a finish time), and
# honouring start_after as a queue must. The enqueue writes shoal's defaults.
# What the drain costs above the raw loop is then the row's; what shoal costs
# above this loop is shoal's own.
RAWJOB_SCHEMA_SQL = "CREATE TABLE {schema}.job (LIKE {shoal}.job INCLUDING ALL)"

RAWJOB_INSERT = """
INSERT INTO bench_rawjob.job (queue, data, retry_limit, retry_delay, retry_backoff,
                              retry_delay_max, expire_in, created_at, start_after)
SELECT %s, d, 2, '0 s', false, '1 h', '15 min', now(), now()
FROM unnest(%s::jsonb[]) AS d
RETURNING id
"""

RAWJOB_CLAIM = """
UPDATE bench_rawjob.job
SET state = 'active', attempt = attempt + 1, started_at = now(),
    lease_expires_at = now() + expire_in, holder = 1
WHERE id IN (
    SELECT id FROM bench_rawjob.job
    WHERE queue = %s AND state IN ('created', 'retry') AND start_after <= now()
    ORDER BY priority DESC, id
    LIMIT %s
    FOR UPDATE SKIP LOCKED)
RETURNING id, data
"""

RAWJOB_COMPLETE = """
UPDATE bench_rawjob.job SET state = 'completed', finished_at = now(), lease_expires_at = NULL
WHERE id = ANY(%s) AND state = 'active'
"""

# What "every job finished" looks like in each library's tables. The comment
# marks the drain's watcher, whose polls are not the library's statements.
WATCH_MARK = "/* bench watch */"  # also on the parent's own queries during a drain
DONE_COUNT_SQL = {
    "raw": f"SELECT count(*) FROM bench_raw.job WHERE state = 'done' {WATCH_MARK}",
    "rawjob": (f"SELECT count(*) FROM bench_rawjob.job WHERE state = 'completed' {WATCH_MARK}"),
    "shoal": f"SELECT count(*) FROM shoal.job WHERE state = 'completed' {WATCH_MARK}",
    # pgqueuer deletes a finished job from its queue table and logs it.
    "pgqueuer": (
        f"SELECT count(*) FROM bench_pgqueuer.pgqueuer_log WHERE status = 'successful' {WATCH_MARK}"
    ),
    "procrastinate": (
        "SELECT count(*) FROM bench_procrastinate.procrastinate_jobs WHERE status = 'succeeded' "
        f"{WATCH_MARK}"
    ),
}

# The table whose statistics the drain's claim is planned with.
JOB_TABLE = {
    "raw": sql.Identifier(SCHEMA_RAW, "job"),
    "rawjob": sql.Identifier(SCHEMA_RAWJOB, "job"),
    "shoal": sql.Identifier(SCHEMA_SHOAL, "job"),
    "pgqueuer": sql.Identifier(SCHEMA_PGQUEUER, "pgqueuer"),
    "procrastinate": sql.Identifier(SCHEMA_PROCRASTINATE, "procrastinate_jobs"),
}

TRUNCATE_SQL = {
    "raw": "TRUNCATE bench_raw.job",
    "rawjob": "TRUNCATE bench_rawjob.job",
    "shoal": "TRUNCATE shoal.job, shoal.job_archive",
    "pgqueuer": (
        "TRUNCATE bench_pgqueuer.pgqueuer, bench_pgqueuer.pgqueuer_log, "
        "bench_pgqueuer.pgqueuer_statistics"
    ),
    "procrastinate": "TRUNCATE bench_procrastinate.procrastinate_jobs CASCADE",
}


def with_search_path(url: str, schema: str) -> str:
    """``url`` whose sessions resolve unqualified names in ``schema``.

    procrastinate and pgqueuer create and query their tables by bare name, so
    a search_path is how each gets a schema of its own.
    """
    return make_conninfo(url, options=f"-c search_path={schema}")


def procrastinate_app(url: str, handler: Callable[..., Awaitable[None]]) -> tuple[Any, Any]:
    """A procrastinate App and its one no-op task, as its docs set them up."""
    from procrastinate import App, PsycopgConnector

    # The warning is about the procrastinate CLI importing the app by path,
    # which this script never does.
    logging.getLogger("procrastinate.blueprints").addFilter(
        lambda record: getattr(record, "action", None) != "app_defined_in___main__"
    )
    app = App(connector=PsycopgConnector(conninfo=with_search_path(url, SCHEMA_PROCRASTINATE)))
    task = app.task(name=QUEUE, queue=QUEUE)(handler)
    return app, task


# == drain children ==========================================================
#
# Each runs in a fresh interpreter (``--worker LIB``), works off the N jobs the
# parent queued, and prints one JSON line: seconds from starting the worker to
# the database showing every job finished, and the process's peak RSS.


class DrainCounter:
    """Counts handler calls; ``reached`` is set at the N-th. Written and read by handlers only."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.seen = 0
        self.reached = asyncio.Event()

    def hit(self) -> None:
        self.seen += 1
        if self.seen >= self.n:
            self.reached.set()


async def wait_until_recorded(
    watch: psycopg.AsyncConnection[Any],
    lib: str,
    counter: DrainCounter,
    describe: Callable[[], Awaitable[str]] | None = None,
) -> None:
    """Return once the handler saw N jobs and ``watch`` shows N finished in the database.

    ``watch`` is opened before the clock starts, so connecting is not timed.
    Fails when the count stops moving for STALL_TIMEOUT_S, with ``describe``'s
    account of the worker's state in the message.
    """
    try:
        await asyncio.wait_for(counter.reached.wait(), DRAIN_TIMEOUT_S)
    except TimeoutError:
        detail = await describe() if describe else ""
        raise TimeoutError(
            f"{lib}: handler saw {counter.seen} of {counter.n} jobs in {DRAIN_TIMEOUT_S}s{detail}"
        ) from None
    last, last_change = -1, time.perf_counter()
    while time.perf_counter() - last_change < STALL_TIMEOUT_S:
        cur = await watch.execute(DONE_COUNT_SQL[lib])
        row = await cur.fetchone()
        done = row[0] if row else 0
        if done >= counter.n:
            return
        if done != last:
            last, last_change = done, time.perf_counter()
        await asyncio.sleep(DONE_POLL_S)
    detail = await describe() if describe else ""
    raise TimeoutError(
        f"{lib}: handler saw all {counter.n} jobs, but only {last} were recorded finished, "
        f"with no progress for {STALL_TIMEOUT_S:.0f}s{detail}"
    )


async def open_watch(url: str) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(url, autocommit=True)


async def watch_cpu_s(watch: psycopg.AsyncConnection[Any]) -> float | None:
    """CPU seconds the watch's server process has used since it started; None if unreadable.

    Its polls (a count of every finished job, a few milliseconds each on
    10,000 rows) are the bench's, not the library's: the parent leaves them
    out of the server's CPU, as it leaves them out of the statements. The
    raw loops have no watcher. Read from /proc (schedstat: nanoseconds on a
    CPU), so only for a server on this machine.
    """
    cur = await watch.execute(f"SELECT pg_backend_pid() {WATCH_MARK}")
    row = await cur.fetchone()
    return process_cpu_s(row[0] if row else 0)


def process_cpu_s(pid: int) -> float | None:
    """The CPU seconds of process ``pid`` (/proc/PID/schedstat); None if unreadable."""
    try:
        with open(f"/proc/{pid}/schedstat", encoding="ascii") as stat:
            return int(stat.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class Timed:
    """Wall and process CPU seconds since it was made: one window for both."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def read(self) -> dict[str, float]:
        return {
            "elapsed_s": time.perf_counter() - self.wall,
            "cpu_s": time.process_time() - self.cpu,
        }


async def drain_raw(
    url: str,
    n: int,
    variant: int | None = None,
    *,
    claim: str = RAW_CLAIM,
    complete: str = RAW_COMPLETE,
) -> dict[str, Any]:
    """``variant`` claim loops at once (default 1), each on its own connection.

    A loop stops at its first empty claim: the others hold the rest.
    """
    handled = 0

    async def loop(conn: psycopg.AsyncConnection[Any]) -> None:
        nonlocal handled
        while True:
            cur = await conn.execute(claim, (QUEUE, RAW_CLAIM_BATCH))
            rows = await cur.fetchall()
            if not rows:
                break
            for _id, _data in rows:
                handled += 1  # the no-op handler
            await conn.execute(complete, ([r[0] for r in rows],))

    conns = [
        await psycopg.AsyncConnection.connect(url, autocommit=True) for _ in range(variant or 1)
    ]
    try:
        timed = Timed()
        await asyncio.gather(*(loop(c) for c in conns))
        spent = timed.read()
    finally:
        for conn in conns:
            await conn.close()
    return {**spent, "handled": handled}


async def drain_rawjob(url: str, n: int, variant: int | None = None) -> dict[str, Any]:
    """The raw loop on the copy of shoal.job (RAWJOB_CLAIM, RAWJOB_COMPLETE)."""
    return await drain_raw(url, n, variant, claim=RAWJOB_CLAIM, complete=RAWJOB_COMPLETE)


async def drain_shoal(url: str, n: int, variant: int | None = None) -> dict[str, Any]:
    from shoal import Job, Shoal

    counter = DrainCounter(n)

    async def handler(job: Job) -> None:
        counter.hit()

    boss = await Shoal.connect(url, schema=SCHEMA_SHOAL)
    watch = await open_watch(url)
    try:
        timed = Timed()
        worker = boss.work(QUEUE, handler, concurrency=CONCURRENCY)

        async def describe() -> str:
            cur = await watch.execute("SELECT state::text, count(*) FROM shoal.job GROUP BY 1")
            states = dict(await cur.fetchall())
            tasks = sorted(
                f"{t.get_name()}={'done' if t.done() else 'running'}"
                for t in asyncio.all_tasks()
                if t.get_name().startswith("shoal")
            )
            return f"; job states {states}; {worker.stats}; tasks {tasks}"

        await wait_until_recorded(watch, "shoal", counter, describe)
        spent = timed.read()
        watch_s = await watch_cpu_s(watch)
        stats = worker.stats
        pool_size = boss.db.pool.get_stats().get("pool_size", 0)
        await worker.stop()
    finally:
        await watch.close()
        await boss.close()
    return {
        **spent,
        "handled": counter.seen,
        "watch_cpu_s": watch_s,
        "pool_size": pool_size,
        "worker_stats": {
            "claimed": stats.claimed,
            "completed": stats.completed,
            "failed": stats.failed,
            "retried": stats.retried,
            "lost": stats.lost,
        },
    }


async def drain_pgqueuer(url: str, n: int, variant: int | None = None) -> dict[str, Any]:
    from pgqueuer import PgQueuer
    from pgqueuer.models import Job as PgqJob

    counter = DrainCounter(n)
    pgq_url = with_search_path(url, SCHEMA_PGQUEUER)
    async with (
        await psycopg.AsyncConnection.connect(pgq_url, autocommit=True) as conn,
        await open_watch(url) as watch,
    ):
        pgq = PgQueuer.from_psycopg_connection(conn)

        @pgq.entrypoint(QUEUE)
        async def noop(job: PgqJob) -> None:
            counter.hit()

        timed = Timed()
        run = asyncio.create_task(pgq.run(batch_size=variant or PGQ_REFERENCE_BATCH))
        try:
            await wait_until_recorded(watch, "pgqueuer", counter)
            spent = timed.read()
            watch_s = await watch_cpu_s(watch)
        finally:
            pgq.shutdown.set()
            await asyncio.wait_for(run, 30)
    return {**spent, "handled": counter.seen, "watch_cpu_s": watch_s}


async def drain_procrastinate(url: str, n: int, variant: int | None = None) -> dict[str, Any]:
    counter = DrainCounter(n)

    async def bench_noop(i: int) -> None:
        counter.hit()

    app, _task = procrastinate_app(url, bench_noop)
    async with app.open_async(), await open_watch(url) as watch:
        timed = Timed()
        run = asyncio.create_task(
            app.run_worker_async(
                queues=[QUEUE],
                concurrency=CONCURRENCY,
                wait=False,
                install_signal_handlers=False,
            )
        )
        try:
            await wait_until_recorded(watch, "procrastinate", counter)
            spent = timed.read()
            watch_s = await watch_cpu_s(watch)
        finally:
            await asyncio.wait_for(run, 30)
    return {**spent, "handled": counter.seen, "watch_cpu_s": watch_s}


# Each takes (url, n, variant): pgqueuer's batch size, or the raw loop's claimers.
DRAINS: dict[str, Callable[[str, int, int | None], Coroutine[Any, Any, dict[str, Any]]]] = {
    "raw": drain_raw,
    "rawjob": drain_rawjob,
    "shoal": drain_shoal,
    "pgqueuer": drain_pgqueuer,
    "procrastinate": drain_procrastinate,
}


def peak_rss_kib() -> int:
    """This process's VmHWM (peak resident set) in KiB.

    Not ``ru_maxrss``: on Linux that survives exec, so a child would report the
    parent's size at fork time whenever the parent was the larger.
    """
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def worker_main(lib: str, n: int, variant: int | None) -> None:
    url = os.environ[URL_ENV]
    result = asyncio.run(DRAINS[lib](url, n, variant))
    result["vm_hwm_kib"] = peak_rss_kib()
    print(json.dumps(result), flush=True)


# == the parent: setup, enqueue, drive the children ===========================


@dataclass
class Case:
    """One row of the table: a library, with fresh or stale planner statistics."""

    lib: str
    stale: bool = False
    batch: int | None = None  # pgqueuer's batch_size
    claimers: int | None = None  # the raw loop's connections
    enqueue_s: list[float] = field(default_factory=list)
    drain_s: list[float] = field(default_factory=list)
    rss_mib: list[float] = field(default_factory=list)
    sampled_rss_mib: list[float] = field(default_factory=list)
    usage: list[Usage] = field(default_factory=list)  # what the server did per drain
    worker_cpu_s: list[float] = field(default_factory=list)  # the drain child's own CPU
    watch_cpu_s: list[float] = field(default_factory=list)  # its watcher's, left out
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def variant(self) -> int | None:
        return self.batch if self.batch is not None else self.claimers

    @property
    def key(self) -> tuple[str, bool, int | None]:
        return (self.lib, self.stale, self.variant)

    @property
    def label(self) -> str:
        name = {
            "raw": f"raw psycopg x{self.claimers or 1}",
            "rawjob": f"raw on shoal.job x{self.claimers or 1}",
        }.get(self.lib, self.lib)
        if self.lib in STALE_LIBS:
            return f"{name} ({'stale' if self.stale else 'fresh'} stats)"
        if self.batch is not None:
            return f"{name} (batch_size={self.batch})"
        return name


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def rate(n: int, seconds: list[float]) -> float | None:
    m = median(seconds)
    return None if not m else n / m


class Bench:
    def __init__(
        self, admin_url: str, n: int, reps: int, libs: list[str], pg_settings: list[str]
    ) -> None:
        self.admin_url = admin_url
        self.pg_settings = pg_settings
        self.url = make_conninfo(admin_url, dbname=BENCH_DB)
        self.n = n
        self.reps = reps
        self.libs = libs
        self.payloads = [{"i": i} for i in range(n)]
        self.plans: list[tuple[str, str]] = []
        self.pg_version = ""
        self.shoal_version = shoal_version()
        self.load_at_start = os.getloadavg()
        self.machine = ""  # machine.describe()'s line, taken before the cases
        self.server = ""

    # -- setup ----------------------------------------------------------

    async def setup(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.admin_url, autocommit=True) as c:
            cur = await c.execute("SELECT version()")
            row = await cur.fetchone()
            self.pg_version = row[0] if row else "?"
            name = sql.Identifier(BENCH_DB)
            await c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
            await c.execute(sql.SQL("CREATE DATABASE {}").format(name))
            for setting in self.pg_settings:
                key, _, value = setting.partition("=")
                await c.execute(
                    sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                        name, sql.Identifier(*key.split(".")), sql.Literal(value)
                    )
                )
        self.conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        with contextlib.suppress(psycopg.Error):  # loaded only where the server preloads it
            await self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        self.meter = ServerMeter(self.conn, BENCH_DB, ignore_like=f"%{WATCH_MARK}%")
        await self.meter.open()
        for schema in (SCHEMA_RAW, SCHEMA_PROCRASTINATE, SCHEMA_PGQUEUER):
            await self.conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        await self.conn.execute(sql.SQL(RAW_SCHEMA_SQL).format(schema=sql.Identifier(SCHEMA_RAW)))

        from pgqueuer import Queries

        from shoal import Shoal

        self.boss = await Shoal.connect(self.url, schema=SCHEMA_SHOAL)
        await self.conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA_RAWJOB)))
        await self.conn.execute(
            sql.SQL(RAWJOB_SCHEMA_SQL).format(
                schema=sql.Identifier(SCHEMA_RAWJOB), shoal=sql.Identifier(SCHEMA_SHOAL)
            )
        )
        cur = await self.conn.execute(STORAGE_OPTIONS_SQL, (f"{SCHEMA_SHOAL}.job",))
        row = await cur.fetchone()
        if row is not None and row[0]:
            await self.conn.execute(
                sql.SQL("ALTER TABLE {} SET ({})").format(
                    sql.Identifier(SCHEMA_RAWJOB, "job"), sql.SQL(row[0])
                )
            )
        self.pgq_conn = await psycopg.AsyncConnection.connect(
            with_search_path(self.url, SCHEMA_PGQUEUER), autocommit=True
        )
        self.pgq = Queries.from_psycopg_connection(self.pgq_conn)
        await self.pgq.install()

        async def never_run(i: int) -> None:  # the parent only defers
            raise AssertionError("the parent process runs no procrastinate job")

        self.proc_app, self.proc_task = procrastinate_app(self.url, never_run)
        await self.proc_app.open_async()
        await self.proc_app.schema_manager.apply_schema_async()

    async def close(self) -> None:
        await self.boss.close()
        await self.proc_app.close_async()
        await self.pgq_conn.close()
        await self.conn.close()

    # -- enqueue (timed here, in the parent) -----------------------------

    async def enqueue(self, lib: str) -> float:
        payloads = self.payloads
        n = self.n
        ids: Sized
        start = time.perf_counter()
        if lib == "shoal":
            ids = await self.boss.insert([{"queue": QUEUE, "data": p} for p in payloads])
        elif lib in ("raw", "rawjob"):
            insert = RAW_INSERT if lib == "raw" else RAWJOB_INSERT
            cur = await self.conn.execute(insert, (QUEUE, [json.dumps(p) for p in payloads]))
            ids = await cur.fetchall()
        elif lib == "pgqueuer":
            ids = await self.pgq.enqueue(
                [QUEUE] * n, [json.dumps(p).encode() for p in payloads], [0] * n
            )
        elif lib == "procrastinate":
            ids = await self.proc_task.batch_defer_async(*payloads)
        else:
            raise ValueError(lib)
        elapsed = time.perf_counter() - start
        if len(ids) != n:
            raise RuntimeError(f"{lib}: enqueued {len(ids)} of {n}")
        return elapsed

    # -- planner statistics ---------------------------------------------

    async def make_stats_stale(self, lib: str) -> str:
        """Leave ``lib``'s job table analyzed while empty, autovacuum off.

        The table is filled and emptied first, and vacuumed without truncation,
        so it keeps its pages: statistics then say "N pages, 0 rows", which is
        what a drained queue table looks like to the planner. (A truncated
        table has 0 pages, and the planner then trusts the file size instead.)
        """
        table = JOB_TABLE[lib]
        await self.conn.execute(TRUNCATE_SQL[lib])
        await self.conn.execute(
            sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)").format(table)
        )
        await self.enqueue(lib)
        await self.conn.execute(sql.SQL("DELETE FROM {}").format(table))
        await self.conn.execute(sql.SQL("VACUUM (ANALYZE, TRUNCATE false) {}").format(table))
        return await self.table_stats(lib)

    async def restore_autovacuum(self, lib: str) -> None:
        await self.conn.execute(
            sql.SQL("ALTER TABLE {} RESET (autovacuum_enabled)").format(JOB_TABLE[lib])
        )

    async def table_stats(self, lib: str) -> str:
        cur = await self.conn.execute(
            "SELECT relpages, reltuples FROM pg_class WHERE oid = %s::regclass",
            (JOB_TABLE[lib].as_string(self.conn),),
        )
        row = await cur.fetchone()
        assert row is not None
        return f"pg_class: relpages={row[0]} reltuples={row[1]:.0f}"

    async def explain_claim(self, lib: str, label: str) -> None:
        """Record the plan of ``lib``'s claim as the drain will meet it."""
        if lib in ("raw", "rawjob"):
            claim = RAW_CLAIM if lib == "raw" else RAWJOB_CLAIM
            cur = await self.conn.execute("EXPLAIN " + claim, (QUEUE, RAW_CLAIM_BATCH))
            plan = "\n".join(r[0] for r in await cur.fetchall())
        elif lib == "shoal":
            plan = await self.explain_shoal_claim()
        else:
            return
        self.plans.append((f"{label}; {await self.table_stats(lib)}", plan))

    async def explain_shoal_claim(self) -> str:
        """The plan of the statements inside ``shoal.claim_jobs_v5``, via auto_explain.

        A plain EXPLAIN of the function call shows only "Function Scan". With
        log_nested_statements, auto_explain reports the inner UPDATE, at NOTICE
        so it reaches this client. The claim runs for real, so it is rolled back.
        """
        notices: list[str] = []

        def on_notice(diag: psycopg.errors.Diagnostic) -> None:
            if diag.message_primary:
                notices.append(diag.message_primary)

        async with await psycopg.AsyncConnection.connect(self.url) as conn:
            conn.add_notice_handler(on_notice)
            try:
                await conn.execute("LOAD 'auto_explain'")
            except psycopg.Error as exc:
                return f"(auto_explain not available: {exc})"
            for setting, value in (
                ("auto_explain.log_min_duration", "0"),
                ("auto_explain.log_nested_statements", "on"),
                ("auto_explain.log_analyze", "on"),
                ("auto_explain.log_timing", "off"),
                ("auto_explain.log_level", "notice"),
            ):
                await conn.execute("SELECT set_config(%s, %s, false)", (setting, value))
            await conn.execute(
                "SELECT count(*) FROM shoal.claim_jobs_v5(%s, 20, NULL, NULL, NULL, NULL)", (QUEUE,)
            )
            await conn.rollback()
        # Every statement is reported; keep the plan (not the query text) of the
        # function's UPDATE, which is the one that starts "Update on".
        for notice in notices:
            lines = notice.splitlines()
            for i, line in enumerate(lines):
                if line.startswith("Update on"):
                    return "\n".join(lines[i:])
        return "(no plan reported)"

    # -- drains (timed in a child) ---------------------------------------

    async def drain(self, lib: str, variant: int | None) -> dict[str, Any]:
        env = dict(os.environ, **{URL_ENV: self.url})
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            SCRIPT,
            "--worker",
            lib,
            "--n",
            str(self.n),
            *(["--variant", str(variant)] if variant else []),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        sampled = 0
        ps = psutil.Process(proc.pid)
        communicate = asyncio.ensure_future(proc.communicate())
        while not communicate.done():
            with contextlib.suppress(psutil.NoSuchProcess):  # it may exit between polls
                sampled = max(sampled, ps.memory_info().rss)
            await asyncio.wait({communicate}, timeout=RSS_SAMPLE_S)
        out, err = communicate.result()
        orphans = await self.cancel_orphaned_statements()
        if proc.returncode != 0:
            log_path = save_stderr(lib, err)
            last = err.decode(errors="replace").strip().splitlines()[-1:]
            raise RuntimeError(
                f"{lib} drain exited {proc.returncode}: {' '.join(last)}{orphans} "
                f"(its stderr: {log_path})"
            )
        result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
        result["sampled_rss_bytes"] = sampled
        if result["handled"] < self.n:
            raise RuntimeError(f"{lib}: handler saw {result['handled']} of {self.n} jobs")
        stderr = err.decode(errors="replace").strip() + orphans
        if stderr:
            result["stderr"] = stderr[-2000:]
        return result

    async def sessions(self) -> list[int]:
        cur = await self.conn.execute(
            f"SELECT pid FROM pg_stat_activity WHERE datname = %s {WATCH_MARK}", (BENCH_DB,)
        )
        return [r[0] for r in await cur.fetchall()]

    async def wait_for_child_sessions(self, parent: list[int]) -> None:
        """Wait until the sessions not in ``parent`` have ended (their statistics are then in)."""
        deadline = time.perf_counter() + 10
        while time.perf_counter() < deadline:
            if not set(await self.sessions()) - set(parent):
                return
            await asyncio.sleep(0.02)

    async def cancel_orphaned_statements(self) -> str:
        """Cancel statements still running for a drain child that has exited.

        A client that abandons a statement by closing its socket does not stop
        the server: the backend runs the statement to its end, and on two
        cores that would slow every later measurement. Only the child's
        statements can be running here; the parent's connections are idle.
        """
        cur = await self.conn.execute(
            "SELECT pid, left(query, 60) FROM pg_stat_activity"
            f" WHERE datname = %s AND state = 'active' AND pid <> pg_backend_pid() {WATCH_MARK}",
            (BENCH_DB,),
        )
        rows = await cur.fetchall()
        for pid, _query in rows:
            await self.conn.execute("SELECT pg_cancel_backend(%s)", (pid,))
        if not rows:
            return ""
        queries = "; ".join(" ".join(q.split()) for _pid, q in rows)
        return f"\n(cancelled {len(rows)} statement(s) running after the child exited: {queries})"

    async def interleaved_enqueues(self, libs: list[str], rounds: int) -> dict[str, list[float]]:
        """Each library's enqueue ``rounds`` times, the libraries taking turns.

        One enqueue of 10,000 jobs takes a fifth of a second, most of it the
        commit's WAL flush, and a drain repetition times only one: the
        machine's moment decides that ratio more than the code. Here the
        libraries take turns, in alternating order, each into an emptied
        table after a checkpoint, so each round's pair meets the same moment.
        """
        times: dict[str, list[float]] = {lib: [] for lib in libs}
        for lib in libs:
            await self.warm_up(lib)
        for round_ in range(rounds):
            for lib in libs if round_ % 2 == 0 else libs[::-1]:
                await self.conn.execute(TRUNCATE_SQL[lib])
                await self.conn.execute("CHECKPOINT")
                times[lib].append(await self.enqueue(lib))
        return times

    async def warm_up(self, lib: str) -> None:
        """One untimed enqueue: the first call on a connection pays for catalog
        lookups and statement preparation that later calls do not."""
        await self.conn.execute(TRUNCATE_SQL[lib])
        await self.enqueue(lib)

    async def run_rep(self, case: Case, rep: int) -> None:
        """One repetition of ``case``: enqueue N jobs, then drain them in a child."""
        lib = case.lib
        # A checkpoint before the jobs arrive: the drain then modifies no
        # page for the first time since a checkpoint, so its WAL holds no
        # full-page images unless a timed checkpoint falls inside it
        # (counted: "FPI" in the per-job table).
        await self.conn.execute("CHECKPOINT")
        if case.stale:
            stats = await self.make_stats_stale(lib)
        else:
            await self.conn.execute(TRUNCATE_SQL[lib])
        case.enqueue_s.append(await self.enqueue(lib))
        if not case.stale:
            # Fresh: statistics that know the N waiting jobs are there.
            await self.conn.execute(sql.SQL("ANALYZE {}").format(JOB_TABLE[lib]))
            stats = await self.table_stats(lib)
        if rep == 0 and (lib == "rawjob" or (case.claimers or 1) == 1):
            await self.explain_claim(lib, case.label)
        parent = await self.sessions()
        before = await self.meter.sample()
        result = await self.drain(lib, case.variant)
        await self.wait_for_child_sessions(parent)
        usage = await self.meter.since(before)
        watch_s = result.get("watch_cpu_s")
        if usage.cpu_s is not None and watch_s is not None:
            # The drain's watcher is the bench's (see watch_cpu_s).
            usage = dataclasses.replace(usage, cpu_s=usage.cpu_s - watch_s)
            case.watch_cpu_s.append(watch_s)
        case.usage.append(usage)
        case.drain_s.append(result["elapsed_s"])
        case.worker_cpu_s.append(result["cpu_s"])
        case.rss_mib.append(result["vm_hwm_kib"] / 1024)
        case.sampled_rss_mib.append(result["sampled_rss_bytes"] / 2**20)
        extra = f" {per_job(usage, self.n)}, worker CPU {result['cpu_s'] / self.n * 1e6:.0f} us/job"
        if "worker_stats" in result:
            extra += f" worker.stats={result['worker_stats']} pool={result['pool_size']}"
        if "stderr" in result:
            case.notes.append(f"rep {rep + 1} stderr: {result['stderr'][-500:]}")
        print(
            f"  {case.label:<31} rep {rep + 1}: enqueue {case.enqueue_s[-1] * 1000:7.1f} ms"
            f"  drain {result['elapsed_s']:6.2f} s  peak RSS {case.rss_mib[-1]:5.1f} MiB"
            f"  load {os.getloadavg()[0]:.2f}  [{stats}]{extra}",
            flush=True,
        )

    async def run_cases(self, cases: list[Case]) -> None:
        """Every case's repetitions, the cases taking turns.

        Repetition r of every case runs before repetition r + 1 of any, in
        alternating order, so the cases compared in a round meet the same
        moment of the machine (its disk's flush time and its neighbours moved
        drain rates by a third between runs of the same code): the per-round
        ratios (round_report) then compare like with like.
        """
        for lib in dict.fromkeys(case.lib for case in cases):
            await self.warm_up(lib)
        for rep in range(self.reps):
            for case in cases if rep % 2 == 0 else cases[::-1]:
                if case.error:
                    continue
                try:
                    await self.run_rep(case, rep)
                except Exception as exc:  # one library failing must not hide the others' rows
                    case.error = f"{type(exc).__name__}: {exc}"
                    print(f"  {case.label}: FAILED: {case.error}", flush=True)
        for case in cases:
            if case.stale:
                await self.restore_autovacuum(case.lib)


def shoal_version() -> str:
    """The commit of the shoal checkout measured, marked when the tree has edits."""
    import shoal

    root = os.path.dirname(os.path.dirname(os.path.abspath(shoal.__file__)))
    try:
        described = subprocess.run(
            ["git", "-C", root, "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return f"{root} (not a git checkout)"
    return f"{root} at {described.stdout.strip()}"


def save_stderr(lib: str, err: bytes) -> str:
    """Keep a failed drain child's whole stderr (its warnings come before the traceback)."""
    path = os.path.join(tempfile.gettempdir(), f"shoal_bench_{lib}_drain.stderr")
    with open(path, "wb") as f:
        f.write(err)
    return path


def fmt_rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def fmt_ratio(value: float | None, base: float | None) -> str:
    return "n/a" if value is None or not base else f"{value / base:.2f}x"


def per_job(usage: Usage, n: int) -> str:
    cpu = "n/a" if usage.cpu_s is None else f"{usage.cpu_s / n * 1e6:.0f} us"
    return (
        f"WAL {usage.wal_bytes / n:,.0f} B/job (FPI {usage.wal_fpi}), "
        f"{usage.statements / n:.4f} statements/job, server CPU {cpu}/job"
    )


def median_of(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def report(bench: Bench, cases: list[Case]) -> str:
    n = bench.n
    by_key = {c.key: c for c in cases}

    def good(lib: str, stale: bool, variant: int | None = None) -> Case | None:
        c = by_key.get((lib, stale, variant))
        return None if c is None or c.error else c

    def rates(c: Case | None) -> tuple[float | None, float | None]:
        return (None, None) if c is None else (rate(n, c.enqueue_s), rate(n, c.drain_s))

    load = ", ".join(f"{x:.2f}" for x in bench.load_at_start)
    lines = [
        f"N = {n:,} jobs; repetitions = {bench.reps} (median shown); "
        f"os.cpu_count() = {os.cpu_count()}; load average at start {load}",
        bench.machine,
        f"server: {bench.server}",
        f"Postgres: {bench.pg_version}",
        f"shoal: {bench.shoal_version}",
        *(f"diagnostic setting for every session: {s}" for s in bench.pg_settings),
        "",
        f"| case | enqueue jobs/s | drain jobs/s | enqueue vs raw | drain vs raw x1 "
        f"| drain vs raw x{RAW_CLAIMERS} | vs pgqueuer (enqueue / drain) | worker peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    pgq_enq, pgq_drain = rates(good("pgqueuer", False, PGQ_REFERENCE_BATCH))
    for c in cases:
        if c.error:
            lines.append(f"| {c.label} | error | error | | | | | |")
            continue
        enq, drain = rates(c)
        # Compare like with like: a stale-statistics row against raw with stale statistics.
        raw_enq, raw_drain = rates(good("raw", c.stale, 1))
        _, raw_n_drain = rates(good("raw", c.stale, RAW_CLAIMERS))
        rss = median(c.rss_mib)
        lines.append(
            f"| {c.label} | {fmt_rate(enq)} | {fmt_rate(drain)} "
            f"| {fmt_ratio(enq, raw_enq)} | {fmt_ratio(drain, raw_drain)} "
            f"| {fmt_ratio(drain, raw_n_drain)} "
            f"| {fmt_ratio(enq, pgq_enq)} / {fmt_ratio(drain, pgq_drain)} "
            f"| {'n/a' if rss is None else f'{rss:.1f}'} |"
        )
    lines += [
        "",
        "Rows with stale statistics are compared with raw psycopg (stale stats); "
        f"'vs pgqueuer' is against pgqueuer (batch_size={PGQ_REFERENCE_BATCH}).",
        "",
        "Per job drained (median of the repetitions; WAL: pg_current_wal_insert_lsn() "
        "difference, the whole server's; FPI: full-page images in it, summed; statements: "
        f"{next((c.usage[0].statements_source for c in cases if c.usage), 'n/a')}, without the "
        "drain's watcher; server CPU: user+system seconds of the postmaster and all its "
        "processes, live and exited, via /proc, without the drain's watcher: "
        + (
            ", ".join(
                f"{c.label} {median_of([w / n * 1e6 for w in c.watch_cpu_s]) or 0:.1f} us/job"
                for c in cases
                if c.watch_cpu_s
            )
            or "none"
        )
        + " left out; the raw loops have none):",
        "",
        "| case | WAL bytes/job | vs raw x1 | FPI | statements/job | vs raw x1 "
        f"| server CPU us/job | vs raw x1 | vs raw x{RAW_CLAIMERS} | statement time us/job "
        f"| worker CPU us/job | all CPU us/job | vs raw x{RAW_CLAIMERS} |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def units(c: Case) -> tuple[float | None, float | None, float | None, float | None, int]:
        return (
            median_of([u.wal_bytes / n for u in c.usage]),
            median_of([u.statements / n for u in c.usage]),
            median_of([None if u.cpu_s is None else u.cpu_s / n * 1e6 for u in c.usage]),
            median_of([None if u.exec_ms is None else u.exec_ms / n * 1e3 for u in c.usage]),
            sum(u.wal_fpi for u in c.usage),
        )

    def cpus(c: Case | None) -> tuple[float | None, float | None]:
        """The drain child's CPU and all CPU (server's and child's), us per job: medians."""
        if c is None:
            return None, None
        return (
            median_of([s / n * 1e6 for s in c.worker_cpu_s]),
            median_of(all_cpu_per_job(c, n)),
        )

    def num(value: float | None, fmt: str) -> str:
        return "n/a" if value is None else format(value, fmt)

    for c in cases:
        if c.error or not c.usage:
            continue
        wal, stmts, cpu, exec_us, fpi = units(c)
        raw = good("raw", c.stale, 1)
        raw_n = good("raw", c.stale, RAW_CLAIMERS)
        rwal, rstmts, rcpu, _, _ = units(raw) if raw and raw.usage else (None,) * 5
        rcpu_n = units(raw_n)[2] if raw_n and raw_n.usage else None
        worker, everything = cpus(c)
        lines.append(
            f"| {c.label} | {num(wal, ',.0f')} | {fmt_ratio(wal, rwal)} | {fpi} "
            f"| {num(stmts, '.4f')} | {fmt_ratio(stmts, rstmts)} "
            f"| {num(cpu, ',.0f')} | {fmt_ratio(cpu, rcpu)} | {fmt_ratio(cpu, rcpu_n)} "
            f"| {num(exec_us, ',.1f')} | {num(worker, ',.0f')} | {num(everything, ',.0f')} "
            f"| {fmt_ratio(everything, cpus(raw_n)[1])} |"
        )
    lines += [
        "",
        "Worker CPU: the drain child's own user+system seconds over the timed drain "
        "(time.process_time). All CPU: the server's and the worker's together. On a "
        "machine whose cores the drain keeps busy, the rates compare about as the "
        "inverse of all CPU per job; where it waits on commits, they do not.",
    ]
    lines += [
        "",
        "Drain seconds per repetition:",
        *(f"- {c.label}: {', '.join(f'{x:.2f}' for x in c.drain_s)}" for c in cases if c.drain_s),
    ]
    tops = [(c, c.usage[-1].top) for c in cases if c.usage and c.usage[-1].top]
    if tops:
        lines += ["", "Statements of the last drain, most WAL first (per job: calls, WAL bytes):"]
        for c, top in tops:
            lines.append(f"- {c.label}:")
            for query, calls, _ms, wal in top[:4]:
                lines.append(f"    {calls / n:.4f} calls, {wal / n:,.0f} B: {query[:110]}")
    return "\n".join(lines)


def round_report(cases: list[Case], n: int) -> str:
    """shoal against the raw loops, round by round: drain rate, server and all CPU per job."""
    lines = [
        "",
        "shoal against the raw loops in the same round (the cases take turns; "
        "median, lowest, highest):",
    ]
    by_key = {case.key: case for case in cases if not case.error}
    for stale in (False, True):
        shoal = by_key.get(("shoal", stale, None))
        raw1, raw2 = by_key.get(("raw", stale, 1)), by_key.get(("raw", stale, RAW_CLAIMERS))
        if shoal is None or raw1 is None or raw2 is None:
            continue
        drains = sorted(r / s for r, s in zip(raw2.drain_s, shoal.drain_s, strict=False))
        label = "stale stats" if stale else "fresh stats"
        if drains:
            lines.append(
                f"- {label}: drain vs raw x{RAW_CLAIMERS} {spread(drains)}"
                f"; server CPU per job vs raw x1 {spread(server_ratios(shoal, raw1))}"
                f", vs raw x{RAW_CLAIMERS} {spread(server_ratios(shoal, raw2))}"
                f"; all CPU per job vs raw x{RAW_CLAIMERS} "
                f"{spread(ratios(all_cpu_per_job(shoal, n), all_cpu_per_job(raw2, n)))}"
            )
        rawjob = by_key.get(("rawjob", stale, RAW_CLAIMERS))
        if rawjob is not None:
            lines.append(
                f"- {label}, against the raw loop x{RAW_CLAIMERS} on a copy of shoal.job: "
                f"drain {spread(ratios(list(rawjob.drain_s), list(shoal.drain_s)))}"
                f"; server CPU per job {spread(server_ratios(shoal, rawjob))}"
                f"; all CPU per job "
                f"{spread(ratios(all_cpu_per_job(shoal, n), all_cpu_per_job(rawjob, n)))}"
                f" (the copy's own against raw x{RAW_CLAIMERS}: all CPU "
                f"{spread(ratios(all_cpu_per_job(rawjob, n), all_cpu_per_job(raw2, n)))})"
            )
    return "\n".join(lines)


def all_cpu_per_job(case: Case, n: int) -> list[float | None]:
    """Each repetition's server and drain-child CPU together, us per job (None: unknown)."""
    return [
        None if u.cpu_s is None else (u.cpu_s + w) / n * 1e6
        for u, w in zip(case.usage, case.worker_cpu_s, strict=False)
    ]


def ratios(ours: list[float | None], theirs: list[float | None]) -> list[float]:
    """Round by round, ours / theirs, where both are known."""
    return sorted(o / t for o, t in zip(ours, theirs, strict=False) if o is not None and t)


def server_ratios(ours: Case, theirs: Case) -> list[float]:
    return ratios([u.cpu_s for u in ours.usage], [u.cpu_s for u in theirs.usage])


def spread(values: list[float]) -> str:
    """Median (lowest-highest) of sorted ratios."""
    if not values:
        return "n/a"
    return f"{statistics.median(values):.2f}x ({values[0]:.2f}x-{values[-1]:.2f}x)"


def enqueue_report(times: dict[str, list[float]], n: int) -> str:
    """The interleaved enqueues: each library's median, and its rate against raw's by round."""
    raw = times["raw"]
    lines = [
        "",
        f"Enqueue of {n:,} jobs, the libraries taking turns ({len(raw)} rounds, "
        "each after a checkpoint into an emptied table): median ms, and the rate against "
        "the raw insert's in the same round (median, lowest, highest):",
    ]
    for lib, seconds in times.items():
        ratios = sorted(r / s for r, s in zip(raw, seconds, strict=True))
        lines.append(
            f"- {lib}: {statistics.median(seconds) * 1000:.1f} ms; "
            f"vs raw {statistics.median(ratios):.2f}x "
            f"({ratios[0]:.2f}x-{ratios[-1]:.2f}x)"
        )
    return "\n".join(lines)


def cases_of(lib: str, stale: bool = False) -> list[Case]:
    if lib == "pgqueuer":
        return [Case(lib, batch=b) for b in PGQ_BATCH_SIZES]
    if lib == "raw":
        return [Case(lib, stale, claimers=c) for c in (1, RAW_CLAIMERS)]
    if lib == "rawjob":  # the baseline of the two-claimer comparisons only
        return [Case(lib, stale, claimers=RAW_CLAIMERS)]
    return [Case(lib, stale)]


async def main_async(args: argparse.Namespace) -> int:
    own = None
    admin_url = os.environ.get("DATABASE_URL") or DEFAULT_URL
    if args.slow_commits and args.server != "own":
        raise SystemExit("--slow-commits needs --server own (the bench's own cluster)")
    if args.server == "own":
        own = OwnServer(own_server_settings(args.slow_commits), prefix="shoal-queue-bench-")
        own.start()
        admin_url = own.url
    try:
        return await run_bench(args, admin_url, own.describe() if own else "DATABASE_URL's")
    finally:
        if own is not None:
            own.stop()


async def run_bench(args: argparse.Namespace, admin_url: str, server: str) -> int:
    libs = [lib.strip() for lib in args.libs.split(",") if lib.strip()]
    unknown = set(libs) - set(LIBS)
    if unknown:
        raise SystemExit(f"--libs: unknown {sorted(unknown)}; choose from {', '.join(LIBS)}")
    reps = 1 if args.quick else args.reps
    bench = Bench(admin_url, args.n, reps, libs, args.pg_setting)
    bench.server = server
    host = conninfo_to_dict(admin_url).get("host", "local socket")
    print(f"shoal queue bench: N={args.n}, reps={reps}, server {host}, db {BENCH_DB}", flush=True)
    print(f"server: {server}", flush=True)
    bench.machine = describe(admin_url)
    print(bench.machine, flush=True)
    await bench.setup()
    cases = [case for lib in LIBS if lib in libs for case in cases_of(lib)]
    cases += [case for lib in STALE_LIBS if lib in libs for case in cases_of(lib, stale=True)]
    started = time.perf_counter()
    enqueues: dict[str, list[float]] = {}
    try:
        await bench.run_cases(cases)
        if args.enqueue_rounds and "raw" in libs and len(libs) > 1:
            enqueues = await bench.interleaved_enqueues(libs, args.enqueue_rounds)
    finally:
        await bench.close()
    print(f"\n(measured in {time.perf_counter() - started:.0f} s)\n")
    print(report(bench, cases))
    print(round_report(cases, args.n))
    if enqueues:
        print(enqueue_report(enqueues, args.n))
    print("\nSettings:")
    for lib in libs:
        print(f"- {lib}: {SETTINGS[lib]}")
    print(
        "- drain time: from starting the worker (in its own process, after imports and "
        "connecting) until the database shows all N jobs finished"
    )
    print(
        "- worker peak RSS: the drain process's VmHWM; "
        + ", ".join(
            f"{c.label} sampled max {median(c.sampled_rss_mib) or 0:.1f}"
            for c in cases
            if c.sampled_rss_mib
        )
    )
    for case in cases:
        for note in case.notes:
            print(f"- note, {case.label}: {note}")
        if case.error:
            print(f"- error, {case.label}: {case.error}")
    if bench.plans:
        print("\nClaim plans:")
        for label, plan in bench.plans:
            print(f"\n-- {label}\n{plan}")
    return 1 if any(c.error for c in cases) else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--n", type=int, default=10_000, help="jobs per measurement")
    parser.add_argument("--quick", action="store_true", help="one repetition instead of 3")
    parser.add_argument("--reps", type=int, default=3, help=argparse.SUPPRESS)
    parser.add_argument(
        "--enqueue-rounds",
        type=int,
        default=9,
        help="interleaved enqueues of every library after the drains (0: none)",
    )
    parser.add_argument(
        "--libs", default=",".join(LIBS), help=f"comma-separated subset of {','.join(LIBS)}"
    )
    parser.add_argument(
        "--pg-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="diagnostic: ALTER DATABASE shoal_bench SET NAME = VALUE (repeatable)",
    )
    parser.add_argument(
        "--server",
        choices=("own", "url"),
        default="own",
        help="own (default): a throwaway cluster of the machine's PostgreSQL, so WAL and "
        "server CPU are the bench's alone; url: DATABASE_URL's server as it is",
    )
    add_slow_commits_option(parser)
    parser.add_argument("--worker", choices=LIBS, help=argparse.SUPPRESS)  # a drain child
    # The child's pgqueuer batch size, or its raw loop's claimers.
    parser.add_argument("--variant", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker_main(args.worker, args.n, args.variant)
        return
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
