"""Long transaction and vacuum: a steady queue load while another session holds a transaction open.

    .venv/bin/python bench/long_tx_bench.py                  # about 3.5 minutes
    .venv/bin/python bench/long_tx_bench.py --minutes-total 10 --tx-minutes 5
    .venv/bin/python bench/long_tx_bench.py --libs shoal    # at half shoal's maximum

What it does, in one run against one PostgreSQL server with autovacuum as a
default installation has it: DATABASE_URL's server if its autovacuum is on,
else (``--server auto``) a throwaway cluster started from the machine's
PostgreSQL binaries with initdb's defaults, removed at the end:

1. creates the database ``shoal_longtx`` with a schema for each library
   (shoal, pgqueuer, procrastinate, set up as bench/queue_bench.py does);
2. probes each library's maximum drain rate: a backlog drained by one worker
   process (concurrency 10), timed from the first job finished to the last;
3. runs every library at once for ``--minutes-total``, each at a fixed rate:
   the same share of its own probed maximum (``--load-fraction``, default
   0.5, divided by the number of libraries sharing the machine), or
   ``--rate`` jobs/s for all. A producer per library in this process sends a
   batch every 50 ms, and one worker process per library drains (shoal's also
   runs maintenance, as ``shoal worker`` does);
4. in the middle ``--tx-minutes``, another connection to the same database
   runs ``BEGIN; SELECT txid_current();`` and then sits idle in the
   transaction, which holds back the horizon vacuum may clean up to.

Per interval (``--interval``, default 15 s) and library it reports: jobs sent
and finished per second, the wait from sending a job to its handler starting
(p50/p99; the producer's wall-clock time travels in the payload), the backlog
(sent minus handled), and the job table's ``n_dead_tup`` and
``pg_total_relation_size``. The verdict line holds each library to the bar:
throughput while the transaction is open at least 80% of the steady rate
before it, and caught up (throughput at 80% and backlog under one second of
load) within a minute after it closes.

The database is dropped at the end. This is a measurement script, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pwd
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

if not __package__:  # run as a file: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.queue_bench import (
    DEFAULT_URL,
    DONE_COUNT_SQL,
    JOB_TABLE,
    QUEUE,
    SCHEMA_PGQUEUER,
    SCHEMA_PROCRASTINATE,
    SCHEMA_SHOAL,
    TRUNCATE_SQL,
    procrastinate_app,
    shoal_version,
    with_search_path,
)

BENCH_DB = "shoal_longtx"
LIBS = ("shoal", "pgqueuer", "procrastinate")
CONCURRENCY = 10
PGQ_BATCH = 100
# The producer sends one batch per tick.
TICK_S = 0.05
# Jobs per library in the probe of its maximum drain rate.
PROBE_N = {"shoal": 10_000, "pgqueuer": 3_000, "procrastinate": 1_000}
PROBE_TIMEOUT_S = 60.0
URL_ENV = "SHOAL_BENCH_URL"
# The OS user a throwaway server runs as when this script runs as root.
SERVER_USER = "postgres"
SCRIPT = os.path.abspath(__file__)
# "Recovered": an interval at 80% of steady throughput with at most this many
# seconds of load waiting, ending within RECOVER_S of the transaction's end.
BAR = 0.8
RECOVER_S = 60.0
BACKLOG_S = 1.0


# == worker children ==========================================================
#
# A child drains one library's queue until SIGTERM (or --until), recording per
# interval how many jobs its handler started and their waits, and prints one
# JSON line.


class Recorder:
    def __init__(self, t0: float, interval: float) -> None:
        self.t0 = t0
        self.interval = interval
        self.waits: dict[int, list[float]] = {}
        self.handled = 0

    def hit(self, sent_at: float) -> None:
        now = time.time()
        self.handled += 1
        self.waits.setdefault(int((now - self.t0) // self.interval), []).append(now - sent_at)

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for idx, waits in self.waits.items():
            waits.sort()
            out[str(idx)] = {
                "n": len(waits),
                "p50": waits[len(waits) // 2],
                "p99": waits[min(len(waits) - 1, int(len(waits) * 0.99))],
            }
        return {"handled": self.handled, "intervals": out}


async def run_shoal(url: str, rec: Recorder, stop: asyncio.Event) -> None:
    from shoal import Job, Shoal

    async def handler(job: Job) -> None:
        rec.hit(job.data["t"])

    boss = await Shoal.connect(url, schema=SCHEMA_SHOAL)
    try:
        worker = boss.work(QUEUE, handler, concurrency=CONCURRENCY)
        maint = asyncio.create_task(boss.maintenance().run())
        await stop.wait()
        await worker.stop()
        maint.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await maint
    finally:
        await boss.close()


async def run_pgqueuer(url: str, rec: Recorder, stop: asyncio.Event) -> None:
    from pgqueuer import PgQueuer
    from pgqueuer.models import Job as PgqJob

    async with await psycopg.AsyncConnection.connect(
        with_search_path(url, SCHEMA_PGQUEUER), autocommit=True
    ) as conn:
        pgq = PgQueuer.from_psycopg_connection(conn)

        @pgq.entrypoint(QUEUE)
        async def noop(job: PgqJob) -> None:
            rec.hit(json.loads(job.payload or b"{}")["t"])

        run = asyncio.create_task(pgq.run(batch_size=PGQ_BATCH))
        await stop.wait()
        pgq.shutdown.set()
        await asyncio.wait_for(run, 30)


async def run_procrastinate(url: str, rec: Recorder, stop: asyncio.Event) -> None:
    async def bench_noop(t: float) -> None:
        rec.hit(t)

    app, _task = procrastinate_app(url, bench_noop)
    async with app.open_async():
        run = asyncio.create_task(
            app.run_worker_async(
                queues=[QUEUE], concurrency=CONCURRENCY, install_signal_handlers=False
            )
        )
        await stop.wait()
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(run, 30)


RUNNERS = {"shoal": run_shoal, "pgqueuer": run_pgqueuer, "procrastinate": run_procrastinate}


async def worker_async(lib: str, t0: float, interval: float) -> None:
    rec = Recorder(t0, interval)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await RUNNERS[lib](os.environ[URL_ENV], rec, stop)
    print(json.dumps(rec.result()), flush=True)


# == a throwaway server with PostgreSQL's default configuration ==============


class OwnServer:
    """A fresh cluster from the machine's PostgreSQL binaries, defaults untouched.

    Used when the server of DATABASE_URL runs with autovacuum off (as the
    development machine's does, for its other benchmarks): the point here is
    autovacuum as a default installation has it. Runs as ``postgres`` through
    ``runuser`` when this script runs as root (PostgreSQL refuses root).
    """

    def __init__(self) -> None:
        found = sorted(
            (p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "initdb").exists()),
            key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        )
        if not found:
            raise SystemExit("no /usr/lib/postgresql/<n>/bin/initdb to start a server with")
        self.bin_dir = found[-1]
        self.as_root = os.geteuid() == 0
        self.base = Path(tempfile.mkdtemp(prefix="shoal-longtx-"))
        if self.as_root:
            user = pwd.getpwnam(SERVER_USER)
            os.chown(self.base, user.pw_uid, user.pw_gid)
        self.data = self.base / "data"
        from shoal.db.embedded import free_port

        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def run(self, program: str, *args: str) -> None:
        command = [str(self.bin_dir / program), *args]
        if self.as_root:
            command = ["runuser", "-u", SERVER_USER, "--", *command]
        result = subprocess.run(
            command, cwd=self.base, capture_output=True, text=True, stdin=subprocess.DEVNULL
        )
        if result.returncode != 0:
            raise RuntimeError(f"{program} failed: {result.stderr.strip()[-1000:]}")

    def start(self, *settings: str) -> None:
        """initdb and start; each of ``settings`` (``name=value``) is passed as ``-c``."""
        self.run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.base}"
        options += "".join(f" -c {setting}" for setting in settings)
        log = str(self.base / "server.log")
        self.run("pg_ctl", "start", "-w", "-D", str(self.data), "-l", log, "-o", options)

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError):
                self.run("pg_ctl", "stop", "-w", "-m", "fast", "-D", str(self.data))
        shutil.rmtree(self.base, ignore_errors=True)


async def autovacuum_of(url: str) -> str:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
        cur = await c.execute("SELECT current_setting('autovacuum')")
        row = await cur.fetchone()
        return str(row[0]) if row else "?"


# == the parent ================================================================


@dataclass
class Row:
    idx: int
    phase: str
    sent: int = 0
    handled: int = 0
    p50: float | None = None
    p99: float | None = None
    backlog: int = 0
    dead: int = 0
    live: int = 0
    size: int = 0
    autovacuums: int = 0


@dataclass
class Lib:
    name: str
    probe_rate: float | None = None
    rate: float = 0.0
    sent_total: int = 0
    sent_by_interval: dict[int, int] = field(default_factory=dict)
    stats_by_interval: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)
    child: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


class Bench:
    def __init__(self, args: argparse.Namespace, admin_url: str) -> None:
        self.args = args
        self.admin_url = admin_url
        self.url = make_conninfo(admin_url, dbname=BENCH_DB)
        self.libs = {name: Lib(name) for name in args.libs}
        self.load_at_start: tuple[float, ...] = ()
        self.server_note = ""
        self.rate_note = ""

    async def setup(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.admin_url, autocommit=True) as c:
            cur = await c.execute("SELECT version(), current_setting('autovacuum')")
            row = await cur.fetchone()
            assert row is not None
            self.pg_version, self.autovacuum = row
            cur = await c.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN ("
                "'autovacuum_naptime', 'autovacuum_vacuum_scale_factor',"
                " 'autovacuum_vacuum_threshold', 'autovacuum_vacuum_insert_threshold')"
                " ORDER BY name"
            )
            self.av_settings = ", ".join(f"{k}={v}" for k, v in await cur.fetchall())
            name = sql.Identifier(BENCH_DB)
            await c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
            await c.execute(sql.SQL("CREATE DATABASE {}").format(name))
        self.conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        for schema in (SCHEMA_PROCRASTINATE, SCHEMA_PGQUEUER):
            await self.conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        from pgqueuer import Queries

        from shoal import Shoal

        self.boss = await Shoal.connect(self.url, schema=SCHEMA_SHOAL)
        self.pgq_conn = await psycopg.AsyncConnection.connect(
            with_search_path(self.url, SCHEMA_PGQUEUER), autocommit=True
        )
        self.pgq = Queries.from_psycopg_connection(self.pgq_conn)
        await self.pgq.install()

        async def never_run(t: float) -> None:
            raise AssertionError("the parent process runs no procrastinate job")

        self.proc_app, self.proc_task = procrastinate_app(self.url, never_run)
        await self.proc_app.open_async()
        await self.proc_app.schema_manager.apply_schema_async()

    async def teardown(self) -> None:
        with contextlib.suppress(Exception):
            await self.boss.close()
            await self.proc_app.close_async()
            await self.pgq_conn.close()
            await self.conn.close()
        async with await psycopg.AsyncConnection.connect(self.admin_url, autocommit=True) as c:
            await c.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(BENCH_DB))
            )

    async def send(self, lib: str, n: int) -> None:
        t = time.time()
        if lib == "shoal":
            await self.boss.insert([{"queue": QUEUE, "data": {"t": t}} for _ in range(n)])
        elif lib == "pgqueuer":
            payload = json.dumps({"t": t}).encode()
            await self.pgq.enqueue([QUEUE] * n, [payload] * n, [0] * n)
        else:
            await self.proc_task.batch_defer_async(*({"t": t} for _ in range(n)))

    async def start_child(self, lib: str, t0: float) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            SCRIPT,
            "--worker",
            lib,
            "--t0",
            repr(t0),
            "--interval",
            str(self.args.interval),
            env=dict(os.environ, **{URL_ENV: self.url}),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )

    async def stop_child(self, lib: str, proc: asyncio.subprocess.Process) -> dict[str, Any]:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        lines = out.decode().strip().splitlines()
        if proc.returncode != 0 or not lines:
            tail = " ".join(err.decode(errors="replace").strip().splitlines()[-3:])
            raise RuntimeError(f"{lib} worker exited {proc.returncode}: {tail}")
        result: dict[str, Any] = json.loads(lines[-1])
        return result

    async def done_count(self, lib: str) -> int:
        cur = await self.conn.execute(DONE_COUNT_SQL[lib])
        row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def probe(self, lib: str) -> float:
        """Jobs per second one worker process drains from a standing backlog."""
        n = PROBE_N[lib]
        batch = 1000
        for _ in range(n // batch):
            await self.send(lib, batch)
        proc = await self.start_child(lib, time.time())
        try:
            first_t, first_n = None, 0
            deadline = time.perf_counter() + PROBE_TIMEOUT_S
            while time.perf_counter() < deadline:
                done = await self.done_count(lib)
                now = time.perf_counter()
                if done and first_t is None:
                    first_t, first_n = now, done
                if done >= n:
                    break
                await asyncio.sleep(0.02)
            else:
                raise RuntimeError(f"{lib}: probe drained {done} of {n} in {PROBE_TIMEOUT_S}s")
        finally:
            await self.stop_child(lib, proc)
        assert first_t is not None
        rate = (n - first_n) / max(now - first_t, 1e-3)
        await self.conn.execute(TRUNCATE_SQL[lib])
        return rate

    async def table_stats(self) -> dict[str, tuple[int, int, int, int]]:
        out = {}
        for lib in self.libs:
            table = JOB_TABLE[lib].as_string(self.conn)
            cur = await self.conn.execute(
                "SELECT n_dead_tup, n_live_tup, pg_total_relation_size(relid),"
                " autovacuum_count FROM pg_stat_user_tables WHERE relid = %s::regclass",
                (table,),
            )
            row = await cur.fetchone()
            assert row is not None
            out[lib] = (int(row[0]), int(row[1]), int(row[2]), int(row[3]))
        return out

    async def producer(self, lib: str, rate: float, t0: float, end: float) -> None:
        state = self.libs[lib]
        owed = 0.0
        next_tick = time.time()
        while time.time() < end:
            owed += rate * TICK_S
            n = int(owed)
            if n:
                owed -= n
                idx = int((time.time() - t0) // self.args.interval)
                await self.send(lib, n)
                state.sent_total += n
                state.sent_by_interval[idx] = state.sent_by_interval.get(idx, 0) + n
            next_tick += TICK_S
            await asyncio.sleep(max(0.0, next_tick - time.time()))

    async def hold_transaction(self, start: float, end: float) -> tuple[int, float, float]:
        await asyncio.sleep(max(0.0, start - time.time()))
        async with await psycopg.AsyncConnection.connect(self.url) as conn:
            cur = await conn.execute("SELECT txid_current()")
            row = await cur.fetchone()
            began = time.time()
            await asyncio.sleep(max(0.0, end - time.time()))
            await conn.commit()
            return int(row[0]) if row else 0, began, time.time()

    async def sampler(self, t0: float, n_intervals: int) -> None:
        for idx in range(n_intervals):
            await asyncio.sleep(max(0.0, t0 + (idx + 1) * self.args.interval - time.time()))
            for lib, stats in (await self.table_stats()).items():
                self.libs[lib].stats_by_interval[idx] = stats
            self.progress(idx)

    def progress(self, idx: int) -> None:
        parts = []
        for lib in self.libs.values():
            dead, _live, size, _av = lib.stats_by_interval[idx]
            parts.append(f"{lib.name} sent {lib.sent_total} dead {dead} {size / 2**20:.1f}MiB")
        print(f"  [{(idx + 1) * self.args.interval:4.0f}s] " + "; ".join(parts), flush=True)

    async def run(self) -> tuple[float, float, float, int]:
        args = self.args
        total = args.minutes_total * 60
        tx = args.tx_minutes * 60
        n_intervals = round(total / args.interval)
        t0 = time.time() + 5.0  # the children start and connect first
        tx_start = t0 + (total - tx) / 2
        tx_end = tx_start + tx
        procs = {lib: await self.start_child(lib, t0) for lib in self.libs}
        await asyncio.sleep(max(0.0, t0 - time.time()))
        end = t0 + n_intervals * args.interval
        tasks = [
            asyncio.create_task(self.producer(lib.name, lib.rate, t0, end - 0.05))
            for lib in self.libs.values()
        ]
        holder = asyncio.create_task(self.hold_transaction(tx_start, tx_end))
        await self.sampler(t0, n_intervals)
        await asyncio.gather(*tasks)
        xid, began, ended = await holder
        for lib, proc in procs.items():
            try:
                self.libs[lib].child = await self.stop_child(lib, proc)
            except Exception as exc:
                self.libs[lib].error = f"{type(exc).__name__}: {exc}"
        return t0, began - t0, ended - t0, xid


def phase_of(start: float, end: float, tx_from: float, tx_to: float) -> str:
    if end <= tx_from + 0.5:
        return "before"
    if start >= tx_to - 0.5:
        return "after"
    return "tx open"


def rows_for(lib: Lib, interval: float, tx_from: float, tx_to: float) -> list[Row]:
    rows = []
    sent = handled = 0
    for idx in sorted(lib.stats_by_interval):
        row = Row(idx, phase_of(idx * interval, (idx + 1) * interval, tx_from, tx_to))
        row.sent = lib.sent_by_interval.get(idx, 0)
        got = lib.child.get("intervals", {}).get(str(idx), {})
        row.handled = got.get("n", 0)
        row.p50, row.p99 = got.get("p50"), got.get("p99")
        sent += row.sent
        handled += row.handled
        row.backlog = sent - handled
        row.dead, row.live, row.size, row.autovacuums = lib.stats_by_interval[idx]
        rows.append(row)
    return rows


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.0f}"


def verdict(rows: list[Row], interval: float, rate: float, tx_to: float) -> tuple[bool, str]:
    before = [r for r in rows if r.phase == "before"]
    steady_rows = before[1:] or before  # the first interval warms up
    during = [r for r in rows if r.phase == "tx open"]
    after = [r for r in rows if r.phase == "after"]
    if not steady_rows or not during:
        return False, "too few intervals to judge"
    steady = statistics.mean(r.handled for r in steady_rows) / interval
    low = min(r.handled for r in during) / interval
    ratio = low / steady if steady else 0.0
    recovered_at = None
    for r in after:
        end = (r.idx + 1) * interval
        if end - tx_to > RECOVER_S + 0.5:
            break
        if r.handled / interval >= BAR * steady and r.backlog <= rate * BACKLOG_S:
            recovered_at = end - tx_to
            break
    ok = ratio >= BAR and recovered_at is not None
    rec = (
        f"caught up by {recovered_at:.0f} s after it closed"
        if recovered_at is not None
        else f"not caught up within {RECOVER_S:.0f} s after it closed"
    )
    text = (
        f"steady {steady:,.0f}/s; lowest interval with the transaction open {low:,.0f}/s "
        f"({ratio:.0%}); {rec}"
    )
    return ok, text


def report(bench: Bench, tx_from: float, tx_to: float, xid: int) -> tuple[str, bool]:
    args = bench.args
    load = ", ".join(f"{x:.2f}" for x in bench.load_at_start)
    lines = [
        f"os.cpu_count() = {os.cpu_count()}; load average at start {load}, at end "
        + ", ".join(f"{x:.2f}" for x in os.getloadavg()),
        f"Postgres: {bench.pg_version}; autovacuum={bench.autovacuum}; {bench.av_settings}",
        f"shoal: {shoal_version()}",
        "max drain rate probed (one worker process, concurrency 10): "
        + ", ".join(
            f"{lib.name} {lib.probe_rate:,.0f}/s"
            for lib in bench.libs.values()
            if lib.probe_rate is not None
        ),
        f"server: {bench.server_note}",
        "load, all libraries at once: "
        + ", ".join(f"{lib.name} {lib.rate:,.0f} jobs/s" for lib in bench.libs.values())
        + f" ({bench.rate_note}); transaction (xid {xid}) open from {tx_from:.0f} s "
        f"to {tx_to:.0f} s of {args.minutes_total * 60:.0f} s",
    ]
    all_ok = True
    for lib in bench.libs.values():
        lines += ["", f"### {lib.name}", ""]
        if lib.error:
            lines.append(f"error: {lib.error}")
            all_ok = False
            continue
        lines += [
            "| t (s) | phase | sent/s | done/s | wait p50 ms | wait p99 ms | backlog "
            "| n_dead_tup | n_live_tup | table MiB | autovacuums |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        rows = rows_for(lib, args.interval, tx_from, tx_to)
        for r in rows:
            lines.append(
                f"| {(r.idx + 1) * args.interval:.0f} | {r.phase} "
                f"| {r.sent / args.interval:,.0f} | {r.handled / args.interval:,.0f} "
                f"| {ms(r.p50)} | {ms(r.p99)} | {r.backlog:,} | {r.dead:,} | {r.live:,} "
                f"| {r.size / 2**20:,.1f} | {r.autovacuums} |"
            )
        ok, text = verdict(rows, args.interval, lib.rate, tx_to)
        all_ok &= ok if lib.name == "shoal" else True
        lines += ["", f"verdict {lib.name}: {'PASS' if ok else 'MISS'} ({text})"]
    return "\n".join(lines), all_ok


async def main_async(args: argparse.Namespace) -> int:
    admin_url = os.environ.get("DATABASE_URL") or DEFAULT_URL
    load_at_start = os.getloadavg()
    own = None
    server_note = f"{conninfo_to_dict(admin_url).get('host', 'local socket')} (DATABASE_URL)"
    if args.server == "own" or (args.server == "auto" and await autovacuum_of(admin_url) != "on"):
        own = OwnServer()
        own.start()
        server_note = (
            f"a throwaway cluster (initdb defaults, {own.bin_dir}) on 127.0.0.1:{own.port}"
            + (", as DATABASE_URL's server has autovacuum off" if args.server == "auto" else "")
        )
        admin_url = own.url
    try:
        return await run_bench(args, admin_url, load_at_start, server_note)
    finally:
        if own is not None:
            own.stop()


async def run_bench(
    args: argparse.Namespace, admin_url: str, load_at_start: tuple[float, ...], server_note: str
) -> int:
    bench = Bench(args, admin_url)
    bench.load_at_start = load_at_start
    bench.server_note = server_note
    print(
        f"long-transaction bench: libs {','.join(args.libs)}, {args.minutes_total} min "
        f"(transaction open {args.tx_minutes} min), server {server_note}, db {BENCH_DB}",
        flush=True,
    )
    await bench.setup()
    try:
        for lib in list(bench.libs):
            try:
                bench.libs[lib].probe_rate = await bench.probe(lib)
                print(f"  probe {lib}: {bench.libs[lib].probe_rate:,.0f} jobs/s", flush=True)
            except Exception as exc:
                print(f"  probe {lib} FAILED, left out: {exc}", flush=True)
                del bench.libs[lib]
        if not bench.libs:
            return 1
        share = args.load_fraction / len(bench.libs)
        for lib in bench.libs.values():
            lib.rate = args.rate or (lib.probe_rate or 0.0) * share
        bench.rate_note = (
            f"--rate {args.rate:g} for each"
            if args.rate
            else f"each at {share:.0%} of its own probed maximum: --load-fraction "
            f"{args.load_fraction:g} shared by {len(bench.libs)} libraries"
        )
        print(
            "  steady load: "
            + ", ".join(f"{lib.name} {lib.rate:,.0f}/s" for lib in bench.libs.values()),
            flush=True,
        )
        _t0, tx_from, tx_to, xid = await bench.run()
        text, ok = report(bench, tx_from, tx_to, xid)
    finally:
        await bench.teardown()
    print("\n" + text)
    return 0 if ok else 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--minutes-total", type=float, default=3.0)
    parser.add_argument("--tx-minutes", type=float, default=1.0)
    parser.add_argument("--interval", type=float, default=15.0, help="seconds per row")
    parser.add_argument(
        "--load-fraction",
        type=float,
        default=0.5,
        help="each library's load as a fraction of its probed maximum, divided by the "
        "number of libraries sharing the machine (default 0.5)",
    )
    parser.add_argument("--rate", type=float, help="the same jobs/s for every library instead")
    parser.add_argument(
        "--server",
        choices=("auto", "url", "own"),
        default="auto",
        help="auto: DATABASE_URL's server if its autovacuum is on, else a throwaway "
        "cluster with default settings; url / own: always that",
    )
    parser.add_argument("--libs", default=",".join(LIBS), help=f"subset of {','.join(LIBS)}")
    parser.add_argument("--worker", choices=LIBS, help=argparse.SUPPRESS)
    parser.add_argument("--t0", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        asyncio.run(worker_async(args.worker, args.t0, args.interval))
        return
    args.libs = [x.strip() for x in args.libs.split(",") if x.strip()]
    unknown = set(args.libs) - set(LIBS)
    if unknown:
        parser.error(f"--libs: unknown {sorted(unknown)}; choose from {', '.join(LIBS)}")
    if not 0 < args.tx_minutes < args.minutes_total:
        parser.error("--tx-minutes must be above 0 and below --minutes-total")
    if args.interval <= 0 or (args.rate is not None and args.rate <= 0):
        parser.error("--interval and --rate must be positive")
    if not 0 < args.load_fraction <= 1:
        parser.error("--load-fraction must be above 0 and at most 1")
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
