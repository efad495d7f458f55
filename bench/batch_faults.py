"""Batch fault run: a 5,000-item task across two worker processes, one SIGKILLed three times.

    .venv/bin/python -m bench.batch_faults                 # 5,000 items, 3 kills
    .venv/bin/python -m bench.batch_faults --items 2000 --kills 1

Two ``shoal worker`` processes run the task's items (each run records a side
effect in a table of its own, then sleeps a few milliseconds); one of them is
SIGKILLed mid-task three times, and started again each time. The kind's
zombie timeout is 2 s, so the aggregator reaps the killed runs (and sweeps
for orphans) while the task runs. At the end the script checks that every
item ended exactly once (completed, one recorded result, and run again only
where a killed process had it), and prints the deadlocks seen: ``deadlock
detected`` lines in the workers' logs, and the server's count
(``pg_stat_database.deadlocks`` of the database, before and after).

A fresh database ``shoal_batch_faults`` is created on the server of
DATABASE_URL (default: the local server). This is a measurement script, not a
test: it prints what it saw and exits 1 when an item did not end exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import sys
import tempfile
import time
from collections import defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from shoal import App, Shoal
from shoal.batch.item import Item

ROOT = Path(__file__).parent.parent
DB_NAME = "shoal_batch_faults"
KIND = "faults.item"
ZOMBIE_TIMEOUT = timedelta(seconds=2)
RUN_MS = 5  # each run's sleep: long enough that a kill finds runs in flight
READY_MARK = "running "


app = App()


@app.batch(
    KIND,
    concurrency=16,
    retry_limit=5,
    retry_delay=timedelta(milliseconds=100),
    zombie_timeout=ZOMBIE_TIMEOUT,
)
async def run_item(item: Item) -> dict[str, Any]:
    await _side_effect(item)
    await asyncio.sleep(RUN_MS / 1000)
    return {"pid": os.getpid()}


_boss: list[Shoal] = []


@app.on_start
async def remember(boss: Shoal) -> None:
    _boss.append(boss)
    await boss.db.fetch(
        "CREATE TABLE IF NOT EXISTS public.side_effect ("
        " item_id bigint NOT NULL, attempt int NOT NULL, pid int NOT NULL,"
        " at timestamptz NOT NULL DEFAULT clock_timestamp())",
        None,
    )


async def _side_effect(item: Item) -> None:
    await _boss[0].db.fetch(
        "INSERT INTO public.side_effect (item_id, attempt, pid) VALUES (%s, %s, %s)",
        (item.id, item.attempt, os.getpid()),
    )


class Worker:
    """One ``shoal worker`` process, its stderr kept in a file."""

    def __init__(self, name: str, url: str, log_dir: str) -> None:
        self.name = name
        self.url = url
        self.log_path = os.path.join(log_dir, f"{name}.stderr")
        self.proc: asyncio.subprocess.Process | None = None
        self.pids: list[int] = []

    async def start(self) -> None:
        log = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                *("-m", "shoal.cli", "worker", "--app", "bench.batch_faults:app"),
                *("--grace", "5"),
                cwd=ROOT,
                env=dict(os.environ, DATABASE_URL=self.url),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=log,
            )
        finally:
            os.close(log)
        self.pids.append(self.proc.pid)
        deadline = time.monotonic() + 30
        # App.run logs "running N worker(s): ..." once its workers are started.
        while self._ready_lines() < len(self.pids):
            if self.proc.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} never became ready; see {self.log_path}")
            await asyncio.sleep(0.05)

    def _ready_lines(self) -> int:
        text = Path(self.log_path).read_text(errors="replace")
        return sum(1 for line in text.splitlines() if READY_MARK in line and "worker(s)" in line)

    async def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 15)
            except TimeoutError:
                self.proc.send_signal(signal.SIGKILL)
                await self.proc.wait()

    def deadlocks_logged(self) -> int:
        return Path(self.log_path).read_text(errors="replace").count("deadlock detected")

    def logged_counts(self, pattern: str) -> int:
        """The sum of the numbers logged in lines like ``pattern``."""
        found = re.findall(pattern, Path(self.log_path).read_text(errors="replace"))
        return sum(int(n) for n in found)


async def fetch(url: str, query: str, *args: object) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(query, args or None)
        return await cur.fetchall()


async def server_deadlocks(admin_url: str) -> int:
    rows = await fetch(
        admin_url, "SELECT deadlocks FROM pg_stat_database WHERE datname = %s", DB_NAME
    )
    return int(rows[0][0]) if rows else 0


async def fresh_database(admin_url: str) -> str:
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (DB_NAME,)
        )
        await conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(DB_NAME)))
        await conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB_NAME)))
    return make_conninfo(admin_url, dbname=DB_NAME)


async def main(items: int, kills: int) -> int:
    admin_url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    url = await fresh_database(admin_url)
    log_dir = tempfile.mkdtemp(prefix="batch_faults_")
    boss = await Shoal.connect(url)  # migrates
    batches = app.batches(boss)
    victim, survivor = Worker("victim", url, log_dir), Worker("survivor", url, log_dir)
    deadlocks_before = await server_deadlocks(admin_url)
    started = time.monotonic()
    try:
        await victim.start()
        await survivor.start()
        created = await batches.create(KIND, [f"doc-{i}" for i in range(items)])
        task_id = created.task_id
        print(f"task {task_id}: {items} items; worker logs in {log_dir}")
        # Kill at evenly spaced points of progress, each with runs in flight.
        for k in range(kills):
            target = items * (k + 1) // (kills + 1)
            while (await batches.get(task_id)).progress.finished < target:  # noqa: ASYNC110 - the progress lives in another process's database rows
                await asyncio.sleep(0.05)
            await victim.kill()
            view = await batches.get(task_id)
            print(
                f"  SIGKILL {k + 1} at {time.monotonic() - started:.1f} s: "
                f"{view.progress.as_dict()}"
            )
            await victim.start()
        while (view := await batches.get(task_id)).status == "processing":
            if time.monotonic() - started > 300:
                print(f"the task did not close within 300 s: {view.progress.as_dict()}")
                return 1
            await asyncio.sleep(0.1)
        elapsed = time.monotonic() - started
    finally:
        await victim.stop()
        await survivor.stop()
        await boss.close()
    deadlocks_after = await server_deadlocks(admin_url)

    # Exactly once: every item completed with one recorded result, and run again
    # only where a killed process had it.
    rows = await fetch(url, "SELECT id, status::text, result FROM shoal.item")
    runs: dict[int, list[int]] = defaultdict(list)
    for item_id, pid in await fetch(url, "SELECT item_id, pid FROM side_effect ORDER BY at"):
        runs[item_id].append(pid)
    killed = set(victim.pids[:-1])
    bad: list[str] = []
    for item_id, status, result in rows:
        pids = runs.get(item_id, [])
        if status != "completed":
            bad.append(f"item {item_id} ended {status}")
        elif not pids or result["pid"] != pids[-1]:
            bad.append(f"item {item_id}: result from pid {result['pid']}, runs {pids}")
        elif any(pid not in killed for pid in pids[:-1]):
            bad.append(f"item {item_id} ran again after a run of a live process: {pids}")
    reruns = sum(len(p) - 1 for p in runs.values())
    logged = victim.deadlocks_logged() + survivor.deadlocks_logged()
    print(
        f"view: {view.outcome} {view.progress.as_dict()} in {elapsed:.1f} s; "
        f"{reruns} re-run(s) of items a killed worker held"
    )
    print(f"items ended exactly once: {'yes' if not bad else 'NO'} ({len(rows)} items)")
    for line in bad[:20]:
        print("  " + line)
    workers = (victim, survivor)
    reaped = sum(w.logged_counts(r"reaped (\d+) zombie item") for w in workers)
    swept = sum(w.logged_counts(r"re-sent jobs for (\d+) pending item") for w in workers)
    print(f"aggregator: {reaped} zombie item(s) reaped, {swept} orphan(s) re-sent by the sweep")
    print(f"deadlocks in worker logs ('deadlock detected' lines): {logged}")
    print(
        f"deadlocks on the server (pg_stat_database.deadlocks of {DB_NAME}): "
        f"{deadlocks_after - deadlocks_before} ({deadlocks_before} -> {deadlocks_after})"
    )
    return 1 if bad or len(rows) != items else 0


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=5000)
    parser.add_argument("--kills", type=int, default=3)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(asyncio.run(main(args.items, args.kills)))


if __name__ == "__main__":
    cli()
