"""Durable workflows benchmark: shoal beside DBOS, in one run, on one PostgreSQL server.

    .venv/bin/python -m bench.workflow_bench                 # N = 10,000
    .venv/bin/python -m bench.workflow_bench --quick         # N = 1,000, shorter idle windows
    .venv/bin/python -m bench.workflow_bench --sides shoal   # without DBOS

The cases (issue 39, item 8), each timed from the first start to the last
completion, as the driver sees it (it polls the run table every 20 ms on a
connection of its own, not counted) and by the database's clock:

- three steps: N workflows of 3 no-op steps, started one call each (each
  start its own transaction) by 10 concurrent callers (``--starters``).
  shoal: ``@app.workflow`` calling ``wf.step`` three times, started with
  ``workflows.start``; DBOS: a ``@DBOS.workflow`` calling a ``@DBOS.step`` three times, started with
  ``Queue.enqueue`` (its docs' idiom for running many at once);
- fan-out: one workflow fanning out N no-op items and waiting for them.
  shoal: ``wf.batch(kind, items)`` with a no-op item handler; DBOS: the
  parent enqueues N child workflows on a Queue and waits for each handle's
  ``get_result()`` (the queue tutorial's fan-out example);
- per step: commits (``xact_commit`` of the database, read 1.5 s after the
  last completion so every backend has flushed its counters; the idle
  polling of those 1.5 s is included) and statements (top-level calls in
  pg_stat_statements, at the last completion) of the three-step case,
  divided by 3N: everything, starts and bookkeeping included;
- idle cost: statements per second against the database for a window with
  the worker idle, then for the same window with 100 workflows asleep for an
  hour (shoal: ``wf.sleep``; DBOS: ``DBOS.sleep``), by pg_stat_statements.

Each side runs in a child process of its own, in-process as its users run
it: shoal's ``App.run`` (what ``shoal worker --app`` runs: the workflow and
batch workers, maintenance, the scheduler and the aggregator) in the same
process and event loop as the driver; DBOS launched in the driver's process
(its queue thread and executor threads). Both at concurrency 100 per process,
shoal's default for a workflow (``--concurrency``): shoal's workflow and item
workers, DBOS's queue ``worker_concurrency``; DBOS's queue polls every 0.01 s
(``--dbos-poll``; its default is 1 s). A throwaway cluster from the
machine's binaries (autovacuum off, pg_stat_statements loaded) holds one
database per side. DBOS is held to a budget: a case cut off at
``--dbos-timeout`` seconds reports its rate so far, and says so.

This is a measurement script, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import psycopg

if not __package__:  # run as a file: make ``bench`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.machine import OwnServer, ServerMeter, describe, own_server_settings

SIDES = ("shoal", "dbos")
DB = {"shoal": "shoal_wf_bench", "dbos": "dbos_wf_bench"}
N_FULL, N_QUICK = 10_000, 1_000
IDLE_FULL_S, IDLE_QUICK_S = 20.0, 5.0
SLEEPERS = 100
CONCURRENCY = 100
# The N three-step workflows are started by this many callers at once (asyncio
# tasks for shoal, threads for DBOS), each one start per call, as concurrent
# requests of a web application would: one caller's loop measures its round
# trips and commit latency, not the engine.
STARTERS = 10
DBOS_POLL_S = 0.01
DBOS_TIMEOUT_S = 300.0
SHOAL_TIMEOUT_S = 300.0
POLL_S = 0.02
# After the worker starts (LISTEN, first empty claims, leader elections),
# before the clock starts.
SETTLE_S = 1.0
# Backends flush their transaction counters at most once a second while busy
# and within a second of going idle (PostgreSQL 15+).
STATS_FLUSH_S = 1.5
WATCH_MARK = "wfbench-watch"
URL_ENV, ADMIN_URL_ENV = "WFBENCH_URL", "WFBENCH_ADMIN_URL"
RESULT_MARK = "WFBENCH-RESULT "

SHOAL_THREE = "wfbench.three"
SHOAL_FANOUT = "wfbench.fanout"
SHOAL_SLEEPER = "wfbench.sleeper"
SHOAL_ITEM_KIND = "wfbench.item"


# -- measuring -------------------------------------------------------------------


class Watch:
    """The driver's own connection: polls a count until it reaches a target, or a deadline."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], query: str) -> None:
        self.conn = conn
        self.query = f"/* {WATCH_MARK} */ {query}"
        self.polls = 0  # each one a transaction of the bench database: not the work's

    async def count(self, *params: Any) -> tuple[int, int]:
        cur = await self.conn.execute(self.query, params)
        self.polls += 1
        row = await cur.fetchone()
        assert row is not None
        return int(row[0] or 0), int(row[1] or 0)

    async def until(self, target: int, started: float, timeout_s: float, *params: Any) -> Reached:
        """Poll until ``target`` are done (or one failed, or the deadline): what was reached."""
        while True:
            done, failed = await self.count(*params)
            elapsed = time.perf_counter() - started
            if done >= target or failed or elapsed >= timeout_s:
                return Reached(done, failed, elapsed, cut=done < target and not failed)
            await asyncio.sleep(POLL_S)


class Reached:
    def __init__(self, done: int, failed: int, elapsed: float, *, cut: bool) -> None:
        self.done, self.failed, self.elapsed, self.cut = done, failed, elapsed, cut

    def as_dict(self) -> dict[str, Any]:
        return {"done": self.done, "failed": self.failed, "s": self.elapsed, "cut": self.cut}


class Meter:
    """pg_stat_statements and xact_commit of one database, on the admin database's connection."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], database: str) -> None:
        self.server = ServerMeter(conn, database, ignore_like=f"%{WATCH_MARK}%")
        self.conn = conn
        self.database = database

    async def open(self) -> None:
        await self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await self.server.open()

    async def commits(self) -> int:
        await self.conn.execute("SELECT pg_stat_clear_snapshot()")
        cur = await self.conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (self.database,)
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    async def measure(
        self, work: Callable[[], Awaitable[Any]], watch: Watch
    ) -> tuple[Any, dict[str, Any]]:
        """Run ``work``: its value, and the statements, commits, WAL and server CPU it took.

        The commits are the database's less ``watch``'s polls.
        """
        polls = watch.polls
        commits = await self.commits()
        before = await self.server.sample()
        value = await work()
        usage = await self.server.since(before)
        await asyncio.sleep(STATS_FLUSH_S)
        spent = {
            "statements": usage.statements,
            "commits": await self.commits() - commits - (watch.polls - polls),
            "wal_bytes": usage.wal_bytes,
            "server_cpu_s": usage.cpu_s,
            "exec_ms": usage.exec_ms,
            "by_kind": [
                (q[:140], calls, ms)
                for q, calls, ms, _wal in sorted(usage.top, key=lambda t: -t[1])[:12]
            ],
        }
        return value, spent

    async def statements_per_s(self, window_s: float) -> dict[str, Any]:
        before = await self.server.sample()
        started = time.perf_counter()
        await asyncio.sleep(window_s)
        usage = await self.server.since(before)
        elapsed = time.perf_counter() - started
        return {
            "window_s": elapsed,
            "statements": usage.statements,
            "per_s": usage.statements / elapsed,
            "by_kind": [
                (q[:160], calls)
                for q, calls, _ms, _wal in sorted(usage.top, key=lambda t: -t[1])[:8]
            ],
        }


async def open_conn(url: str) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(url, autocommit=True)


def db_url(admin_url: str, database: str) -> str:
    return admin_url.rsplit("/", 1)[0] + "/" + database


# -- shoal ---------------------------------------------------------------------------


def shoal_app(concurrency: int) -> Any:
    """The shoal side's workflows and item kind (no-op steps and items)."""
    from shoal import App, Item
    from shoal.workflow import Workflow

    app = App()

    async def noop(x: int) -> int:
        return x

    @app.workflow(SHOAL_THREE, concurrency=concurrency)
    async def three(wf: Workflow, x: int) -> int:
        a = await wf.step(noop, x)
        b = await wf.step(noop, a)
        return int(await wf.step(noop, b))

    @app.batch(SHOAL_ITEM_KIND, concurrency=concurrency)
    async def item(item: Item) -> None:
        return None

    @app.workflow(SHOAL_FANOUT, concurrency=concurrency)
    async def fanout(wf: Workflow, n: int) -> Any:
        task = await wf.batch(SHOAL_ITEM_KIND, [f"i{i}" for i in range(n)])
        return task["progress"]

    @app.workflow(SHOAL_SLEEPER, concurrency=concurrency)
    async def sleeper(wf: Workflow, x: int) -> None:
        await wf.sleep(timedelta(hours=1))

    return app


class ShoalWorker:
    """``App.run`` in this process, as ``shoal worker --app`` runs it."""

    def __init__(self, app: Any, url: str) -> None:
        self.app, self.url = app, url

    async def __aenter__(self) -> Any:
        from shoal import Shoal

        self.boss = await Shoal.connect(self.url)
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self.app.run(self.boss, stop=self.stop))
        await asyncio.sleep(SETTLE_S)
        if self.task.done():
            self.task.result()
        return self.app.workflows(self.boss)

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        await self.task
        await self.boss.close()


async def shoal_side(url: str, admin_url: str, args: argparse.Namespace) -> dict[str, Any]:
    from shoal import Shoal

    logging.basicConfig(level=logging.WARNING)
    async with await Shoal.connect(url):
        pass  # migrations, before anything is timed
    app = shoal_app(args.concurrency)
    admin = await open_conn(admin_url)
    meter = Meter(admin, DB["shoal"])
    await meter.open()
    watch_conn = await open_conn(url)
    runs = Watch(
        watch_conn,
        "SELECT count(*) FILTER (WHERE status = 'completed'),"
        " count(*) FILTER (WHERE status IN ('failed', 'cancelled'))"
        " FROM shoal.workflow_run WHERE name = %s",
    )
    out: dict[str, Any] = {}

    async def db_span(name: str) -> float:
        cur = await watch_conn.execute(
            f"/* {WATCH_MARK} */ SELECT extract(epoch FROM max(finished_at) - min(created_at))"
            " FROM shoal.workflow_run WHERE name = %s",
            (name,),
        )
        row = await cur.fetchone()
        return float(row[0]) if row and row[0] is not None else float("nan")

    n = args.n
    async with ShoalWorker(app, url) as workflows:

        async def three() -> dict[str, Any]:
            started = time.perf_counter()

            async def starter(first: int) -> None:
                for i in range(first, n, args.starters):
                    await workflows.start(SHOAL_THREE, i)

            await asyncio.gather(*(starter(k) for k in range(args.starters)))
            starts_s = time.perf_counter() - started
            reached = await runs.until(n, started, SHOAL_TIMEOUT_S, SHOAL_THREE)
            return {**reached.as_dict(), "starts_s": starts_s}

        profiler = cProfile.Profile() if args.profile else None
        if profiler is not None:
            profiler.enable()
        result, spent = await meter.measure(three, runs)
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
        out["three"] = {**result, **spent, "db_s": await db_span(SHOAL_THREE), "n": n}
        print(f"shoal three steps: {out['three']['s']:.2f} s", file=sys.stderr, flush=True)

        async def fanout() -> dict[str, Any]:
            started = time.perf_counter()
            await workflows.start(SHOAL_FANOUT, args.fanout)
            return (await runs.until(1, started, SHOAL_TIMEOUT_S, SHOAL_FANOUT)).as_dict()

        result, spent = await meter.measure(fanout, runs)
        out["fanout"] = {**result, **spent, "db_s": await db_span(SHOAL_FANOUT), "n": args.fanout}
        print(f"shoal fan-out: {out['fanout']['s']:.2f} s", file=sys.stderr, flush=True)

        out["idle"] = await meter.statements_per_s(args.idle_s)
        for i in range(SLEEPERS):
            await workflows.start(SHOAL_SLEEPER, i)
        sleeping = Watch(
            watch_conn,
            "SELECT count(*) FILTER (WHERE status = 'sleeping'),"
            " count(*) FILTER (WHERE status IN ('failed', 'cancelled'))"
            " FROM shoal.workflow_run WHERE name = %s",
        )
        asleep = await sleeping.until(SLEEPERS, time.perf_counter(), 60.0, SHOAL_SLEEPER)
        out["idle_sleepers"] = {
            **await meter.statements_per_s(args.idle_s),
            "asleep": asleep.done,
        }
    await watch_conn.close()
    await admin.close()
    return out


# -- DBOS ------------------------------------------------------------------------------


async def dbos_side(url: str, admin_url: str, args: argparse.Namespace) -> dict[str, Any]:
    from dbos import DBOS, Queue

    DBOS(config={"name": "wfbench", "system_database_url": url, "log_level": "WARNING"})
    queue: Queue | None = None  # registered once DBOS is launched (it is stored in its tables)

    @DBOS.step()
    def noop(x: int) -> int:
        return x

    @DBOS.workflow()
    def three(x: int) -> int:
        return noop(noop(noop(x)))

    @DBOS.workflow()
    def process_task(task: int) -> int:
        return task

    @DBOS.workflow()
    def fanout(n: int) -> int:
        assert queue is not None
        handles = [queue.enqueue(process_task, i) for i in range(n)]
        return len([handle.get_result() for handle in handles])

    @DBOS.workflow()
    def sleeper(x: int) -> None:
        DBOS.sleep(3600)

    DBOS.launch()
    queue = await DBOS.register_queue_async(
        "wfbench", worker_concurrency=args.concurrency, polling_interval_sec=args.dbos_poll
    )
    await asyncio.sleep(SETTLE_S)
    admin = await open_conn(admin_url)
    meter = Meter(admin, DB["dbos"])
    await meter.open()
    watch_conn = await open_conn(url)
    by_name = Watch(
        watch_conn,
        "SELECT count(*) FILTER (WHERE status = 'SUCCESS'),"
        " count(*) FILTER (WHERE status NOT IN ('SUCCESS', 'PENDING', 'ENQUEUED'))"
        " FROM dbos.workflow_status WHERE name = %s",
    )
    out: dict[str, Any] = {}

    async def db_span(name: str) -> float:
        cur = await watch_conn.execute(
            f"/* {WATCH_MARK} */ SELECT (max(updated_at) - min(created_at)) / 1000.0"
            " FROM dbos.workflow_status WHERE name = %s AND status = 'SUCCESS'",
            (name,),
        )
        row = await cur.fetchone()
        return float(row[0]) if row and row[0] is not None else float("nan")

    def cancel_left() -> None:
        left = DBOS.list_workflows(status=["ENQUEUED", "PENDING"])
        DBOS.cancel_workflows([w.workflow_id for w in left])

    three_name = three.__qualname__
    n = args.dbos_n

    async def run_three() -> dict[str, Any]:
        started = time.perf_counter()

        def starter(first: int) -> None:
            assert queue is not None
            for i in range(first, n, args.starters):
                queue.enqueue(three, i)

        await asyncio.gather(*(asyncio.to_thread(starter, k) for k in range(args.starters)))
        starts_s = time.perf_counter() - started
        reached = await by_name.until(n, started, args.dbos_timeout, three_name)
        return {**reached.as_dict(), "starts_s": starts_s}

    result, spent = await meter.measure(run_three, by_name)
    out["three"] = {**result, **spent, "db_s": await db_span(three_name), "n": n}
    print(f"dbos three steps: {out['three']['s']:.2f} s", file=sys.stderr, flush=True)
    if out["three"]["cut"]:
        # What is left would run on into the next case: stop it.
        await asyncio.to_thread(cancel_left)

    async def run_fanout() -> dict[str, Any]:
        started = time.perf_counter()
        await asyncio.to_thread(DBOS.start_workflow, fanout, args.dbos_fanout)
        reached = await by_name.until(1, started, args.dbos_timeout, fanout.__qualname__)
        children, _ = await by_name.count(process_task.__qualname__)
        return {**reached.as_dict(), "children_done": children}

    result, spent = await meter.measure(run_fanout, by_name)
    out["fanout"] = {
        **result,
        **spent,
        "db_s": await db_span(fanout.__qualname__),
        "n": args.dbos_fanout,
    }
    print(f"dbos fan-out: {out['fanout']['s']:.2f} s", file=sys.stderr, flush=True)
    if out["fanout"]["cut"]:
        await asyncio.to_thread(cancel_left)

    out["idle"] = await meter.statements_per_s(args.idle_s)
    for i in range(SLEEPERS):
        await asyncio.to_thread(DBOS.start_workflow, sleeper, i)
    await asyncio.sleep(SETTLE_S)  # each sleeper has recorded its sleep
    out["idle_sleepers"] = {**await meter.statements_per_s(args.idle_s), "asleep": SLEEPERS}
    await watch_conn.close()
    await admin.close()
    return out


# -- the parent ------------------------------------------------------------------------


def run_side(side: str, admin_url: str, args: argparse.Namespace) -> dict[str, Any]:
    """One side in a child process of its own; its JSON result."""
    env = {**os.environ, URL_ENV: db_url(admin_url, DB[side]), ADMIN_URL_ENV: admin_url}
    command = [
        sys.executable,
        "-m",
        "bench.workflow_bench",
        "--side",
        side,
        "--n",
        str(args.n),
        "--fanout",
        str(args.fanout),
        "--dbos-n",
        str(args.dbos_n),
        "--dbos-fanout",
        str(args.dbos_fanout),
        "--idle-s",
        str(args.idle_s),
        "--concurrency",
        str(args.concurrency),
        "--starters",
        str(args.starters),
        "--dbos-poll",
        str(args.dbos_poll),
        "--dbos-timeout",
        str(args.dbos_timeout),
        *(["--profile", args.profile] if args.profile else []),
    ]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run(command, env=env, cwd=root, stdout=subprocess.PIPE, text=True)
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            return dict(json.loads(line.removeprefix(RESULT_MARK)))
    raise SystemExit(f"the {side} side exited {done.returncode} with no result")


def rate(case: dict[str, Any]) -> float:
    return float(case["done"]) / float(case["s"]) if case["s"] else 0.0


def report(results: dict[str, dict[str, Any]]) -> str:
    lines: list[str] = []
    shoal, dbos = results.get("shoal"), results.get("dbos")
    lines.append("\n== three no-op steps per workflow, started one call each by concurrent callers")
    for side, r in results.items():
        c = r["three"]
        cut = f" CUT OFF after {c['s']:.0f} s: {c['done']:,} of {c['n']:,} done" if c["cut"] else ""
        lines.append(
            f"{side:5}  N={c['n']:,}: {c['s']:.2f} s (database clock {c['db_s']:.2f} s), "
            f"{rate(c):,.0f} workflows/s; starts took {c['starts_s']:.2f} s{cut}"
        )
    if shoal and dbos:
        ratio = rate(shoal["three"]) / rate(dbos["three"]) if rate(dbos["three"]) else 0.0
        lines.append(f"ratio (workflows/s, shoal / DBOS): {ratio:.1f}x")
    lines.append("\n== one workflow fanning out N no-op items, start to the parent's completion ==")
    for side, r in results.items():
        c = r["fanout"]
        extra = ""
        if side == "dbos":
            extra = f"; {c.get('children_done', 0):,} children done"
            if c["cut"]:
                extra += f"; CUT OFF after {c['s']:.0f} s"
        lines.append(
            f"{side:5}  N={c['n']:,}: {c['s']:.2f} s (database clock {c['db_s']:.2f} s), "
            f"{c['n'] / c['s']:,.0f} items/s{extra}"
        )
    if shoal and dbos:
        s, d = shoal["fanout"], dbos["fanout"]
        d_rate = (d.get("children_done", 0) if d["cut"] else d["n"]) / d["s"]
        ratio = (s["n"] / s["s"]) / d_rate if d_rate else 0.0
        lines.append(f"ratio (items/s, shoal / DBOS): {ratio:.1f}x")
    lines.append("\n== per step, three-step case (everything in the window / 3N) ==")
    for side, r in results.items():
        c = r["three"]
        steps = 3 * c["done"]
        if not steps:
            continue
        lines.append(
            f"{side:5}  commits/step {c['commits'] / steps:.2f}, statements/step "
            f"{c['statements'] / steps:.2f}, WAL bytes/step {c['wal_bytes'] / steps:,.0f}, "
            f"server CPU µs/step {1e6 * (c['server_cpu_s'] or 0) / steps:,.0f}"
        )
        lines.append(
            f"         statements by kind, per step, and their execution time (pg_stat_statements;"
            f" all: {1000 * (c['exec_ms'] or 0) / steps:,.0f} µs/step):"
        )
        for query, calls, ms in c["by_kind"]:
            lines.append(f"         {calls / steps:6.3f}/step {1000 * ms / steps:6.0f} µs  {query}")
    lines.append(f"\n== idle: statements/s, worker idle, then with {SLEEPERS} workflows asleep ==")
    for side, r in results.items():
        a, b = r["idle"], r["idle_sleepers"]
        lines.append(
            f"{side:5}  without sleepers {a['per_s']:.1f}/s ({a['statements']} in "
            f"{a['window_s']:.0f} s); with {b['asleep']} asleep {b['per_s']:.1f}/s "
            f"({b['statements']} in {b['window_s']:.0f} s); added {b['per_s'] - a['per_s']:+.1f}/s"
        )
        for query, calls in b["by_kind"]:
            lines.append(f"         {calls:6d}  {query}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help=f"N = {N_QUICK:,}, idle windows 5 s")
    parser.add_argument("--n", type=int, default=None, help="workflows of three steps")
    parser.add_argument("--fanout", type=int, default=None, help="items of the fan-out")
    parser.add_argument("--dbos-n", type=int, default=None, help="DBOS's N (default: --n)")
    parser.add_argument("--dbos-fanout", type=int, default=None, help="default: --fanout")
    parser.add_argument("--idle-s", type=float, default=None, help="each idle window, seconds")
    parser.add_argument("--sides", default=",".join(SIDES), help="shoal,dbos")
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY)
    parser.add_argument(
        "--starters", type=int, default=STARTERS, help="callers starting the N workflows at once"
    )
    parser.add_argument("--dbos-poll", type=float, default=DBOS_POLL_S)
    parser.add_argument("--dbos-timeout", type=float, default=DBOS_TIMEOUT_S)
    parser.add_argument(
        "--profile",
        metavar="PATH",
        help="cProfile the shoal side's process (driver and worker) during the three-step case",
    )
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # a child's part
    args = parser.parse_args(argv)
    n = N_QUICK if args.quick else N_FULL
    args.n = args.n or n
    args.fanout = args.fanout or n
    args.dbos_n = args.dbos_n or args.n
    args.dbos_fanout = args.dbos_fanout or args.fanout
    args.idle_s = args.idle_s or (IDLE_QUICK_S if args.quick else IDLE_FULL_S)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.side:
        side = shoal_side if args.side == "shoal" else dbos_side
        out = asyncio.run(side(os.environ[URL_ENV], os.environ[ADMIN_URL_ENV], args))
        print(RESULT_MARK + json.dumps(out), flush=True)
        # DBOS's sleepers hold executor threads that the interpreter would join.
        os._exit(0)
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if set(sides) - set(SIDES):
        raise SystemExit(f"--sides: choose from {', '.join(SIDES)}, got {args.sides!r}")
    own = OwnServer(own_server_settings(), prefix="shoal-wf-bench-")
    own.start()
    try:
        with psycopg.connect(own.url, autocommit=True) as conn:
            for side in sides:
                conn.execute(f"CREATE DATABASE {DB[side]}")
        print(
            f"shoal workflow bench: N={args.n:,} (DBOS {args.dbos_n:,}), fan-out "
            f"{args.fanout:,} (DBOS {args.dbos_fanout:,}), concurrency {args.concurrency}, "
            f"{args.starters} starters, "
            f"DBOS queue polling {args.dbos_poll} s, idle windows {args.idle_s:.0f} s",
            flush=True,
        )
        print(f"server: {own.describe()}", flush=True)
        print(describe(own.url), flush=True)
        from importlib.metadata import version

        versions = ", ".join(f"{p} {version(p)}" for p in ("dbos", "psycopg", "sqlalchemy"))
        print(f"versions: {versions}", flush=True)
        started = time.perf_counter()
        results = {side: run_side(side, own.url, args) for side in sides}
        print(f"\n(measured in {time.perf_counter() - started:.0f} s)")
        print(report(results))
        print(f"\nload average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        own.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
