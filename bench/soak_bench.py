"""Soak: batch tasks created at a steady half of the maximum rate for an hour, nothing lost.

    .venv/bin/python -m bench.soak_bench                     # 60 minutes, a server of its own
    .venv/bin/python -m bench.soak_bench --minutes 10
    .venv/bin/python -m bench.soak_bench --rate 3000         # items/s, no probe
    .venv/bin/python -m bench.soak_bench --server url        # on DATABASE_URL's server

The bar (issue 18): at half the maximum rate, for the whole run, nothing is
lost and latency stays flat, minute after minute, with the worker processes'
RSS flat too.

What it does, on a throwaway PostgreSQL cluster with initdb's defaults
(autovacuum on, as a default installation has it; bench/million_bench.py's
``Server``) unless ``--server url``:

1. starts 2 ``shoal worker --app bench.batch_bench:app`` processes (a no-op
   handler, concurrency 10 each) and probes their maximum rate: one task of
   ``--probe-items`` items, from the start of its create call to its close
   (the load creates what it runs, on the same cores);
2. for ``--minutes``, creates one task every ``--tick`` seconds holding
   ``rate x tick`` items, ``rate`` being ``--load`` (0.5) of the probed
   maximum, or ``--rate``; a tick that falls behind is caught up at once
   and counted as late;
3. stops creating, waits until every task has closed, and checks that
   nothing was lost or run twice: every task closed ``completed``, its items
   all ``completed``, each guarded once (``attempt = 1``), no phantom skip.

Per minute it reports: items created and finished per second; item latency
(the item's ``finished_at`` minus its task's ``created_at``, by the database
clock) p50 and p99 of the items finished in that minute; create call p50 and
p99 (the parent's wall clock); each worker's RSS at the minute's end; the
item and job tables' size and dead tuples. Then the verdict: the worst
minute's p99 against the median minute's, and RSS growth.

This is a measurement script, not a test (not in CI).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

if not __package__:  # run as a file: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.batch_bench import KIND, _kill_live_children, shoal_app
from bench.million_bench import (
    COMMIT_PROBE_S,
    RssTrack,
    Server,
    commit_rate,
    has_statements,
    machine_line,
    settings_line,
    start_workers,
    stop_workers,
    top_statements,
)
from bench.queue_bench import shoal_version

BENCH_DB = "shoal_soak"
WORKERS = 2
DEFAULT_MINUTES = 60.0
DEFAULT_LOAD = 0.5
PROBE_ITEMS = 100_000
TICK_S = 1.0
DRAIN_TIMEOUT_S = 300.0
# Latency is "flat" when no minute's p99 is more than this many times the
# median minute's.
FLAT_P99_RATIO = 2.0
RSS_FLAT_SHARE = 0.10
STATS_EVERY_S = 60.0

# Per minute of the run (by the database clock, from its start): items
# finished, and their latency from their task's creation.
LATENCY_SQL = """
SELECT floor(extract(epoch FROM i.finished_at - %(t0)s::timestamptz) / %(minute)s)::int AS m,
       count(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY l.s),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY l.s)
FROM shoal.item i JOIN shoal.task t ON t.id = i.task_id,
     LATERAL (SELECT extract(epoch FROM i.finished_at - t.created_at) AS s) l
WHERE t.created_at >= %(t0)s::timestamptz AND i.finished_at IS NOT NULL
GROUP BY 1 ORDER BY 1
"""

LOST_SQL = """
SELECT
  (SELECT count(*) FROM shoal.task WHERE created_at >= %(t0)s),
  (SELECT count(*) FROM shoal.task WHERE created_at >= %(t0)s AND outcome = 'completed'),
  (SELECT coalesce(sum(total), 0) FROM shoal.task WHERE created_at >= %(t0)s),
  (SELECT count(*) FROM shoal.item i JOIN shoal.task t ON t.id = i.task_id
    WHERE t.created_at >= %(t0)s),
  (SELECT count(*) FROM shoal.item i JOIN shoal.task t ON t.id = i.task_id
    WHERE t.created_at >= %(t0)s AND i.status = 'completed' AND i.attempt = 1),
  (SELECT coalesce(sum(value), 0) FROM shoal.counter
    WHERE name IN ('phantom_skips', 'cancelled_skips'))
"""

TABLES_SQL = """
SELECT relname, n_dead_tup, n_live_tup, pg_total_relation_size(relid), autovacuum_count
FROM pg_stat_user_tables WHERE schemaname = 'shoal' AND relname IN ('item', 'job')
ORDER BY relname
"""


@dataclass
class Minute:
    created: int = 0
    creates_ms: list[float] = field(default_factory=list)
    late: int = 0
    tables: str = ""


@dataclass
class Soak:
    rate: float
    tick_s: float
    minute_s: float = 60.0
    minutes: dict[int, Minute] = field(default_factory=dict)

    def minute(self, t: float) -> Minute:
        return self.minutes.setdefault(int(t // self.minute_s), Minute())


@dataclass
class Probe:
    """The workers' maximum on one task of ``n`` items."""

    n: int
    create_s: float
    drain_s: float

    @property
    def rate(self) -> float:
        """Items per second through the whole cycle the soak runs: create, then drain."""
        return self.n / (self.create_s + self.drain_s)

    @property
    def drain_rate(self) -> float:
        return self.n / self.drain_s


async def probe(batches: Any, n: int) -> Probe:
    """Create a task of ``n`` items and time its create call and its drain to the close.

    The soak's load creates every item it runs, on the same server and cores
    as the workers, so its maximum counts the create too: the drain's rate
    alone (what this probe measured before) overstated it, and half of it
    left the workers behind within minutes.
    """
    from shoal.batch.states import TaskStatus

    began = time.perf_counter()
    created = await batches.create(KIND, [f"probe-{i}" for i in range(n)])
    start = time.perf_counter()
    while (await batches.get(created.task_id)).status is TaskStatus.PROCESSING:  # noqa: ASYNC110 - the state is in the database
        await asyncio.sleep(0.2)
    return Probe(n, start - began, time.perf_counter() - start)


async def table_stats(conn: psycopg.AsyncConnection[Any]) -> str:
    cur = await conn.execute(TABLES_SQL)
    parts = []
    for name, dead, live, size, vacuums in await cur.fetchall():
        parts.append(f"{name} {size / 2**20:,.0f} MiB dead {dead:,} live {live:,} av {vacuums}")
    return "; ".join(parts)


async def produce(
    soak: Soak, batches: Any, conn: psycopg.AsyncConnection[Any], minutes: float
) -> None:
    """One task every tick for ``minutes``, on a fixed schedule (late ticks caught up)."""
    per_task = max(1, round(soak.rate * soak.tick_s))
    start = time.perf_counter()
    end = start + minutes * 60
    tick = 0
    next_stats = start + STATS_EVERY_S
    while True:
        due = start + tick * soak.tick_s
        if due >= end:
            return
        now = time.perf_counter()
        if now < due:
            await asyncio.sleep(due - now)
        elif now - due > soak.tick_s:
            soak.minute(now - start).late += 1
        refs = [f"t{tick}-{i}" for i in range(per_task)]
        at = time.perf_counter()
        await batches.create(KIND, refs)
        done = time.perf_counter()
        m = soak.minute(at - start)
        m.created += per_task
        m.creates_ms.append((done - at) * 1000)
        if done >= next_stats:
            next_stats += STATS_EVERY_S
            m.tables = await table_stats(conn)
            still_open, oldest_s = await open_tasks(conn)
            print(
                f"  {done - start:6.0f} s: {tick + 1:,} tasks, {still_open:,} open (oldest "
                f"{oldest_s:,.0f} s); load {os.getloadavg()[0]:.2f}; {m.tables}",
                flush=True,
            )
        tick += 1


OPEN_TASKS_SQL = """
    SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)
    FROM shoal.task WHERE status = 'processing'
"""


async def open_tasks(conn: psycopg.AsyncConnection[Any]) -> tuple[int, float]:
    """Tasks not closed yet, and the age in seconds of the oldest (the backlog, cheaply)."""
    cur = await conn.execute(OPEN_TASKS_SQL)
    row = await cur.fetchone()
    return (0, 0.0) if row is None else (int(row[0]), float(row[1]))


async def wait_all_closed(conn: psycopg.AsyncConnection[Any]) -> float | None:
    """Seconds until every task closed, or None if some were still open after DRAIN_TIMEOUT_S."""
    start = time.perf_counter()
    while time.perf_counter() - start < DRAIN_TIMEOUT_S:
        if (await open_tasks(conn))[0] == 0:
            return time.perf_counter() - start
        await asyncio.sleep(0.5)
    return None


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


async def run(args: argparse.Namespace) -> int:
    from shoal import Shoal
    from shoal.batch.service import Batches

    with Server(args.server) as server:
        url = await server.fresh_database(BENCH_DB)
        boss = None
        workers = []
        sampler = None
        try:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
                cur = await c.execute("SELECT version()")
                version = (await cur.fetchone() or ("?",))[0]
                settings = await settings_line(c)
            rate_commits = await commit_rate(url)
            print(
                "\n".join(
                    [
                        f"shoal soak bench: {args.minutes:g} minutes, {WORKERS} worker processes",
                        f"{machine_line()}; commit rate {rate_commits:,.0f}/s (one connection, "
                        f"single-row INSERTs for {COMMIT_PROBE_S:.0f} s)",
                        f"server: {server.describe()}",
                        f"{version.split(',')[0]}; {settings}",
                        f"shoal: {shoal_version()}",
                    ]
                ),
                flush=True,
            )
            boss = await Shoal.connect(url, listen=False, application_name="soak_bench_parent")
            batches = Batches(boss, shoal_app().kinds, max_items=max(PROBE_ITEMS, 1_000_000))
            conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
            workers = await start_workers(url, WORKERS)
            if args.rate:
                maximum, rate = None, args.rate
            else:
                probed = await probe(batches, args.probe_items)
                maximum = probed.rate
                rate = maximum * args.load
            print(
                (
                    f"maximum {maximum:,.0f} items/s (probe of {args.probe_items:,} items: "
                    f"create {probed.create_s:.1f} s, drain {probed.drain_s:.1f} s, "
                    f"the drain alone {probed.drain_rate:,.0f} items/s); "
                    if maximum
                    else ""
                )
                + f"load {rate:,.0f} items/s: one task of {round(rate * args.tick):,} items "
                f"every {args.tick:g} s",
                flush=True,
            )
            soak = Soak(rate, args.tick)
            cur = await conn.execute("SELECT now()")
            t0 = (await cur.fetchone() or (None,))[0]
            start = time.perf_counter()
            track = RssTrack(workers, start)
            sampler = asyncio.create_task(track.run())
            await produce(soak, batches, conn, args.minutes)
            produced_s = time.perf_counter() - start
            drain_s = await wait_all_closed(conn)
            still_open, oldest_s = await open_tasks(conn)
            cur = await conn.execute(LATENCY_SQL, {"t0": t0, "minute": soak.minute_s})
            latency = {m: (n, p50, p99) for m, n, p50, p99 in await cur.fetchall()}
            cur = await conn.execute(LOST_SQL, {"t0": t0})
            lost_row = await cur.fetchone()
            assert lost_row is not None
            final_tables = await table_stats(conn)
            statements = await top_statements(conn, 8) if await has_statements(conn) else []
            cur = await conn.execute(
                "SELECT checkpoints_timed, checkpoints_req, checkpoint_write_time,"
                " checkpoint_sync_time FROM pg_stat_bgwriter"
            )
            checkpoints = await cur.fetchone()
            await conn.close()
        finally:
            if sampler is not None:
                sampler.cancel()
            await stop_workers(workers)
            logs = [
                (w.save_log(), [x for x in w.tail if "WARNING" in x or "ERROR" in x])
                for w in workers
            ]
            if boss is not None:
                await boss.close()
            await server.drop_database(BENCH_DB)

    print(f"\n(load average at end {', '.join(f'{x:.2f}' for x in os.getloadavg())})\n")
    print(
        f"{'min':>4} {'created/s':>9} {'done/s':>7} {'lat p50 ms':>10} {'lat p99 ms':>10} "
        f"{'create p50':>10} {'create p99':>10} {'late':>4}  "
        + "  ".join(f"w{i + 1} MiB" for i in range(WORKERS))
        + "  tables"
    )
    n_minutes = max([*soak.minutes, *latency, 0]) + 1
    p99s = []
    for m in range(n_minutes):
        mm = soak.minutes.get(m, Minute())
        done, p50, p99 = latency.get(m, (0, None, None))
        full = (m + 1) * soak.minute_s <= produced_s
        if full and p99 is not None:
            p99s.append(p99)
        rss = "  ".join(
            f"{track.at(i, (m + 1) * soak.minute_s) or 0:>6.1f}" for i in range(WORKERS)
        )
        print(
            f"{m + 1:>4} {mm.created / soak.minute_s:>9,.0f} {done / soak.minute_s:>7,.0f} "
            f"{(p50 or 0) * 1000:>10.0f} {(p99 or 0) * 1000:>10.0f} "
            f"{pct(mm.creates_ms, 0.5):>10.0f} {pct(mm.creates_ms, 0.99):>10.0f} {mm.late:>4}  "
            f"{rss}  {mm.tables}" + ("" if full else "  (not a full minute of load)")
        )
    tasks, completed_tasks, total, items, once, skips = lost_row
    lost = [
        (tasks == completed_tasks, f"tasks {tasks:,}, closed completed {completed_tasks:,}"),
        (items == total, f"items {items:,} of {total:,} sent"),
        (once == items, f"completed after exactly one run {once:,}"),
        (skips == 0, f"phantom or cancelled skips {skips}"),
        (
            drain_s is not None,
            f"tasks open {DRAIN_TIMEOUT_S:.0f} s after the load stopped {still_open:,} "
            f"(oldest created {oldest_s:,.0f} s before)",
        ),
    ]
    print("\nnothing lost: " + "; ".join(text for _, text in lost))
    failed = [text for ok, text in lost if not ok]
    if failed:
        print("FAILED: " + "; ".join(failed))
    if p99s:
        median = statistics.median(p99s)
        worst = max(p99s)
        flat = worst <= FLAT_P99_RATIO * median
        print(
            f"latency flat: worst full minute's p99 {worst * 1000:.0f} ms against the median "
            f"minute's {median * 1000:.0f} ms ({worst / median:.2f}x; bar {FLAT_P99_RATIO:g}x): "
            + ("met" if flat else "MISSED")
        )
    for i in range(WORKERS):
        first = track.at(i, soak.minute_s) or 0.0
        peak = track.peak(i, after=soak.minute_s)
        growth = peak / first - 1 if first else 0.0
        print(
            f"w{i + 1} RSS: {first:.1f} MiB after the first minute, peak after it {peak:.1f} MiB "
            f"({growth:+.1%}): " + ("flat" if growth <= RSS_FLAT_SHARE else "GREW")
        )
    if drain_s is not None:
        print(f"all tasks closed {drain_s:.1f} s after the load stopped")
    if checkpoints is not None:
        timed, requested, write_ms, sync_ms = checkpoints
        print(
            f"checkpoints: {timed} timed, {requested} requested; writing {write_ms / 1000:.0f} s, "
            f"syncing {sync_ms / 1000:.0f} s"
        )
    for i, (path, bad) in enumerate(logs):
        print(
            f"w{i + 1}: {len(bad)} warning or error lines in its last {len(workers[i].tail)} "
            f"(kept in {path})" + "".join(f"\n    {line[:160]}" for line in bad[:3])
        )
    if statements:
        print("where the server's time went (pg_stat_statements):")
        print("\n".join(statements))
    print(f"tables at the end: {final_tables}")
    return 1 if failed else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--minutes", type=float, default=DEFAULT_MINUTES, help="default 60")
    parser.add_argument("--load", type=float, default=DEFAULT_LOAD, help="share of the maximum")
    parser.add_argument("--rate", type=float, help="items/s (skips the probe)")
    parser.add_argument("--probe-items", type=int, default=PROBE_ITEMS)
    parser.add_argument("--tick", type=float, default=TICK_S, help="seconds between tasks")
    parser.add_argument("--server", choices=("own", "url"), default="own")
    args = parser.parse_args()
    if args.minutes <= 0 or args.tick <= 0 or not 0 < args.load <= 1:
        raise SystemExit("--minutes and --tick must be positive, --load in (0, 1]")

    async def main_async() -> int:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        return await run(args)

    try:
        code = asyncio.run(main_async())
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted: worker processes stopped", file=sys.stderr)
        code = 130
    finally:
        _kill_live_children()
    sys.exit(code)


if __name__ == "__main__":
    main()
