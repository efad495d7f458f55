"""work(): running handlers with bounded concurrency, outcomes, shutdown."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from shoal import Cancel, Job, JobState, PermanentError, Shoal, Snooze

from .conftest import wait_for


async def states(boss: Shoal, queue: str) -> dict[JobState, int]:
    return {r.state: r.count for r in await boss.stats() if r.queue == queue}


async def test_worker_runs_every_job_once_and_records_its_output(boss: Shoal) -> None:
    seen: list[int] = []

    async def handler(job: Job) -> dict[str, int]:
        seen.append(job.data["i"])
        return {"double": job.data["i"] * 2}

    ids = await boss.insert([{"queue": "q", "data": {"i": i}} for i in range(500)])
    worker = boss.work("q", handler, concurrency=10)
    await wait_for(lambda: worker.stats.completed == 500)
    await worker.stop()
    assert sorted(seen) == list(range(500))
    job_id = ids[7]
    assert job_id is not None
    assert (await boss.get_job(job_id)).output == {"double": 14}
    assert await states(boss, "q") == {JobState.COMPLETED: 500}


async def test_concurrency_bounds_running_handlers(boss: Shoal) -> None:
    running = peak = 0

    async def handler(job: Job) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1

    await boss.insert([{"queue": "q"}] * 60)
    worker = boss.work("q", handler, concurrency=4)
    await wait_for(lambda: worker.stats.completed == 60)
    await worker.stop()
    assert peak == 4


async def test_notify_wakes_an_idle_worker_long_before_the_poll(boss: Shoal) -> None:
    done = asyncio.Event()

    async def handler(job: Job) -> None:
        done.set()

    assert boss.notifier is not None
    worker = boss.work("q", handler, poll_interval=timedelta(seconds=60))
    await asyncio.wait_for(boss.notifier.listening.wait(), 5)
    await asyncio.sleep(0.1)  # let the fetcher go idle on the empty queue
    await boss.send("q", None)
    await asyncio.wait_for(done.wait(), 5)  # a 60 s poll would time out here
    await worker.stop()


async def test_polling_finds_jobs_when_notifications_are_off(db_url: str) -> None:
    from shoal.db import Database

    db = await Database(db_url).open()
    quiet = Shoal(db, listen=False)
    done = asyncio.Event()

    async def handler(job: Job) -> None:
        done.set()

    worker = quiet.work("q", handler, poll_interval=timedelta(milliseconds=100))
    await asyncio.sleep(0.2)
    await quiet.send("q", None)
    await asyncio.wait_for(done.wait(), 5)
    await worker.stop()
    await quiet.close()


async def test_errors_retry_then_fail_with_every_attempt_kept(boss: Shoal) -> None:
    async def handler(job: Job) -> None:
        raise ValueError(f"bad attempt {job.attempt}")

    job_id = await boss.send("q", None, retry_limit=2)
    assert job_id is not None
    worker = boss.work("q", handler, poll_interval=timedelta(milliseconds=50))
    await wait_for(lambda: worker.stats.failed == 1)
    await worker.stop()
    record = await boss.get_job(job_id)
    assert record.state is JobState.FAILED and record.attempt == 3
    assert [e.message for e in record.errors] == [f"bad attempt {n}" for n in (1, 2, 3)]
    assert all(e.type == "ValueError" and "Traceback" in (e.traceback or "") for e in record.errors)


async def test_permanent_error_fails_at_once(boss: Shoal) -> None:
    async def handler(job: Job) -> None:
        raise PermanentError("file is not a PDF")

    job_id = await boss.send("q", None, retry_limit=5)
    assert job_id is not None
    worker = boss.work("q", handler)
    await wait_for(lambda: worker.stats.failed == 1)
    await worker.stop()
    record = await boss.get_job(job_id)
    assert (record.state, record.attempt) == (JobState.FAILED, 1)


async def test_snooze_comes_back_later_without_spending_an_attempt(boss: Shoal) -> None:
    runs: list[int] = []

    async def handler(job: Job) -> None:
        runs.append(job.attempt)
        if len(runs) < 3:
            raise Snooze(timedelta(milliseconds=50))

    job_id = await boss.send("q", None, retry_limit=0)
    assert job_id is not None
    worker = boss.work("q", handler, poll_interval=timedelta(milliseconds=50))
    await wait_for(lambda: worker.stats.completed == 1)
    await worker.stop()
    assert runs == [1, 1, 1]
    assert (await boss.get_job(job_id)).state is JobState.COMPLETED


async def test_cancel_from_the_handler_stops_the_job(boss: Shoal) -> None:
    async def handler(job: Job) -> None:
        raise Cancel("order was withdrawn")

    job_id = await boss.send("q", None)
    assert job_id is not None
    worker = boss.work("q", handler)
    await wait_for(lambda: worker.idle.is_set() and worker.stats.claimed == 1)
    await wait_for(lambda: _state_is(boss, job_id, JobState.CANCELLED))
    await worker.stop()
    record = await boss.get_job(job_id)
    assert record.errors[-1].message == "order was withdrawn"


async def _state_is(boss: Shoal, job_id: int, state: JobState) -> bool:
    return (await boss.get_job(job_id)).state is state  # type: ignore[arg-type]


async def test_handler_past_expire_in_is_cancelled_and_retried(boss: Shoal) -> None:
    attempts: list[int] = []

    async def handler(job: Job) -> str:
        attempts.append(job.attempt)
        if job.attempt == 1:
            await asyncio.sleep(30)  # hangs past expire_in
        return "second time lucky"

    job_id = await boss.send("q", None, expire_in=timedelta(milliseconds=300))
    assert job_id is not None
    worker = boss.work("q", handler, poll_interval=timedelta(milliseconds=50))
    await wait_for(lambda: worker.stats.completed == 1, timeout_s=10)
    await worker.stop()
    record = await boss.get_job(job_id)
    assert attempts == [1, 2]
    assert record.errors[0].type == "ExpiredError"
    assert record.output == "second time lucky"


async def test_heartbeat_keeps_a_long_job_alive_past_expire_in(boss: Shoal) -> None:
    async def handler(job: Job) -> str:
        for _ in range(8):
            await asyncio.sleep(0.1)
            assert await job.heartbeat()
        return "done"

    job_id = await boss.send("q", None, expire_in=timedelta(milliseconds=300))
    assert job_id is not None
    worker = boss.work("q", handler)
    await wait_for(lambda: worker.stats.completed == 1, timeout_s=10)
    await worker.stop()
    record = await boss.get_job(job_id)
    assert (record.attempt, record.errors, record.output) == (1, (), "done")


async def test_stop_lets_running_jobs_finish_within_grace(boss: Shoal) -> None:
    started = asyncio.Event()

    async def handler(job: Job) -> str:
        started.set()
        await asyncio.sleep(0.3)
        return "finished"

    job_id = await boss.send("q", None)
    assert job_id is not None
    worker = boss.work("q", handler)
    await asyncio.wait_for(started.wait(), 5)
    await worker.stop(grace=timedelta(seconds=5))
    record = await boss.get_job(job_id)
    assert (record.state, record.output) == (JobState.COMPLETED, "finished")


async def test_stop_hands_back_jobs_past_grace_without_spending_an_attempt(boss: Shoal) -> None:
    started = asyncio.Event()

    async def handler(job: Job) -> None:
        started.set()
        await asyncio.sleep(60)

    ids = await boss.insert([{"queue": "q"}] * 5)
    worker = boss.work("q", handler, concurrency=2)
    await asyncio.wait_for(started.wait(), 5)
    await worker.stop(grace=timedelta(milliseconds=100))
    for job_id in ids:
        assert job_id is not None
        record = await boss.get_job(job_id)
        assert (record.state, record.attempt, record.errors) == (JobState.CREATED, 0, ())
