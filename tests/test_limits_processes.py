"""Limits across real worker processes, sampled from the database while they drain.

Four ``shoal worker --app tests.limitsapp:app`` processes claim the same
queues; the test reads the active jobs of each queue (and partition) back to
back while they run, each read one snapshot of the database, and checks no
read ever saw more than the limit, and that the limit was reached (so the
check could fail). A worker SIGKILLed while it holds every slot of a global
limit gets them back once maintenance expires its leases.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from shoal import Shoal
from tests.test_processes import (
    WorkerProcesses,
    rows,
    state_counts,
    value,
    wait_drained,
    wait_started,
)

from .conftest import wait_for

APP = "tests.limitsapp:app"


@pytest.fixture
def workers(db_url: str, tmp_path: Path) -> Iterator[WorkerProcesses]:
    procs = WorkerProcesses(db_url, tmp_path, app=APP)
    try:
        yield procs
    finally:
        procs.cleanup()


async def sample_peaks(client: Shoal, done: asyncio.Event) -> tuple[int, int, int]:
    """Until ``done``: the most active jobs seen at once in lim_global, in one lim_part
    partition, and how many reads were made."""
    peak_global = peak_partition = reads = 0
    while not done.is_set():
        (active_global, active_partition), *_ = await rows(
            client,
            """
            SELECT (SELECT count(*) FROM shoal.job WHERE queue = 'lim_global' AND state = 'active'),
                   (SELECT coalesce(max(n), 0) FROM (
                        SELECT count(*) AS n FROM shoal.job
                        WHERE queue = 'lim_part' AND state = 'active'
                        GROUP BY partition_key) per_partition)
            """,
        )
        peak_global = max(peak_global, active_global)
        peak_partition = max(peak_partition, active_partition)
        reads += 1
    return peak_global, peak_partition, reads


@pytest.mark.slow
async def test_limits_hold_at_every_instant_across_four_worker_processes(
    observer: Shoal, workers: WorkerProcesses
) -> None:
    for _ in range(4):
        workers.start()
    await wait_started(observer, 4)
    # Workers declare their limits before their first claim: wait for them,
    # so every job below is sent to a limited queue.
    await wait_for(
        lambda: value(observer, "SELECT count(*) = 3 FROM shoal.queue_limit"), timeout_s=30
    )
    done = asyncio.Event()
    sampler = asyncio.create_task(sample_peaks(observer, done))
    await observer.insert_many("lim_global", [{"sleep_s": 0.05}] * 60)
    # 1,000 partitions of 3 jobs each, their jobs side by side.
    await observer.insert_many(
        "lim_part", [{"p": p, "sleep_s": 0.02} for p in range(1000) for _ in range(3)]
    )
    try:
        await wait_drained(observer, "lim_global", 60, timeout_s=60)
        await wait_drained(observer, "lim_part", 3000, timeout_s=90)
    finally:
        done.set()
        peak_global, peak_partition, reads = await sampler
    assert reads > 50
    assert peak_global == 3
    assert peak_partition == 2
    # The work was spread over the processes, not run by one.
    pids = await rows(
        observer,
        "SELECT count(DISTINCT output->>'pid') FROM shoal.job "
        "WHERE queue IN ('lim_global', 'lim_part')",
    )
    assert pids[0][0] >= 2


@pytest.mark.slow
async def test_slots_of_a_killed_worker_come_back_when_its_leases_expire(
    observer: Shoal, workers: WorkerProcesses
) -> None:
    first = workers.start()
    await wait_started(observer, 1)
    await wait_for(
        lambda: value(observer, "SELECT count(*) = 3 FROM shoal.queue_limit"), timeout_s=30
    )
    # The two oldest take both slots, and their attempt 1 outlives the test
    # (attempt 2, after the kill, is quick); the other two wait for a slot.
    stuck = {"sleep_s": 0.01, "first_attempt_sleep_s": 600}
    await observer.insert_many(
        "lim_kill",
        [stuck, stuck, {"sleep_s": 0.01}, {"sleep_s": 0.01}],
        expire_in=timedelta(seconds=2),
    )
    await wait_for(lambda: _active(observer), timeout_s=30)
    first.send_signal(signal.SIGKILL)
    await workers.wait_exit(first, timeout_s=10)
    workers.start()
    # The dead worker's two slots are held until its leases expire; then
    # maintenance sends its jobs back, and all four run.
    await wait_drained(observer, "lim_kill", 4, timeout_s=40)
    attempts = await rows(
        observer, "SELECT attempt, count(*) FROM shoal.job WHERE queue = 'lim_kill' GROUP BY 1"
    )
    assert dict(attempts) == {2: 2, 1: 2}
    assert await state_counts(observer, "lim_kill") == {"completed": 4}


async def _active(client: Shoal) -> bool:
    return bool(
        await value(
            client,
            "SELECT count(*) = 2 FROM shoal.job WHERE queue = 'lim_kill' AND state = 'active'",
        )
    )
