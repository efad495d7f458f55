"""A SIGKILLed worker's jobs and batch items run again within seconds, not after expire_in.

The jobs keep the default expire_in (15 minutes): before the rescue by
heartbeat they stayed active, held by the dead process, for all of it.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal import Shoal
from shoal.batch.states import ItemStatus, TaskStatus
from tests.conftest import wait_for
from tests.rescueapp import JOB_QUEUE, KIND, app
from tests.test_processes import START_TIMEOUT_S, WorkerProcesses, rows

JOBS = ITEMS = 10
# Short, so the test does not wait out the 60 s default, yet a live process
# still heartbeats four times within it (a loaded machine stalls it for
# less). Set through the worker's environment (SHOAL_RESCUE_AFTER, the
# --rescue-after flag's). The items' zombie timeout is as short
# (tests/rescueapp.py).
RESCUE_AFTER_S = "6"
# The bound: every job and item runs again within this after the kill.
RESCUED_WITHIN_S = 90


@pytest.fixture
def workers(db_url: str, tmp_path: Path) -> Iterator[WorkerProcesses]:
    procs = WorkerProcesses(db_url, tmp_path, app="tests.rescueapp:app")
    try:
        yield procs
    finally:
        procs.cleanup()


async def runs(client: Shoal) -> list[tuple[Any, ...]]:
    exists = await rows(client, "SELECT to_regclass('public.rescue_run') IS NOT NULL")
    if not exists[0][0]:
        return []
    return await rows(client, "SELECT kind, id, attempt, pid FROM public.rescue_run ORDER BY at")


@pytest.mark.slow
async def test_jobs_and_items_of_a_killed_worker_run_again_promptly_and_end_once(
    observer: Shoal, workers: WorkerProcesses
) -> None:
    job_ids = []
    for i in range(JOBS):
        job_id = await observer.send(JOB_QUEUE, {"i": i}, retry_delay=0)
        assert job_id is not None
        job_ids.append(job_id)
    batches = app.batches(observer)
    task = await batches.create(KIND, [{"ref": f"doc-{i}", "data": {}} for i in range(ITEMS)])

    settings = {"SHOAL_RESCUE_AFTER": RESCUE_AFTER_S}
    workers.env = settings | {"RESCUEAPP_BLOCK": "1"}
    first = workers.start()

    async def all_in_flight() -> bool:
        return len(await runs(observer)) == JOBS + ITEMS

    await wait_for(all_in_flight, timeout_s=START_TIMEOUT_S * 2, interval_s=0.1)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    loop = asyncio.get_running_loop()
    killed_at = loop.time()
    workers.env = settings
    second = workers.start()

    async def all_done() -> bool:
        states = [(await observer.get_job(i)).state for i in job_ids]
        view = await batches.get(task.task_id)
        return states == ["completed"] * JOBS and view.status is not TaskStatus.PROCESSING

    try:
        await wait_for(all_done, timeout_s=RESCUED_WITHIN_S, interval_s=0.25)
    except AssertionError:
        states = [(await observer.get_job(i)).state for i in job_ids]
        view = await batches.get(task.task_id)
        raise AssertionError(
            f"not all run again within {RESCUED_WITHIN_S}s of the kill: jobs {states}, "
            f"items {view.progress}"
        ) from None
    assert loop.time() - killed_at < RESCUED_WITHIN_S

    by_run: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for kind, run_id, attempt, pid in await runs(observer):
        by_run.setdefault((kind, run_id), []).append((attempt, pid))
    for job_id in job_ids:
        # Started once by each process; completed once, by the second.
        assert [pid for _, pid in by_run[("job", job_id)]] == [first.pid, second.pid]
        record = await observer.get_job(job_id)
        assert record.output == {"pid": second.pid}
        (note,) = record.errors
        assert note.type == "WorkerGone" and f"pid {first.pid}" in note.message, note
    items = await batches.export_rows(task.task_id)
    assert len(items) == ITEMS
    for item in items:
        assert item.status is ItemStatus.COMPLETED
        assert item.result == {"pid": second.pid}
        assert [pid for _, pid in by_run[("item", item.id)]] == [first.pid, second.pid]
    gone = await rows(observer, "SELECT rescued FROM shoal.worker WHERE pid = %s", (first.pid,))
    assert gone == [(JOBS,)]
