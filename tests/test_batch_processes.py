"""Batch tasks across real worker processes, one of them killed mid-task."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import psycopg
import pytest

from shoal import Shoal
from shoal.batch.states import ItemStatus, TaskStatus

from .batchapp import app

ROOT = Path(__file__).parent.parent


def start_worker(db_url: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shoal.cli",
            "--database-url",
            db_url,
            "worker",
            "--app",
            "tests.batchapp:app",
            "--grace",
            "5",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def rows(db_url: str, query: str) -> list[tuple[object, ...]]:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        try:
            cur = await conn.execute(query)
        except psycopg.errors.UndefinedTable:
            return []
        return await cur.fetchall()


@pytest.mark.slow
async def test_sigkilled_worker_items_are_retried_and_each_result_recorded_once(
    db_url: str,
) -> None:
    boss = await Shoal.connect(db_url)
    batches = app.batches(boss)
    created = await batches.create(
        "proc.batch", [{"ref": f"doc-{i}", "data": {"sleep_ms": 400}} for i in range(40)]
    )
    first = start_worker(db_url)
    second: subprocess.Popen[bytes] | None = None
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        # Wait until some items finished and others are mid-run in the first worker.
        while True:
            finished = (await batches.get(created.task_id)).progress.completed
            started = await rows(db_url, "SELECT count(*) FROM side_effect")
            if finished >= 8 and started and started[0][0] > finished:  # type: ignore[operator]
                break
            assert loop.time() < deadline, "the first worker never got going"
            await asyncio.sleep(0.02)  # noqa: TID251 - polls a worker process (killed below)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
        killed_pid = first.pid
        second = start_worker(db_url)
        deadline = loop.time() + 60
        while (await batches.get(created.task_id)).status is TaskStatus.PROCESSING:
            if loop.time() > deadline:
                stuck = await rows(
                    db_url,
                    "SELECT i.id, i.status, i.attempt, i.updated_at, j.state, j.attempt, "
                    "j.singleton_key, j.start_after FROM shoal.item i LEFT JOIN shoal.job j "
                    "ON j.data->>'item' = i.id::text WHERE i.status NOT IN ('completed')",
                )
                raise AssertionError(f"the task never completed after the kill: {stuck}")
            await asyncio.sleep(0.1)  # noqa: TID251 - polls the restarted worker process
        view = await batches.get(created.task_id)
        assert view.progress.completed == 40 and view.progress.error == 0
        items = {i.id: i for i in await batches.export_rows(created.task_id)}
        assert all(i.status is ItemStatus.COMPLETED for i in items.values())
        runs_by_item: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for item_id, attempt, pid in await rows(
            db_url, "SELECT item_id, attempt, pid FROM side_effect ORDER BY at"
        ):
            runs_by_item[item_id].append((attempt, pid))  # type: ignore[index, arg-type]
        rerun = {item_id for item_id, seen in runs_by_item.items() if len(seen) > 1}
        assert rerun, "the kill interrupted no item; the test proved nothing"
        for item_id, item in items.items():
            runs = runs_by_item[item_id]
            result_pid = item.result["pid"]
            if item_id in rerun:
                # Only items whose worker died before recording a result ran again.
                assert [pid for _, pid in runs[:-1]] == [killed_pid] * (len(runs) - 1)
                assert result_pid == runs[-1][1] != killed_pid
            else:
                # Ran once. (Its attempt may be 2: the killed worker had claimed
                # and guarded it without starting it, and died holding it.)
                assert [pid for _, pid in runs] == [result_pid]
        assert sum(len(r) for r in runs_by_item.values()) == 40 + sum(
            len(runs_by_item[i]) - 1 for i in rerun
        )
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(15)
        await boss.close()
