"""Cancelling a job or a task while its handler runs stops the handler.

The cancel NOTIFYs the process holding the run (job id and attempt, or item
id and fence); its worker cancels the handler's task, or flags a thread that
cannot be interrupted. A heartbeat is the backstop for a notification that
never came. The job ends ``cancelled``, with who cancelled it and when on its
history, and a note that its handler was stopped. (Batch items:
tests/test_batch_cancel_running.py.)
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from shoal import FakeClock, InvalidInput, Job, JobCancelled, JobState, Shoal
from shoal.db import Database
from shoal.queue.notifier import RECONNECT_DELAY_S
from shoal.queue.rows import JobError
from shoal.queue.states import JobId

from .conftest import wait_for
from .test_processes import WorkerProcesses, rows, wait_started

# A bound on failure, never a speed check: the stop itself takes well under a
# second (the notification's round trip), but the box may be loaded.
STOP_TIMEOUT_S = 30


@pytest.fixture
def workers(db_url: str, tmp_path: Path) -> Iterator[WorkerProcesses]:
    procs = WorkerProcesses(db_url, tmp_path)
    try:
        yield procs
    finally:
        procs.cleanup()


async def history(boss: Shoal, job_id: JobId) -> list[JobError]:
    return list((await boss.get_job(job_id)).errors)


async def wait_stopped(boss: Shoal, job_id: JobId) -> list[JobError]:
    """The job's history once its worker noted the stopped run (a bound on failure)."""

    async def noted() -> bool:
        return any(e.type == "Stopped" for e in await history(boss, job_id))

    try:
        await wait_for(noted, timeout_s=STOP_TIMEOUT_S, interval_s=0.05)
    except AssertionError:
        raise AssertionError(
            f"job {job_id}'s handler was not stopped: {await history(boss, job_id)}"
        ) from None
    return await history(boss, job_id)


@pytest.mark.slow
async def test_cancelling_an_active_job_stops_its_handler_in_the_worker_process(
    observer: Shoal, workers: WorkerProcesses
) -> None:
    # proc_slow logs its start, sleeps, then stamps the log: the side effect.
    worker = workers.start()
    await wait_started(observer, 1)
    job_id = await observer.send("proc_slow", {"sleep_s": 600})
    assert job_id is not None

    async def handler_started() -> bool:
        return bool(await rows(observer, "SELECT 1 FROM exec_log WHERE job_id = %s", (job_id,)))

    await wait_for(handler_started, timeout_s=STOP_TIMEOUT_S)
    assert await observer.cancel(job_id, by="ops: wrong customer") == {job_id}

    errors = await wait_stopped(observer, job_id)
    record = await observer.get_job(job_id)
    assert record.state is JobState.CANCELLED and record.finished_at is not None
    cancelled, stopped = errors
    assert (cancelled.type, cancelled.message, cancelled.attempt) == (
        "Cancelled",
        "cancelled by ops: wrong customer",
        1,
    )
    assert cancelled.at and stopped.attempt == 1
    assert stopped.message == "handler stopped: the job was cancelled while it ran"
    # The handler was cut off in its sleep: its last write never happened.
    assert await rows(
        observer, "SELECT finished_at FROM exec_log WHERE job_id = %s", (job_id,)
    ) == [(None,)]
    # The worker runs on: its single runner is free for the next job.
    quick = await observer.send("proc_slow", {"sleep_s": 0})
    assert quick is not None

    async def quick_done() -> bool:
        return (await observer.get_job(quick)).state is JobState.COMPLETED

    await wait_for(quick_done, timeout_s=STOP_TIMEOUT_S)
    assert worker.poll() is None


async def test_a_sync_handler_sees_the_cancel_as_a_flag(boss: Shoal, observer: Shoal) -> None:
    started, go = threading.Event(), threading.Event()
    seen: list[Any] = []

    def handler(job: Job) -> str:
        started.set()
        go.wait(STOP_TIMEOUT_S)
        seen.append(job.cancelled)
        try:
            job.raise_if_cancelled()
        except JobCancelled as exc:
            seen.append(exc)
        return "late result"

    worker = boss.work("q", handler, concurrency=1)
    assert boss.notifier is not None
    job_id = await observer.send("q", None)
    assert job_id is not None
    await wait_for(started.is_set, timeout_s=STOP_TIMEOUT_S)
    await observer.cancel(job_id, by="test")
    # The run is recorded as stopped while the thread still runs: a thread
    # cannot be interrupted, it is told.
    errors = await wait_stopped(observer, job_id)
    assert [e.type for e in errors] == ["Cancelled", "Stopped"]
    go.set()
    await wait_for(lambda: len(seen) == 2, timeout_s=STOP_TIMEOUT_S)
    assert seen[0] is True and isinstance(seen[1], JobCancelled)
    await worker.stop()
    record = await observer.get_job(job_id)
    assert record.state is JobState.CANCELLED and record.output is None


async def test_a_heartbeat_stops_a_handler_whose_cancel_notification_was_lost(
    db_url: str, observer: Shoal
) -> None:
    # A client that does not LISTEN: every cancel notification is lost on it.
    db = await Database(db_url, max_size=4).open()
    deaf = Shoal(db, listen=False)
    started, go = asyncio.Event(), asyncio.Event()
    side_effects: list[int] = []
    stopped: list[BaseException] = []

    async def handler(job: Job) -> None:
        started.set()
        await go.wait()
        try:
            await job.heartbeat()
        except asyncio.CancelledError as exc:
            stopped.append(exc)
            raise
        side_effects.append(job.id)

    try:
        worker = deaf.work("q", handler, concurrency=1)
        job_id = await observer.send("q", None)
        assert job_id is not None
        await asyncio.wait_for(started.wait(), STOP_TIMEOUT_S)
        await observer.cancel(job_id, by="test")
        go.set()
        errors = await wait_stopped(observer, job_id)
        assert [e.type for e in errors] == ["Cancelled", "Stopped"]
        assert len(stopped) == 1 and side_effects == []
        await worker.stop()
    finally:
        await deaf.close()
    assert (await observer.get_job(job_id)).state is JobState.CANCELLED


async def test_a_waiting_job_cancel_notes_who_and_when(boss: Shoal) -> None:
    job_id = await boss.send("q", None)
    assert job_id is not None
    assert await boss.cancel(job_id, by="console") == {job_id}
    (note,) = await history(boss, job_id)
    assert (note.type, note.message, note.attempt) == ("Cancelled", "cancelled by console", 0)
    with pytest.raises(InvalidInput, match="by"):
        await boss.cancel(job_id, by=" ")


async def test_a_cancel_sent_while_the_listen_connection_was_down_stops_the_handler(
    fake_boss: Shoal, clock: FakeClock, observer: Shoal, db_url: str
) -> None:
    started = asyncio.Event()
    side_effects: list[int] = []

    async def handler(job: Job) -> None:
        started.set()
        await asyncio.Event().wait()  # never heartbeats: only the reconnection can tell it
        side_effects.append(job.id)

    worker = fake_boss.work("q", handler, concurrency=1)
    notifier = fake_boss.notifier
    assert notifier is not None
    await asyncio.wait_for(notifier.listening.wait(), STOP_TIMEOUT_S)
    job_id = await fake_boss.send("q", None)  # due on the fake clock
    assert job_id is not None
    await asyncio.wait_for(started.wait(), STOP_TIMEOUT_S)
    # Cut the listen connection; it reconnects only when the clock moves.
    (terminated,) = await rows(
        observer,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND query LIKE 'LISTEN %%'",
    )
    assert terminated == (True,)
    await wait_for(lambda: not notifier.listening.is_set(), timeout_s=STOP_TIMEOUT_S)
    await observer.cancel(job_id, by="test")  # its NOTIFY reaches no one
    clock.advance(timedelta(seconds=RECONNECT_DELAY_S))
    errors = await wait_stopped(observer, job_id)
    assert [e.type for e in errors] == ["Cancelled", "Stopped"] and side_effects == []
    await worker.stop()
