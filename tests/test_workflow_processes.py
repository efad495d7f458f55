"""Workflows across real worker processes: SIGKILL inside a step, and sleepers across restarts.

A finished step never runs again after a crash; the step that was running
when its process died runs again (at least once), but a step in the
checkpoint's transaction takes effect once: its writes died with the
transaction. Each worker is ``python -m shoal.cli worker --app
tests.workflowapp:app`` (tests/test_processes.py's WorkerProcesses).
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from shoal import Shoal
from shoal.workflow import RunStatus
from tests.conftest import wait_for
from tests.test_processes import START_TIMEOUT_S, WorkerProcesses, rows
from tests.workflowapp import app

# As tests/test_rescue_processes.py: a killed worker's jobs run again after
# this, not after their 15-minute lease.
RESCUE_AFTER_S = "6"
RESUMED_WITHIN_S = 90
SLEEPERS = 1000


@pytest.fixture
def workers(db_url: str, tmp_path: Path) -> Iterator[WorkerProcesses]:
    procs = WorkerProcesses(db_url, tmp_path, app="tests.workflowapp:app")
    try:
        yield procs
    finally:
        procs.cleanup()


async def effects(client: Shoal) -> list[tuple[Any, ...]]:
    exists = await rows(client, "SELECT to_regclass('public.wf_effect') IS NOT NULL")
    if not exists[0][0]:
        return []
    return await rows(client, "SELECT run, step, pid FROM public.wf_effect ORDER BY at")


def kill(proc: Any) -> int:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    return int(proc.pid)


async def finished(client: Shoal, run_id: str, timeout_s: float) -> Any:
    api = app.workflows(client)

    async def done() -> bool:
        return (await api.get(run_id)).status is RunStatus.COMPLETED

    await wait_for(done, timeout_s=timeout_s, interval_s=0.1)
    return await api.get(run_id)


@pytest.mark.slow
async def test_a_run_killed_inside_a_step_resumes_there_and_finished_steps_do_not_run_again(
    observer: Shoal, workers: WorkerProcesses
) -> None:
    run = await app.workflows(observer).start("crashy", id="killed-in-two")
    workers.env = {"SHOAL_RESCUE_AFTER": RESCUE_AFTER_S, "WORKFLOWAPP_BLOCK_AT": "two"}
    first = workers.start()

    async def inside_two() -> bool:
        return any(step == "two" for _, step, _ in await effects(observer))

    await wait_for(inside_two, timeout_s=START_TIMEOUT_S * 2, interval_s=0.1)
    killed = kill(first)
    workers.env = {"SHOAL_RESCUE_AFTER": RESCUE_AFTER_S}
    second = workers.start()
    view = await finished(observer, run.id, RESUMED_WITHIN_S)
    by_step = {
        step: [pid for _, s, pid in await effects(observer) if s == step]
        for step in ("one", "two", "three")
    }
    assert by_step["one"] == [killed]  # finished before the kill: not run again
    assert by_step["two"] == [killed, second.pid]  # under way at the kill: run again
    assert by_step["three"] == [second.pid]
    assert view.result == [killed, second.pid, second.pid]
    assert [s.attempts for s in view.steps] == [1, 1, 1]


@pytest.mark.slow
async def test_a_step_in_the_checkpoints_transaction_takes_effect_once_across_a_kill(
    observer: Shoal, workers: WorkerProcesses
) -> None:
    run = await app.workflows(observer).start("crashy", id="killed-in-three")
    workers.env = {"SHOAL_RESCUE_AFTER": RESCUE_AFTER_S, "WORKFLOWAPP_BLOCK_AT": "three"}
    first = workers.start()

    async def inside_three() -> bool:
        return any(step == "three under way" for _, step, _ in await effects(observer))

    await wait_for(inside_three, timeout_s=START_TIMEOUT_S * 2, interval_s=0.1)
    killed = kill(first)
    workers.env = {"SHOAL_RESCUE_AFTER": RESCUE_AFTER_S}
    second = workers.start()
    view = await finished(observer, run.id, RESUMED_WITHIN_S)
    steps = Counter((step, pid) for _, step, pid in await effects(observer))
    # The killed process's write in step three died with its transaction.
    assert steps == Counter(
        {
            ("one", killed): 1,
            ("two", killed): 1,
            ("three under way", killed): 1,
            ("three", second.pid): 1,
        }
    )
    assert view.result == [killed, killed, second.pid]


@pytest.mark.slow
async def test_a_thousand_sleeping_runs_each_wake_once_across_worker_restarts(
    observer: Shoal, workers: WorkerProcesses
) -> None:
    api = app.workflows(observer)
    workers.env = {"SHOAL_RESCUE_AFTER": RESCUE_AFTER_S}
    first = workers.start()
    # Far enough ahead for every run to fall asleep and two restarts to pass.
    until = observer.clock.now() + timedelta(seconds=75)
    ids = [
        (await api.start("sleeper", {"until": until.isoformat()}, id=f"sleeper-{i}")).id
        for i in range(SLEEPERS)
    ]

    async def all_asleep() -> bool:
        asleep = await rows(
            observer, "SELECT count(*) FROM shoal.workflow_run WHERE status = 'sleeping'"
        )
        return asleep[0][0] == SLEEPERS

    await wait_for(all_asleep, timeout_s=60, interval_s=0.2)
    kill(first)
    second = workers.start()

    async def registered() -> bool:
        found = await rows(observer, "SELECT 1 FROM shoal.worker WHERE pid = %s", (second.pid,))
        return bool(found)

    await wait_for(registered, timeout_s=START_TIMEOUT_S, interval_s=0.1)
    kill(second)
    assert observer.clock.now() < until, "the restarts took longer than the sleep: no proof"
    workers.start()

    async def all_done() -> bool:
        done = await rows(
            observer, "SELECT count(*) FROM shoal.workflow_run WHERE status = 'completed'"
        )
        return done[0][0] == SLEEPERS

    await wait_for(all_done, timeout_s=120, interval_s=0.5)
    steps = Counter((run, step) for run, step, _ in await effects(observer))
    assert steps == Counter({(i, s): 1 for i in ids for s in ("before", "after")})
    woke = await rows(
        observer,
        "SELECT min(s.finished_at) FROM shoal.workflow_step s WHERE s.name = 'sleep'",
    )
    assert woke[0][0] >= until  # none woke early
