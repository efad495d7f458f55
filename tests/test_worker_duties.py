"""Which work a ``shoal worker`` process takes, and how it stops, as real processes.

``--queues`` / ``--exclude-queues`` choose among an App's queues, batch kinds
and topics (``--no-aggregator`` and the like among the cluster's duties); a
name the App does not declare is refused before anything starts. The first
SIGINT/SIGTERM stops gracefully; a second one stops at once, handing back
what still runs, and the last log line says how much was handed back; each
handed-back job and item carries a note naming the process.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal import Shoal
from shoal.batch.aggregator import AGGREGATOR_DUTY
from shoal.db.leadership import leaders
from shoal.queue.maintenance import MAINTENANCE_DUTY

from . import dutyapp
from .conftest import wait_for
from .test_processes import EXIT_TIMEOUT_S, REPO, START_TIMEOUT_S, WorkerProcesses, rows, value

APP = "tests.dutyapp:app"
# Far longer than any test waits: only a second signal can end it in time.
LONG_GRACE = ["--grace", "600"]


@pytest.fixture
def workers(db_url: str, tmp_path: Path) -> Iterator[WorkerProcesses]:
    procs = WorkerProcesses(db_url, tmp_path, app=APP)
    try:
        yield procs
    finally:
        procs.cleanup()


async def served_by(client: Shoal, pid: int) -> set[str]:
    """The queues the registry row of worker process ``pid`` lists (empty until it registers)."""
    found = await rows(client, "SELECT queues FROM shoal.worker WHERE pid = %s", (pid,))
    return set(found[0][0]) if found else set()


async def leader_pid(client: Shoal, duty: str) -> int | None:
    """The pid of the worker process that leads ``duty`` (None: nobody does)."""
    (holder,) = await leaders(client.db, [duty])
    return None if holder.process is None else int(holder.process.rsplit(":", 1)[1])


async def test_each_process_runs_only_the_queues_and_kinds_it_was_given(
    observer: Shoal, workers: WorkerProcesses
) -> None:
    light = await observer.send("duty_light", {})
    heavy = await observer.send("duty_heavy", {})
    assert light is not None and heavy is not None
    first = workers.start(args=["--queues", "duty_light,duty.items", "--no-aggregator"])

    async def first_registered() -> bool:
        # The row lists each worker once its heartbeat after that worker's start ran.
        return await served_by(observer, first.pid) == {"duty_light", "batch.duty.items"}

    await wait_for(first_registered, timeout_s=START_TIMEOUT_S)

    async def light_done() -> bool:
        return (await observer.get_job(light)).state == "completed"

    await wait_for(light_done, timeout_s=START_TIMEOUT_S)
    # No process serves the heavy queue yet: its job waits.
    assert (await observer.get_job(heavy)).state == "created"

    # The first process leads the duties it took; the aggregator, which it did
    # not take, nobody leads.
    async def first_maintains() -> bool:
        return await leader_pid(observer, MAINTENANCE_DUTY) == first.pid

    await wait_for(first_maintains, timeout_s=START_TIMEOUT_S)
    assert await leader_pid(observer, AGGREGATOR_DUTY) is None

    second = workers.start(args=["--exclude-queues", "duty_light,duty.items"])

    async def heavy_done() -> bool:
        return (await observer.get_job(heavy)).state == "completed"

    await wait_for(heavy_done, timeout_s=START_TIMEOUT_S)
    assert (await observer.get_job(heavy)).output == {"pid": second.pid}
    assert (await observer.get_job(light)).output == {"pid": first.pid}

    async def second_registered() -> bool:
        served = await served_by(observer, second.pid)
        return {"duty_heavy", "duty_block"} <= served

    await wait_for(second_registered, timeout_s=START_TIMEOUT_S)
    assert not await served_by(observer, second.pid) & {"duty_light", "batch.duty.items"}

    async def second_aggregates() -> bool:
        return await leader_pid(observer, AGGREGATOR_DUTY) == second.pid

    await wait_for(second_aggregates, timeout_s=START_TIMEOUT_S)
    assert await leader_pid(observer, MAINTENANCE_DUTY) == first.pid


def test_a_name_the_app_does_not_declare_is_refused_before_anything_starts(db_url: str) -> None:
    command = [sys.executable, "-m", "shoal.cli", "--database-url", db_url, "worker"]
    run = subprocess.run(
        [*command, "--app", APP, "--queues", "duty_light,nosuch"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 2, run.stdout + run.stderr
    said = " ".join((run.stdout + run.stderr).split())
    assert "'nosuch' not declared by this app" in said
    assert "duty.items, duty_block, duty_heavy, duty_light" in said


async def test_a_second_signal_stops_at_once_and_says_what_it_handed_back(
    observer: Shoal, workers: WorkerProcesses
) -> None:
    jobs = [await observer.send("duty_block", {"n": n}) for n in range(2)]
    task = await dutyapp.app.batches(observer).create("duty.items", ["a", "b"])
    proc = workers.start(args=LONG_GRACE)

    async def all_started() -> bool:
        if not await value(observer, "SELECT to_regclass('public.duty_started') IS NOT NULL"):
            return False
        return bool(await value(observer, "SELECT count(*) FROM public.duty_started") == 4)

    await wait_for(all_started, timeout_s=START_TIMEOUT_S)
    proc.send_signal(signal.SIGINT)
    # The first signal starts a graceful stop, which would wait 600 s for the
    # handlers; only the second ends it in time.
    await wait_for(lambda: "stopping: finishing running jobs" in workers.log(proc), timeout_s=30)
    proc.send_signal(signal.SIGINT)
    assert await workers.wait_exit(proc, EXIT_TIMEOUT_S) == 0
    log_lines = workers.log(proc).strip().splitlines()
    assert "handed back 2 job(s) and 2 batch item(s)" in log_lines[-1], log_lines[-5:]

    process = f"{socket.gethostname()}:{proc.pid}"
    for job_id in jobs:
        assert job_id is not None
        job = await observer.get_job(job_id)
        assert (job.state, job.attempt) == ("created", 0)
        note = job.errors[-1]
        assert note.type == "Interrupted"
        assert f"worker process {process}" in note.message
    notes = await rows(
        observer,
        "SELECT status::text, errors->-1->>'type', errors->-1->>'message' FROM shoal.item "
        "WHERE task_id = %s",
        (task.task_id,),
    )
    assert len(notes) == 2
    for status, kind, message in notes:
        assert (status, kind) == ("pending", "Interrupted")
        assert f"worker process {process}" in message
