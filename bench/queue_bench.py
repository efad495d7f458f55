"""Queue (Level 1) benchmark: shoal beside procrastinate, pgqueuer and raw psycopg.

    .venv/bin/python bench/queue_bench.py            # 3 repetitions, median reported
    .venv/bin/python bench/queue_bench.py --quick    # 1 repetition
    .venv/bin/python bench/queue_bench.py --n 20000 --libs shoal,raw

What it measures, all in one run against one Postgres server:

- enqueue: N jobs in one call of each library's batch API, timed in this
  process (turning the payloads into the library's input is inside the timing);
- drain: the same N no-op jobs worked off by one worker at concurrency 10, in a
  child process of its own (so its peak RSS is its own), timed from the moment
  the worker is started until the database shows every job finished;
- stale planner statistics (shoal and raw only): the job table is analyzed
  while it holds no rows, with autovacuum off, before the N jobs arrive.

The database named by DATABASE_URL (default: the local server) is only used to
drop and create ``shoal_bench``; every library gets a schema of its own there.
This is a measurement script, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import psutil
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
BENCH_DB = "shoal_bench"
QUEUE = "bench_noop"
CONCURRENCY = 10
# The raw baseline claims this many jobs per statement (the figure).
RAW_CLAIM_BATCH = 100
# pgqueuer's own default batch size (PgQueuer.run(batch_size=10)).
PGQ_BATCH_SIZE = 10
# How often a drain child looks at the database once its handler has seen N jobs.
DONE_POLL_S = 0.002
# A drain that takes longer than this is reported as failed, not waited for.
DRAIN_TIMEOUT_S = 180.0
# How often the parent samples a child's RSS (the child also reports VmHWM).
RSS_SAMPLE_S = 0.02
# The child passes the connection string through the environment, not argv,
# so a password in DATABASE_URL never shows in the process list.
URL_ENV = "SHOAL_BENCH_URL"

SCHEMA_SHOAL = "shoal"
SCHEMA_RAW = "bench_raw"
SCHEMA_PROCRASTINATE = "bench_procrastinate"
SCHEMA_PGQUEUER = "bench_pgqueuer"

LIBS = ("raw", "shoal", "pgqueuer", "procrastinate")
# Libraries measured a second time with planner statistics taken on an empty table.
STALE_LIBS = ("raw", "shoal")

SETTINGS = {
    "raw": (
        f"one connection; claim {RAW_CLAIM_BATCH} per UPDATE ... WHERE id IN (SELECT ... "
        "FOR UPDATE SKIP LOCKED LIMIT n) RETURNING, then complete them in one UPDATE"
    ),
    "shoal": f"boss.work(queue, handler, concurrency={CONCURRENCY}) (batch_size default)",
    "pgqueuer": (
        f"PgQueuer.from_psycopg_connection(conn).run(batch_size={PGQ_BATCH_SIZE}); "
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

RAW_INSERT = f"""
INSERT INTO {SCHEMA_RAW}.job (queue, data)
SELECT %s, d FROM unnest(%s::jsonb[]) AS d
RETURNING id
"""

RAW_CLAIM = f"""
UPDATE {SCHEMA_RAW}.job
SET state = 'running', attempt = attempt + 1, started_at = now()
WHERE id IN (
    SELECT id FROM {SCHEMA_RAW}.job
    WHERE queue = %s AND state = 'queued'
    ORDER BY id
    LIMIT %s
    FOR UPDATE SKIP LOCKED)
RETURNING id, data
"""

RAW_COMPLETE = f"""
UPDATE {SCHEMA_RAW}.job SET state = 'done', finished_at = now()
WHERE id = ANY(%s) AND state = 'running'
"""

# What "every job finished" looks like in each library's tables.
DONE_COUNT_SQL = {
    "raw": f"SELECT count(*) FROM {SCHEMA_RAW}.job WHERE state = 'done'",
    "shoal": f"SELECT count(*) FROM {SCHEMA_SHOAL}.job WHERE state = 'completed'",
    # pgqueuer deletes a finished job from its queue table and logs it.
    "pgqueuer": (
        f"SELECT count(*) FROM {SCHEMA_PGQUEUER}.pgqueuer_log WHERE status = 'successful'"
    ),
    "procrastinate": (
        f"SELECT count(*) FROM {SCHEMA_PROCRASTINATE}.procrastinate_jobs "
        "WHERE status = 'succeeded'"
    ),
}

# The table whose statistics the drain's claim is planned with.
JOB_TABLE = {
    "raw": f"{SCHEMA_RAW}.job",
    "shoal": f"{SCHEMA_SHOAL}.job",
    "pgqueuer": f"{SCHEMA_PGQUEUER}.pgqueuer",
    "procrastinate": f"{SCHEMA_PROCRASTINATE}.procrastinate_jobs",
}

TRUNCATE_SQL = {
    "raw": f"TRUNCATE {SCHEMA_RAW}.job",
    "shoal": f"TRUNCATE {SCHEMA_SHOAL}.job, {SCHEMA_SHOAL}.job_archive",
    "pgqueuer": (
        f"TRUNCATE {SCHEMA_PGQUEUER}.pgqueuer, {SCHEMA_PGQUEUER}.pgqueuer_log, "
        f"{SCHEMA_PGQUEUER}.pgqueuer_statistics"
    ),
    "procrastinate": f"TRUNCATE {SCHEMA_PROCRASTINATE}.procrastinate_jobs CASCADE",
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


async def wait_until_recorded(url: str, lib: str, counter: DrainCounter) -> None:
    """Return once the handler saw N jobs and the database shows N finished."""
    await asyncio.wait_for(counter.reached.wait(), DRAIN_TIMEOUT_S)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        deadline = time.perf_counter() + DRAIN_TIMEOUT_S
        while time.perf_counter() < deadline:
            cur = await conn.execute(DONE_COUNT_SQL[lib])
            row = await cur.fetchone()
            if row is not None and row[0] >= counter.n:
                return
            await asyncio.sleep(DONE_POLL_S)
    raise TimeoutError(f"{lib}: jobs not recorded finished within {DRAIN_TIMEOUT_S}s")


async def drain_raw(url: str, n: int) -> dict[str, Any]:
    handled = 0
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        start = time.perf_counter()
        while True:
            cur = await conn.execute(RAW_CLAIM, (QUEUE, RAW_CLAIM_BATCH))
            rows = await cur.fetchall()
            if not rows:
                break
            for _id, _data in rows:
                handled += 1  # the no-op handler
            await conn.execute(RAW_COMPLETE, ([r[0] for r in rows],))
        elapsed = time.perf_counter() - start
    return {"elapsed_s": elapsed, "handled": handled}


async def drain_shoal(url: str, n: int) -> dict[str, Any]:
    from shoal import Job, Shoal

    counter = DrainCounter(n)

    async def handler(job: Job) -> None:
        counter.hit()

    boss = await Shoal.connect(url, schema=SCHEMA_SHOAL)
    try:
        start = time.perf_counter()
        worker = boss.work(QUEUE, handler, concurrency=CONCURRENCY)
        await wait_until_recorded(url, "shoal", counter)
        elapsed = time.perf_counter() - start
        stats = worker.stats
        await worker.stop()
    finally:
        await boss.close()
    return {
        "elapsed_s": elapsed,
        "handled": counter.seen,
        "worker_stats": {
            "claimed": stats.claimed,
            "completed": stats.completed,
            "failed": stats.failed,
            "retried": stats.retried,
            "lost": stats.lost,
        },
    }


async def drain_pgqueuer(url: str, n: int) -> dict[str, Any]:
    from pgqueuer import PgQueuer
    from pgqueuer.models import Job as PgqJob

    counter = DrainCounter(n)
    pgq_url = with_search_path(url, SCHEMA_PGQUEUER)
    async with await psycopg.AsyncConnection.connect(pgq_url, autocommit=True) as conn:
        pgq = PgQueuer.from_psycopg_connection(conn)

        @pgq.entrypoint(QUEUE)
        async def noop(job: PgqJob) -> None:
            counter.hit()

        start = time.perf_counter()
        run = asyncio.create_task(pgq.run(batch_size=PGQ_BATCH_SIZE))
        try:
            await wait_until_recorded(url, "pgqueuer", counter)
            elapsed = time.perf_counter() - start
        finally:
            pgq.shutdown.set()
            await asyncio.wait_for(run, 30)
    return {"elapsed_s": elapsed, "handled": counter.seen}


async def drain_procrastinate(url: str, n: int) -> dict[str, Any]:
    counter = DrainCounter(n)

    async def bench_noop(i: int) -> None:
        counter.hit()

    app, _task = procrastinate_app(url, bench_noop)
    async with app.open_async():
        start = time.perf_counter()
        run = asyncio.create_task(
            app.run_worker_async(
                queues=[QUEUE],
                concurrency=CONCURRENCY,
                wait=False,
                install_signal_handlers=False,
            )
        )
        try:
            await wait_until_recorded(url, "procrastinate", counter)
            elapsed = time.perf_counter() - start
        finally:
            await asyncio.wait_for(run, 30)
    return {"elapsed_s": elapsed, "handled": counter.seen}


DRAINS: dict[str, Callable[[str, int], Awaitable[dict[str, Any]]]] = {
    "raw": drain_raw,
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


def worker_main(lib: str, n: int) -> None:
    url = os.environ[URL_ENV]
    result = asyncio.run(DRAINS[lib](url, n))
    result["vm_hwm_kib"] = peak_rss_kib()
    print(json.dumps(result), flush=True)


# == the parent: setup, enqueue, drive the children ===========================


@dataclass
class Case:
    """One row of the table: a library, with fresh or stale planner statistics."""

    lib: str
    stale: bool = False
    enqueue_s: list[float] = field(default_factory=list)
    drain_s: list[float] = field(default_factory=list)
    rss_mib: list[float] = field(default_factory=list)
    sampled_rss_mib: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def label(self) -> str:
        name = "raw psycopg" if self.lib == "raw" else self.lib
        if self.lib in STALE_LIBS:
            return f"{name} ({'stale' if self.stale else 'fresh'} stats)"
        return name


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def rate(n: int, seconds: list[float]) -> float | None:
    m = median(seconds)
    return None if not m else n / m


class Bench:
    def __init__(self, admin_url: str, n: int, reps: int, libs: list[str]) -> None:
        self.admin_url = admin_url
        self.url = make_conninfo(admin_url, dbname=BENCH_DB)
        self.n = n
        self.reps = reps
        self.libs = libs
        self.payloads = [{"i": i} for i in range(n)]
        self.plans: list[tuple[str, str]] = []
        self.pg_version = ""

    # -- setup ----------------------------------------------------------

    async def setup(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.admin_url, autocommit=True) as c:
            cur = await c.execute("SELECT version()")
            row = await cur.fetchone()
            self.pg_version = row[0] if row else "?"
            name = sql.Identifier(BENCH_DB)
            await c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
            await c.execute(sql.SQL("CREATE DATABASE {}").format(name))
        self.conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        for schema in (SCHEMA_RAW, SCHEMA_PROCRASTINATE, SCHEMA_PGQUEUER):
            await self.conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        await self.conn.execute(
            sql.SQL(RAW_SCHEMA_SQL).format(schema=sql.Identifier(SCHEMA_RAW))  # type: ignore[arg-type]  # constant text
        )

        from pgqueuer import Queries
        from shoal import Shoal

        self.boss = await Shoal.connect(self.url, schema=SCHEMA_SHOAL)
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
        start = time.perf_counter()
        if lib == "shoal":
            ids = await self.boss.insert([{"queue": QUEUE, "data": p} for p in payloads])
        elif lib == "raw":
            cur = await self.conn.execute(RAW_INSERT, (QUEUE, [json.dumps(p) for p in payloads]))
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
        await self.conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        await self.enqueue(lib)
        await self.conn.execute(f"DELETE FROM {table}")
        await self.conn.execute(f"VACUUM (ANALYZE, TRUNCATE false) {table}")
        return await self.table_stats(lib)

    async def restore_autovacuum(self, lib: str) -> None:
        await self.conn.execute(f"ALTER TABLE {JOB_TABLE[lib]} RESET (autovacuum_enabled)")

    async def table_stats(self, lib: str) -> str:
        cur = await self.conn.execute(
            "SELECT relpages, reltuples FROM pg_class WHERE oid = %s::regclass",
            (JOB_TABLE[lib],),
        )
        row = await cur.fetchone()
        assert row is not None
        return f"pg_class: relpages={row[0]} reltuples={row[1]:.0f}"

    async def explain_claim(self, lib: str, label: str) -> None:
        """Record the plan of ``lib``'s claim as the drain will meet it."""
        if lib == "raw":
            cur = await self.conn.execute(
                "EXPLAIN " + RAW_CLAIM.replace("%s", "{}").format(f"'{QUEUE}'", RAW_CLAIM_BATCH)
            )
            plan = "\n".join(r[0] for r in await cur.fetchall())
        elif lib == "shoal":
            plan = await self.explain_shoal_claim()
        else:
            return
        self.plans.append((f"{label}; {await self.table_stats(lib)}", plan))

    async def explain_shoal_claim(self) -> str:
        """The plan of the statement inside ``shoal.claim_jobs``, via auto_explain.

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
                f"SELECT count(*) FROM {SCHEMA_SHOAL}.claim_jobs(%s, 20, NULL)", (QUEUE,)
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

    async def drain(self, lib: str) -> dict[str, Any]:
        env = dict(os.environ, **{URL_ENV: self.url})
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            lib,
            "--n",
            str(self.n),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        sampled = 0
        ps = psutil.Process(proc.pid)
        communicate = asyncio.ensure_future(proc.communicate())
        while not communicate.done():
            try:
                sampled = max(sampled, ps.memory_info().rss)
            except psutil.NoSuchProcess:
                pass
            await asyncio.wait({communicate}, timeout=RSS_SAMPLE_S)
        out, err = communicate.result()
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-15:]
            raise RuntimeError(f"{lib} drain exited {proc.returncode}:\n" + "\n".join(tail))
        result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
        result["sampled_rss_bytes"] = sampled
        if result["handled"] < self.n:
            raise RuntimeError(f"{lib}: handler saw {result['handled']} of {self.n} jobs")
        stderr = err.decode(errors="replace").strip()
        if stderr:
            result["stderr"] = stderr[-2000:]
        return result

    async def run_case(self, case: Case) -> None:
        lib = case.lib
        for rep in range(self.reps):
            if case.stale:
                stats = await self.make_stats_stale(lib)
            else:
                await self.conn.execute(TRUNCATE_SQL[lib])
            case.enqueue_s.append(await self.enqueue(lib))
            if not case.stale:
                # Fresh: statistics that know the N waiting jobs are there.
                await self.conn.execute(f"ANALYZE {JOB_TABLE[lib]}")
                stats = await self.table_stats(lib)
            if rep == 0:
                await self.explain_claim(lib, case.label)
            result = await self.drain(lib)
            case.drain_s.append(result["elapsed_s"])
            case.rss_mib.append(result["vm_hwm_kib"] / 1024)
            case.sampled_rss_mib.append(result["sampled_rss_bytes"] / 2**20)
            extra = ""
            if "worker_stats" in result:
                extra = f" worker.stats={result['worker_stats']}"
            if "stderr" in result:
                case.notes.append(f"rep {rep + 1} stderr: {result['stderr'][-500:]}")
            print(
                f"  {case.label:<28} rep {rep + 1}: enqueue {case.enqueue_s[-1] * 1000:7.1f} ms"
                f"  drain {result['elapsed_s']:6.2f} s  peak RSS {case.rss_mib[-1]:5.1f} MiB"
                f"  [{stats}]{extra}",
                flush=True,
            )
        if case.stale:
            await self.restore_autovacuum(lib)


def fmt_rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def fmt_ratio(value: float | None, base: float | None) -> str:
    return "n/a" if value is None or not base else f"{value / base:.2f}x"


def report(bench: Bench, cases: list[Case]) -> str:
    n = bench.n
    by_label = {(c.lib, c.stale): c for c in cases}

    def rates(lib: str, stale: bool) -> tuple[float | None, float | None]:
        c = by_label.get((lib, stale))
        if c is None or c.error:
            return None, None
        return rate(n, c.enqueue_s), rate(n, c.drain_s)

    lines = [
        f"N = {n:,} jobs; repetitions = {bench.reps} (median shown); "
        f"os.cpu_count() = {os.cpu_count()}",
        f"Postgres: {bench.pg_version}",
        "",
        "| case | enqueue jobs/s | drain jobs/s | vs raw (enqueue / drain) "
        "| vs pgqueuer (enqueue / drain) | worker peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    pgq_enq, pgq_drain = rates("pgqueuer", False)
    for c in cases:
        enq, drain = rates(c.lib, c.stale)
        # Compare like with like: a stale-statistics row against raw with stale statistics.
        raw_enq, raw_drain = rates("raw", c.stale)
        rss = median(c.rss_mib)
        if c.error:
            lines.append(f"| {c.label} | error | error | | | |")
            continue
        lines.append(
            f"| {c.label} | {fmt_rate(enq)} | {fmt_rate(drain)} "
            f"| {fmt_ratio(enq, raw_enq)} / {fmt_ratio(drain, raw_drain)} "
            f"| {fmt_ratio(enq, pgq_enq)} / {fmt_ratio(drain, pgq_drain)} "
            f"| {'n/a' if rss is None else f'{rss:.1f}'} |"
        )
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> int:
    admin_url = os.environ.get("DATABASE_URL") or DEFAULT_URL
    libs = [lib.strip() for lib in args.libs.split(",") if lib.strip()]
    unknown = set(libs) - set(LIBS)
    if unknown:
        raise SystemExit(f"--libs: unknown {sorted(unknown)}; choose from {', '.join(LIBS)}")
    reps = 1 if args.quick else args.reps
    bench = Bench(admin_url, args.n, reps, libs)
    host = conninfo_to_dict(admin_url).get("host", "local socket")
    print(f"shoal queue bench: N={args.n}, reps={reps}, server {host}, db {BENCH_DB}", flush=True)
    await bench.setup()
    cases = [Case(lib) for lib in LIBS if lib in libs]
    cases += [Case(lib, stale=True) for lib in STALE_LIBS if lib in libs]
    started = time.perf_counter()
    try:
        for case in cases:
            try:
                await bench.run_case(case)
            except Exception as exc:  # one library failing must not hide the others' rows
                case.error = f"{type(exc).__name__}: {exc}"
                print(f"  {case.label}: FAILED: {case.error}", flush=True)
    finally:
        await bench.close()
    print(f"\n(measured in {time.perf_counter() - started:.0f} s)\n")
    print(report(bench, cases))
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
        "--libs", default=",".join(LIBS), help=f"comma-separated subset of {','.join(LIBS)}"
    )
    parser.add_argument("--worker", choices=LIBS, help=argparse.SUPPRESS)  # a drain child
    args = parser.parse_args()
    if args.worker:
        worker_main(args.worker, args.n)
        return
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
