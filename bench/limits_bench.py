"""Limits across processes: what a limit costs the drain, and whether a rate holds.

    .venv/bin/python bench/limits_bench.py                   # 20,000 jobs, a 30 s rate run
    .venv/bin/python bench/limits_bench.py --n 100000 --rate-seconds 60

All in one run against one Postgres server, each scenario on a queue of its
own in a fresh ``shoal_limits_bench`` database, worked by ``--procs`` worker
processes (default 4) at concurrency 10 each, no-op handlers:

- unlimited: N jobs, no limits (claim_jobs_v5);
- global, not binding: the same with ``global_concurrency`` far above what the
  processes run at once (claim_limited_jobs_v2, one partition);
- 1,000 partitions of 1: N jobs spread evenly over 1,000 keys,
  ``global_concurrency=1, partition_by="k"``;
- rate: ``Rate(100, per=1 s, burst=10)`` held for ``--rate-seconds``, with
  more jobs waiting than the rate lets start; the figure is the starts per
  second over the run after its first second (the first second holds the
  burst), read from the jobs' ``started_at``.

The workers start (and declare their limits) before the jobs are sent; a
drain is timed from the start of the insert until the database shows every
job completed. This is a measurement script, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from shoal import Job, Rate, Shoal

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
BENCH_DB = "shoal_limits_bench"
CONCURRENCY = 10
PARTITIONS = 1000
RATE = 100
RATE_BURST = 10
DONE_POLL_S = 0.02
DRAIN_TIMEOUT_S = 300.0
URL_ENV = "SHOAL_BENCH_URL"


@dataclass(frozen=True)
class Scenario:
    name: str
    queue: str
    limits: dict[str, Any]


async def child(queue: str, limits_json: str) -> None:
    """A worker process: work ``queue`` with ``limits`` until stdin closes."""
    limits = json.loads(limits_json)
    if "rate" in limits:
        count, per_s, burst = limits.pop("rate")
        limits["rate_limit"] = Rate(count, per=timedelta(seconds=per_s), burst=burst)
    boss = await Shoal.connect(os.environ[URL_ENV], max_size=4)

    async def noop(job: Job) -> None:
        return None

    if limits:
        # Declared before the worker starts (it declares them again), so
        # every job the parent sends next is sent to a limited queue.
        await boss.declare_limits(queue, **limits)
    boss.work(queue, noop, concurrency=CONCURRENCY, **limits)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await boss.close()


def start_workers(url: str, scenario: Scenario, procs: int) -> list[subprocess.Popen[str]]:
    env = dict(os.environ, **{URL_ENV: url})
    children = [
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--child", scenario.queue,
             json.dumps(scenario.limits)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(procs)
    ]  # fmt: skip
    for proc in children:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != "ready":
            raise SystemExit(f"worker for {scenario.name} did not start: {line!r}")
    return children


def stop_workers(children: list[subprocess.Popen[str]]) -> None:
    for proc in children:
        assert proc.stdin is not None
        proc.stdin.close()
    for proc in children:
        proc.wait(timeout=60)


async def completed(boss: Shoal, queue: str) -> int:
    async with boss.db.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM shoal.job WHERE queue = %s AND state = 'completed'", (queue,)
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


async def drain(boss: Shoal, url: str, scenario: Scenario, n: int, procs: int) -> float:
    """Jobs per second for N jobs sent to ``scenario``'s running workers."""
    children = start_workers(url, scenario, procs)
    try:
        if "partition_by" in scenario.limits:
            payloads: list[Any] = [{"k": i % PARTITIONS} for i in range(n)]
        else:
            payloads = [None] * n
        started = time.perf_counter()
        for i in range(0, n, 10_000):
            await boss.insert_many(scenario.queue, payloads[i : i + 10_000])
        while await completed(boss, scenario.queue) < n:
            if time.perf_counter() - started > DRAIN_TIMEOUT_S:
                raise SystemExit(f"{scenario.name}: not drained in {DRAIN_TIMEOUT_S}s")
            await asyncio.sleep(DONE_POLL_S)
        return n / (time.perf_counter() - started)
    finally:
        stop_workers(children)


async def rate_run(boss: Shoal, url: str, seconds: float, procs: int) -> tuple[float, int]:
    """Starts per second under Rate(RATE/s) over ``seconds``, after the first (the burst)."""
    scenario = Scenario("rate", "lb_rate", {"rate": [RATE, 1.0, RATE_BURST]})
    children = start_workers(url, scenario, procs)
    try:
        await boss.insert_many(scenario.queue, [None] * int(RATE * seconds * 1.5))
        await asyncio.sleep(seconds + 0.5)
    finally:
        stop_workers(children)
    async with boss.db.connection() as conn:
        cur = await conn.execute(
            """
            WITH s AS (SELECT started_at FROM shoal.job WHERE queue = %s AND attempt > 0),
                 w AS (SELECT min(started_at) + interval '1 second' AS since FROM s)
            SELECT count(*) FILTER (WHERE started_at >= w.since
                                      AND started_at < w.since + %s * interval '1 second'),
                   count(*)
            FROM s, w GROUP BY w.since
            """,
            (scenario.queue, seconds - 1),
        )
        row = await cur.fetchone()
        assert row is not None
        return row[0] / (seconds - 1), int(row[1])


async def main(n: int, procs: int, rate_seconds: float) -> None:
    admin = os.environ.get("DATABASE_URL", DEFAULT_URL)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(BENCH_DB))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(BENCH_DB)))
    url = make_conninfo(admin, dbname=BENCH_DB)
    boss = await Shoal.connect(url, listen=False)
    load = os.getloadavg()
    print(f"{os.cpu_count()} cores, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"{procs} worker processes x concurrency {CONCURRENCY}; N={n}")  # fmt: skip
    try:
        scenarios = [
            Scenario("unlimited", "lb_unlimited", {}),
            Scenario("global, not binding", "lb_global", {"global_concurrency": 100_000}),
            Scenario(
                f"{PARTITIONS} partitions of 1",
                "lb_partitions",
                {"global_concurrency": 1, "partition_by": "k"},
            ),
        ]
        rates: dict[str, float] = {}
        for scenario in scenarios:
            rates[scenario.name] = await drain(boss, url, scenario, n, procs)
            base = rates["unlimited"]
            print(f"  drain {scenario.name:<24} {rates[scenario.name]:>8.0f} jobs/s"
                  f"  ({rates[scenario.name] / base:.0%} of unlimited)", flush=True)  # fmt: skip
        if rate_seconds > 1:
            achieved, started = await rate_run(boss, url, rate_seconds, procs)
            print(f"  rate {RATE}/s (burst {RATE_BURST}) over {rate_seconds - 1:.0f} s: "
                  f"{achieved:.1f} starts/s ({achieved / RATE - 1:+.1%}); "
                  f"{started} started in all")  # fmt: skip
    finally:
        await boss.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000, help="jobs per drain")
    parser.add_argument("--procs", type=int, default=4, help="worker processes")
    parser.add_argument(
        "--rate-seconds", type=float, default=30.0, help="length of the rate run (0: skip)"
    )
    parser.add_argument("--child", nargs=2, metavar=("QUEUE", "LIMITS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        asyncio.run(child(*args.child))
    else:
        asyncio.run(main(args.n, args.procs, args.rate_seconds))
