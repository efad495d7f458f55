"""Batch fairness: a 10-item task created while a 100,000-item task of the same kind runs.

    .venv/bin/python -m bench.batch_fairness              # 100,000 + 10 items, 2 repetitions
    .venv/bin/python -m bench.batch_fairness --big 20000 --reps 1

One ``shoal worker`` process runs a no-op kind (concurrency 10). Each
repetition measures, in turn:

- alone: the big task by itself;
- shared: the big task, and once its first items are done, the small task.

Reported: the small task's time from its creation to its close (the target is
under 2 s), and the big task's time from its creation to its close in both
runs (the target: shared within 5% of alone), both by the database clock. The
tables are emptied and the worker started afresh before each run. Without
fair claims the small task's jobs would queue behind every job of the big
task still waiting.

A fresh database ``shoal_batch_fairness`` is created on the server of
DATABASE_URL (default: the local server). This is a measurement script, not a
test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from shoal import App, Shoal
from shoal.batch.item import Item

ROOT = Path(__file__).parent.parent
DB_NAME = "shoal_batch_fairness"
KIND = "fair.noop"

app = App()
# Readers of the workers' stderr (kept so they are not collected mid-read).
_DRAINS: set[asyncio.Task[None]] = set()


@app.batch(KIND, concurrency=10)
async def noop(item: Item) -> None:
    return None


async def fresh_database(admin_url: str) -> str:
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (DB_NAME,)
        )
        await conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(DB_NAME)))
        await conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB_NAME)))
    return make_conninfo(admin_url, dbname=DB_NAME)


async def start_worker(url: str) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "shoal.cli", "worker", "--app", "bench.batch_fairness:app", "--grace", "5"),
        cwd=ROOT,
        env=dict(os.environ, DATABASE_URL=url),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    # App.run logs "running N worker(s): ..." once its workers are started.
    while b"worker(s)" not in await asyncio.wait_for(proc.stderr.readline(), 30):
        if proc.returncode is not None:
            raise RuntimeError("the worker exited before it started")
    drain = asyncio.create_task(_drain(proc))
    _DRAINS.add(drain)
    drain.add_done_callback(_DRAINS.discard)
    return proc


async def _drain(proc: asyncio.subprocess.Process) -> None:
    assert proc.stderr is not None
    async for _ in proc.stderr:
        pass


async def stop_worker(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)


async def empty_tables(url: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(
            "TRUNCATE shoal.task, shoal.item, shoal.item_tally, shoal.job, shoal.job_archive"
        )


async def closed_in(boss: Shoal, task_id: str) -> float:
    """Seconds from the task's creation to its close (database clock), once closed."""
    rows = await boss.db.fetch(
        "SELECT created_at, completed_at FROM shoal.task WHERE id = %s::uuid", (task_id,)
    )
    created_at, completed_at = rows[0]
    assert isinstance(created_at, datetime) and isinstance(completed_at, datetime)
    return (completed_at - created_at).total_seconds()


async def wait_closed(boss: Shoal, task_id: str) -> None:
    batches = app.batches(boss)
    while (await batches.get(task_id)).status == "processing":  # noqa: ASYNC110 - the worker is another process
        await asyncio.sleep(0.05)


async def run(url: str, big: int, small: int, *, shared: bool) -> tuple[float, float | None]:
    await empty_tables(url)
    worker = await start_worker(url)
    boss = await Shoal.connect(url)
    batches = app.batches(boss)
    try:
        big_task = await batches.create(KIND, [f"big-{i}" for i in range(big)])
        small_s = None
        if shared:
            # Once the big task is under way (its first items done).
            while (await batches.get(big_task.task_id)).progress.completed < min(1000, big // 10):  # noqa: ASYNC110 - the worker is another process
                await asyncio.sleep(0.02)
            small_task = await batches.create(KIND, [f"small-{i}" for i in range(small)])
            await wait_closed(boss, small_task.task_id)
            small_s = await closed_in(boss, small_task.task_id)
            left = (await batches.get(big_task.task_id)).progress
            print(
                f"    small task closed in {small_s:.3f} s; the big one then had "
                f"{left.pending + left.running} items left"
            )
        await wait_closed(boss, big_task.task_id)
        return await closed_in(boss, big_task.task_id), small_s
    finally:
        await boss.close()
        await stop_worker(worker)


async def main(big: int, small: int, reps: int) -> None:
    admin_url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    url = await fresh_database(admin_url)
    await (await Shoal.connect(url)).close()  # migrates
    print(
        f"batch fairness: a {big:,}-item task, and a {small}-item task of the same kind "
        f"created once its first items are done; {reps} repetition(s); "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    alone: list[float] = []
    shared: list[float] = []
    smalls: list[float] = []
    started = time.monotonic()
    for rep in range(reps):
        big_s, _ = await run(url, big, small, shared=False)
        alone.append(big_s)
        print(f"  rep {rep + 1} alone:  big task closed in {big_s:.2f} s")
        big_s, small_s = await run(url, big, small, shared=True)
        shared.append(big_s)
        assert small_s is not None
        smalls.append(small_s)
        print(f"  rep {rep + 1} shared: big task closed in {big_s:.2f} s")
    a, s, m = statistics.median(alone), statistics.median(shared), statistics.median(smalls)
    print(
        f"medians: small task {m:.3f} s (target < 2 s: {'met' if m < 2 else 'NOT met'}); "
        f"big task alone {a:.2f} s, shared {s:.2f} s, {100 * (s - a) / a:+.1f}% "
        f"(target within 5%: {'met' if abs(s - a) / a < 0.05 else 'NOT met'}); "
        f"measured in {time.monotonic() - started:.0f} s, load average {os.getloadavg()[0]:.2f}"
    )


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--big", type=int, default=100_000)
    parser.add_argument("--small", type=int, default=10)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    asyncio.run(main(args.big, args.small, args.reps))


if __name__ == "__main__":
    cli()
