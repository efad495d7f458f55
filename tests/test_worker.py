"""work(): running handlers with bounded concurrency, outcomes, shutdown."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from shoal import Cancel, FakeClock, Job, JobState, PermanentError, Shoal, Snooze
from shoal.testing import Probe

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


async def test_a_worker_started_on_a_backlog_of_quick_jobs_claims_a_full_batch_at_once(
    boss: Shoal,
) -> None:
    """Its first claim takes a job for each runner; once those have run, the next is a full
    batch, not one grown a little each round trip from the few jobs finished so far."""
    claims: list[int] = []
    boss.hooks.add(
        lambda event: claims.append(event.fields["count"]) if event.name == "fetched" else None
    )

    async def handler(job: Job) -> None:
        return None

    await boss.insert([{"queue": "q"}] * 1000)
    worker = boss.work("q", handler, concurrency=10, batch_size=100)
    await wait_for(lambda: worker.stats.completed == 1000)
    await worker.stop()
    assert claims[0] == 10
    # Three claims of slack: a run preempted on a loaded machine can make the
    # runners look slow for a round trip or two. (When only the finished jobs'
    # rate set them, the claims first reached 100 at the eighth or ninth.)
    assert 100 in claims[1:4], claims


async def test_concurrency_bounds_running_handlers(boss: Shoal) -> None:
    running = peak = 0
    full = asyncio.Event()  # the first handlers hold their slots until all four are taken

    async def handler(job: Job) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if running == 4:
            full.set()
        await full.wait()
        running -= 1

    await boss.insert([{"queue": "q"}] * 60)
    worker = boss.work("q", handler, concurrency=4)
    await wait_for(lambda: worker.stats.completed == 60)
    await worker.stop()
    assert peak == 4


async def test_notify_wakes_an_idle_worker_without_waiting_for_the_poll(
    fake_boss: Shoal,
) -> None:
    done = asyncio.Event()

    async def handler(job: Job) -> None:
        done.set()

    probe = Probe(fake_boss)
    assert fake_boss.notifier is not None
    # The fake clock never reaches the poll interval: only the NOTIFY can wake the worker.
    worker = fake_boss.work("q", handler, poll_interval=timedelta(seconds=60))
    await asyncio.wait_for(fake_boss.notifier.listening.wait(), 30)
    await probe.idle("q")  # the fetcher waits on the empty queue
    await fake_boss.send("q", None)
    await asyncio.wait_for(done.wait(), 30)
    await worker.stop()


async def test_a_notify_that_arrives_while_the_fetcher_claims_still_wakes_it(
    fake_boss: Shoal,
) -> None:
    """The job commits after the claim's snapshot, and its NOTIFY lands before the claim returns.

    The fetcher must not forget that NOTIFY when it goes idle: on a clock
    that never reaches the poll interval, the job would wait forever (seen
    as the batch aggregator's wake-up job never running).
    """
    assert fake_boss.notifier is not None
    done = asyncio.Event()
    raced = False
    noticed = fake_boss.notifier.subscribe("q")  # set when the listener has the NOTIFY

    async def handler(job: Job) -> None:
        done.set()

    async def claim_then_race(queue: str, limit: int, *, now: object = None) -> list[Any]:
        nonlocal raced
        claimed = await fake_boss.store.claim(queue, limit, now=now)  # type: ignore[arg-type]
        if not raced and fake_boss.notifier is not None and fake_boss.notifier.listening.is_set():
            raced = True
            noticed.clear()
            await fake_boss.send("q", None)  # after this claim's snapshot
            await asyncio.wait_for(noticed.wait(), 30)  # and its NOTIFY already delivered
        return claimed

    worker = fake_boss.work(
        "q", handler, poll_interval=timedelta(seconds=60), claim=claim_then_race
    )
    try:
        await asyncio.wait_for(done.wait(), 30)
    finally:
        await worker.stop()
        fake_boss.notifier.unsubscribe("q", noticed)
    assert raced


async def test_a_retry_due_at_once_runs_again_without_waiting_for_the_poll(
    fake_boss: Shoal,
) -> None:
    """A retry sends no NOTIFY; the worker that wrote it claims it again itself.

    The fake clock never reaches the poll interval, so only that can run the
    second attempt (seen: an expired run's retry waiting for a poll that a
    test's clock had already passed).
    """
    attempts: list[int] = []

    async def handler(job: Job) -> str:
        attempts.append(job.attempt)
        if job.attempt == 1:
            raise ConnectionError("flaky")
        return "ok"

    probe = Probe(fake_boss)
    assert fake_boss.notifier is not None
    worker = fake_boss.work("q", handler, poll_interval=timedelta(seconds=60))
    try:
        await asyncio.wait_for(fake_boss.notifier.listening.wait(), 30)
        await probe.idle("q")  # the listener's start-up wake is spent: only NOTIFYs wake it now
        job_id = await fake_boss.send("q", None, retry_limit=1, retry_delay=0)
        await probe.job_finished("q", outcome="retried", job_id=job_id)
        await probe.job_finished("q", outcome="completed", job_id=job_id)
    finally:
        await worker.stop()
    assert attempts == [1, 2]


async def test_a_clock_that_moves_during_an_empty_claim_makes_the_next_poll_due_at_once(
    db_url: str, clock: FakeClock
) -> None:
    """The poll interval counts from when the empty claim began, not from its end.

    The job becomes due by time alone, and the client does not listen, so no
    NOTIFY can wake the worker. The clock passes both the job's
    ``start_after`` and the poll interval while the claim that missed it runs:
    the worker must claim again at once, not wait a poll interval from the
    new time (which a test's clock never reaches: seen in the upgrade test).
    """
    from shoal.db import Database

    db = await Database(db_url).open()
    quiet = Shoal(db, listen=False, clock=clock)
    done = asyncio.Event()
    moved = False

    async def handler(job: Job) -> None:
        done.set()

    async def claim_then_advance(queue: str, limit: int, *, now: Any = None) -> list[Any]:
        nonlocal moved
        claimed = await quiet.store.claim(queue, limit, now=now)
        if not claimed and not moved:
            moved = True
            clock.advance(timedelta(seconds=11))  # past start_after and the 5 s poll
        return claimed

    await quiet.send("q", None, start_after=10)
    worker = quiet.work("q", handler, poll_interval=timedelta(seconds=5), claim=claim_then_advance)
    try:
        await asyncio.wait_for(done.wait(), 30)
    finally:
        await worker.stop()
        await quiet.close()
    assert moved


async def test_a_lease_maintenance_expires_wakes_an_idle_worker(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    """A job back to retry from an expired lease, due now, reaches idle workers at once.

    Its worker died (a ``fetch`` nobody finishes); maintenance puts it back.
    The fake clock is not moved after that, so only a NOTIFY can wake the
    running worker.
    """
    done = asyncio.Event()

    async def handler(job: Job) -> None:
        done.set()

    assert fake_boss.notifier is not None
    job_id = await fake_boss.send("q", None, expire_in=timedelta(seconds=30))
    (dead,) = await fake_boss.fetch("q")  # claimed by a worker that then dies
    clock.advance(timedelta(seconds=31))
    probe = Probe(fake_boss)
    worker = fake_boss.work("q", handler, poll_interval=timedelta(seconds=60))
    try:
        await asyncio.wait_for(fake_boss.notifier.listening.wait(), 30)
        await probe.idle("q")
        report = await fake_boss.maintain()
        assert report.retried == 1
        await asyncio.wait_for(done.wait(), 30)
    finally:
        await worker.stop()
    assert dead.id == job_id


async def test_polling_finds_jobs_when_notifications_are_off(db_url: str, clock: FakeClock) -> None:
    from shoal.db import Database

    db = await Database(db_url).open()
    quiet = Shoal(db, listen=False, clock=clock)
    probe = Probe(quiet)
    done = asyncio.Event()

    async def handler(job: Job) -> None:
        done.set()

    worker = quiet.work("q", handler, poll_interval=timedelta(seconds=2))
    await probe.idle("q")
    await quiet.send("q", None)
    assert not done.is_set()
    clock.advance(timedelta(seconds=2))  # the poll interval passes
    await asyncio.wait_for(done.wait(), 30)
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


async def test_handler_past_expire_in_is_cancelled_and_retried(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    attempts: list[int] = []
    hanging = asyncio.Event()

    async def handler(job: Job) -> str:
        attempts.append(job.attempt)
        if job.attempt == 1:
            hanging.set()
            await asyncio.Event().wait()  # hangs past expire_in
        return "second time lucky"

    probe = Probe(fake_boss)
    job_id = await fake_boss.send("q", None, expire_in=timedelta(seconds=300))
    assert job_id is not None
    worker = fake_boss.work("q", handler, poll_interval=timedelta(seconds=1))
    await asyncio.wait_for(hanging.wait(), 30)
    clock.advance(timedelta(seconds=301))  # past expire_in: the watchdog cancels the handler
    await probe.job_finished("q", outcome="retried", job_id=job_id)
    clock.advance(timedelta(seconds=1))  # the poll interval: the retry is claimed
    await probe.job_finished("q", outcome="completed", job_id=job_id)
    await worker.stop()
    record = await fake_boss.get_job(job_id)
    assert attempts == [1, 2]
    assert record.errors[0].type == "ExpiredError"
    assert record.output == "second time lucky"


async def test_heartbeat_keeps_a_long_job_alive_past_expire_in(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    async def handler(job: Job) -> str:
        # Eight steps of 200 s each, 1600 s in all, under a 300 s expire_in.
        for _ in range(8):
            assert await job.heartbeat()
            clock.advance(timedelta(seconds=200))
            await asyncio.sleep(0)  # noqa: TID251 - a yield: the watchdog sees the new time
        return "done"

    probe = Probe(fake_boss)
    job_id = await fake_boss.send("q", None, expire_in=timedelta(seconds=300))
    assert job_id is not None
    worker = fake_boss.work("q", handler)
    await probe.job_finished("q", job_id=job_id)
    await worker.stop()
    record = await fake_boss.get_job(job_id)
    assert (record.attempt, record.errors, record.output) == (1, (), "done")


async def test_stop_lets_running_jobs_finish_within_grace(boss: Shoal) -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    async def handler(job: Job) -> str:
        started.set()
        await release.wait()
        return "finished"

    job_id = await boss.send("q", None)
    assert job_id is not None
    worker = boss.work("q", handler)
    await asyncio.wait_for(started.wait(), 30)
    stopping = asyncio.ensure_future(worker.stop(grace=timedelta(seconds=60)))
    await asyncio.sleep(0)  # noqa: TID251 - a yield: stop() begins while the handler runs
    assert not stopping.done()
    release.set()
    await stopping
    record = await boss.get_job(job_id)
    assert (record.state, record.output) == (JobState.COMPLETED, "finished")


async def test_stop_hands_back_jobs_past_grace_without_spending_an_attempt(boss: Shoal) -> None:
    started = asyncio.Event()

    async def handler(job: Job) -> None:
        started.set()
        await asyncio.Event().wait()  # never finishes: the grace runs out

    ids = await boss.insert([{"queue": "q"}] * 5)
    worker = boss.work("q", handler, concurrency=2)
    await asyncio.wait_for(started.wait(), 30)
    await worker.stop(grace=timedelta(milliseconds=100))
    for job_id in ids:
        assert job_id is not None
        record = await boss.get_job(job_id)
        assert (record.state, record.attempt) == (JobState.CREATED, 0)
        # Claimed ones carry a note of the hand-back; it costs no attempt.
        assert all(e.type == "Interrupted" and e.attempt == 1 for e in record.errors)
