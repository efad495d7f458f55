"""The queue's behaviour through its public API, on real PostgreSQL.

Time-dependent tests use ``fake_boss``: its FakeClock is bound into every SQL
statement, so time moves only with ``clock.advance``.
"""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest

from shoal import FakeClock, JobState, NotFound, Shoal


async def test_send_returns_an_id_and_the_job_waits(boss: Shoal) -> None:
    job_id = await boss.send("email_send", {"user_id": 7})
    assert job_id is not None
    job = await boss.get_job(job_id)
    assert (job.queue, job.state, job.data, job.attempt) == (
        "email_send",
        JobState.CREATED,
        {"user_id": 7},
        0,
    )


async def test_insert_returns_ids_in_input_order(boss: Shoal) -> None:
    ids = await boss.insert([{"queue": "q", "data": {"i": i}} for i in range(10_000)])
    assert len(ids) == 10_000 and all(ids)
    for i in (0, 4_999, 9_999):
        job_id = ids[i]
        assert job_id is not None
        assert (await boss.get_job(job_id)).data == {"i": i}


async def test_duplicate_singleton_returns_none_and_raises_nothing(boss: Shoal) -> None:
    first = await boss.send("q", {"n": 1}, singleton_key="item-1")
    second = await boss.send("q", {"n": 2}, singleton_key="item-1")
    assert first is not None and second is None
    assert [j.data for j in await boss.jobs("q")] == [{"n": 1}]


async def test_singleton_key_only_blocks_unfinished_jobs(boss: Shoal) -> None:
    first = await boss.send("q", None, singleton_key="k")
    assert first is not None
    (job,) = await boss.fetch("q")
    assert await boss.complete(job)
    assert await boss.send("q", None, singleton_key="k") is not None


async def test_singleton_is_per_queue(boss: Shoal) -> None:
    assert await boss.send("a", None, singleton_key="k") is not None
    assert await boss.send("b", None, singleton_key="k") is not None


async def test_insert_skips_duplicate_singletons_within_one_call(boss: Shoal) -> None:
    ids = await boss.insert(
        [{"queue": "q", "singleton_key": "same"}, {"queue": "q", "singleton_key": "same"}]
    )
    assert ids[0] is not None and ids[1] is None


async def test_a_mixed_insert_gives_each_job_its_own_id_and_none_to_each_skipped_one(
    boss: Shoal,
) -> None:
    # Keyless jobs, keys per queue, a key an unfinished job already holds and
    # a key repeated in the call, across two option sets: every id returned
    # must be the job made from the payload at that position.
    assert await boss.send("q", {"n": "held"}, singleton_key="held") is not None
    specs: list[dict[str, object]] = [
        {"queue": "q", "data": {"n": 0}},
        {"queue": "q", "data": {"n": 1}, "singleton_key": "held"},
        {"queue": "q", "data": {"n": 2}, "singleton_key": "a"},
        {"queue": "r", "data": {"n": 3}, "singleton_key": "a", "priority": 5},
        {"queue": "q", "data": {"n": 4}},
        {"queue": "q", "data": {"n": 5}, "singleton_key": "a"},
        {"queue": "r", "data": {"n": 6}, "priority": 5},
        {"queue": "q", "data": {"n": 7}, "singleton_key": "b"},
    ]
    ids = await boss.insert(specs)
    assert [i is None for i in ids] == [False, True, False, False, False, True, False, False]
    for spec, job_id in zip(specs, ids, strict=True):
        if job_id is not None:
            job = await boss.get_job(job_id)
            assert (job.queue, job.data) == (spec["queue"], spec["data"])


async def test_a_worker_claim_reads_each_duration_the_job_was_sent_with(boss: Shoal) -> None:
    # The worker's claim (claim_jobs_v4) reads the durations as float8
    # seconds: fractions and day-long values come back exactly as sent.
    await boss.send(
        "q",
        None,
        retry_limit=4,
        retry_delay=timedelta(seconds=1.25),
        retry_backoff=True,
        retry_delay_max=timedelta(days=2, microseconds=500),
        expire_in=timedelta(minutes=2, seconds=0.75),
    )
    (claim,) = await boss.store.claim("q", 10, now=None)
    policy = claim.policy
    assert (policy.retry_limit, policy.retry_delay, policy.retry_backoff) == (
        4,
        timedelta(seconds=1.25),
        True,
    )
    assert policy.retry_delay_max == timedelta(days=2, microseconds=500)
    assert claim.expire_in == timedelta(minutes=2, seconds=0.75)


async def test_fetch_takes_higher_priority_first_then_oldest(boss: Shoal) -> None:
    low = await boss.send("q", "low", priority=0)
    high = await boss.send("q", "high", priority=10)
    low2 = await boss.send("q", "low2", priority=0)
    jobs = await boss.fetch("q", batch_size=3)
    assert [j.id for j in jobs] == [high, low, low2]


async def test_start_after_holds_a_job_until_its_time(fake_boss: Shoal, clock: FakeClock) -> None:
    await fake_boss.send("q", None, start_after=timedelta(seconds=30))
    assert await fake_boss.fetch("q") == []
    clock.advance(timedelta(seconds=29))
    assert await fake_boss.fetch("q") == []
    clock.advance(timedelta(seconds=1))
    assert len(await fake_boss.fetch("q")) == 1


async def test_start_after_accepts_an_absolute_time(fake_boss: Shoal, clock: FakeClock) -> None:
    await fake_boss.send("q", None, start_after=clock.now() + timedelta(minutes=5))
    clock.advance(timedelta(minutes=4))
    assert await fake_boss.fetch("q") == []
    clock.advance(timedelta(minutes=1))
    assert len(await fake_boss.fetch("q")) == 1


async def test_failed_attempts_retry_with_growing_backoff(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    job_id = await fake_boss.send("q", None, retry_limit=3, retry_delay=10, retry_backoff=True)
    assert job_id is not None
    # Backoff with equal jitter: attempt n waits within [d/2, d), d = 10 s * 2**(n-1).
    for attempt, full_delay in [(1, 10), (2, 20), (3, 40)]:
        (job,) = await fake_boss.fetch("q")
        assert job.attempt == attempt
        assert await fake_boss.fail(job, f"boom {attempt}") is JobState.RETRY
        clock.advance(timedelta(seconds=full_delay / 2 - 0.001))
        assert await fake_boss.fetch("q") == [], f"ran again too early after attempt {attempt}"
        clock.advance(timedelta(seconds=full_delay / 2))
    (job,) = await fake_boss.fetch("q")
    assert await fake_boss.fail(job, "boom 4") is JobState.FAILED
    record = await fake_boss.get_job(job_id)
    assert record.state is JobState.FAILED and record.attempt == 4
    assert [e.message for e in record.errors] == ["boom 1", "boom 2", "boom 3", "boom 4"]
    assert [e.attempt for e in record.errors] == [1, 2, 3, 4]


async def test_fixed_retry_delay_without_backoff(fake_boss: Shoal, clock: FakeClock) -> None:
    await fake_boss.send("q", None, retry_limit=1, retry_delay=timedelta(seconds=5))
    (job,) = await fake_boss.fetch("q")
    await fake_boss.fail(job, "boom")
    clock.advance(timedelta(seconds=4.9))
    assert await fake_boss.fetch("q") == []
    clock.advance(timedelta(seconds=0.1))
    assert len(await fake_boss.fetch("q")) == 1


async def test_retry_limit_zero_fails_on_first_error(boss: Shoal) -> None:
    job_id = await boss.send("q", None, retry_limit=0)
    (job,) = await boss.fetch("q")
    assert await boss.fail(job, RuntimeError("nope")) is JobState.FAILED
    assert job_id is not None
    record = await boss.get_job(job_id)
    assert record.finished_at is not None
    assert record.errors[0].type == "RuntimeError"


async def test_expired_lease_is_retried_then_failed(fake_boss: Shoal, clock: FakeClock) -> None:
    job_id = await fake_boss.send("q", None, retry_limit=1, expire_in=timedelta(seconds=60))
    assert job_id is not None
    (first,) = await fake_boss.fetch("q")
    clock.advance(timedelta(seconds=59))
    report = await fake_boss.maintain()
    assert (report.retried, report.failed) == (0, 0)
    clock.advance(timedelta(seconds=1))
    report = await fake_boss.maintain()
    assert (report.retried, report.failed) == (1, 0)
    # The worker presumed dead comes back: its write loses to the fence.
    assert not await fake_boss.complete(first, {"late": True})
    (second,) = await fake_boss.fetch("q")
    assert second.attempt == 2
    clock.advance(timedelta(seconds=60))
    report = await fake_boss.maintain()
    assert (report.retried, report.failed) == (0, 1)
    record = await fake_boss.get_job(job_id)
    assert record.state is JobState.FAILED
    assert [e.type for e in record.errors] == ["LeaseExpired", "LeaseExpired"]


async def test_expire_in_counts_from_activation_not_from_queueing(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    await fake_boss.send("q", None, expire_in=timedelta(seconds=60))
    clock.advance(timedelta(hours=3))  # waited in the queue far longer than expire_in
    assert (await fake_boss.maintain()).failed == 0
    (job,) = await fake_boss.fetch("q")
    clock.advance(timedelta(seconds=30))
    assert (await fake_boss.maintain()).retried == 0
    assert await fake_boss.complete(job)


async def test_heartbeat_extends_the_lease(fake_boss: Shoal, clock: FakeClock) -> None:
    await fake_boss.send("q", None, expire_in=timedelta(seconds=60))
    (job,) = await fake_boss.fetch("q")
    for _ in range(5):
        clock.advance(timedelta(seconds=45))
        assert await job.heartbeat()
        assert (await fake_boss.maintain()).retried == 0
    assert await fake_boss.complete(job)
    assert not await job.heartbeat()  # no longer held


async def test_cancel_resume_and_retry(boss: Shoal) -> None:
    waiting = await boss.send("q", "a")
    assert waiting is not None
    assert await boss.cancel(waiting) == {waiting}
    assert await boss.fetch("q") == []
    assert await boss.resume(waiting) == {waiting}
    (job,) = await boss.fetch("q")
    await boss.fail(job, "x")  # retry_limit 2 by default: back to retry
    (job,) = await boss.fetch("q")
    await boss.fail(job, "y")
    (job,) = await boss.fetch("q")
    assert await boss.fail(job, "z") is JobState.FAILED
    assert await boss.retry(waiting) == {waiting}
    (job,) = await boss.fetch("q")
    assert job.attempt == 4
    assert await boss.complete(job, {"ok": True})
    record = await boss.get_job(waiting)
    assert record.state is JobState.COMPLETED and record.output == {"ok": True}
    # The cancel is on the history too, with who cancelled it.
    assert [e.message for e in record.errors] == ["cancelled by python", "x", "y", "z"]


async def test_cancelling_an_active_job_fences_out_its_worker(boss: Shoal) -> None:
    await boss.send("q", None)
    (job,) = await boss.fetch("q")
    assert await boss.cancel(job.id) == {job.id}
    assert not await boss.complete(job)
    assert (await boss.get_job(job.id)).state is JobState.CANCELLED


async def test_failed_job_goes_to_its_dead_letter_queue_and_can_be_redriven(boss: Shoal) -> None:
    job_id = await boss.send("q", {"doc": 1}, retry_limit=0, dead_letter="q_dead", priority=3)
    (job,) = await boss.fetch("q")
    await boss.fail(job, "poison")
    (dead,) = await boss.jobs("q_dead")
    assert dead.data == {"doc": 1} and dead.origin_queue == "q" and dead.origin_id == job_id
    moved = await boss.redrive("q_dead")
    assert list(moved) == [dead.id]
    new_id = moved[dead.id]
    again = await boss.get_job(new_id)
    assert (again.queue, again.state, again.data, again.attempt) == (
        "q",
        JobState.CREATED,
        {"doc": 1},
        0,
    )
    assert (await boss.get_job(dead.id)).state is JobState.COMPLETED
    assert await boss.redrive("q_dead") == {}


async def test_paused_queue_is_not_claimed_until_resumed(boss: Shoal) -> None:
    await boss.send("q", None)
    await boss.pause_queue("q")
    assert await boss.paused_queues() == ["q"]
    assert await boss.fetch("q") == []
    await boss.resume_queue("q")
    assert len(await boss.fetch("q")) == 1


async def test_stats_count_each_state_and_the_oldest_waiting_job(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    await fake_boss.insert([{"queue": "q"}] * 3)
    await fake_boss.send("q", None, start_after=timedelta(hours=1))
    clock.advance(timedelta(seconds=90))
    (job,) = await fake_boss.fetch("q")
    await fake_boss.complete(job)
    rows = {(r.queue, r.state): r for r in await fake_boss.stats()}
    assert rows["q", JobState.CREATED].count == 3
    assert rows["q", JobState.CREATED].oldest_waiting == timedelta(seconds=90)
    assert rows["q", JobState.COMPLETED].count == 1


async def test_retention_archives_finished_jobs_and_never_touches_unrun_ones(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    done = await fake_boss.send("q", None)
    never_run = await fake_boss.send("q", None, priority=-1)
    later = await fake_boss.send("q", None, start_after=timedelta(days=30))
    assert done and never_run and later
    (job,) = await fake_boss.fetch("q")
    assert job.id == done
    await fake_boss.complete(job)
    maintenance = fake_boss.maintenance(
        archive_after=timedelta(hours=1), delete_after=timedelta(days=1)
    )
    clock.advance(timedelta(days=20))
    report = await maintenance.run_once()
    assert report.archived == 1
    assert (await fake_boss.get_job(done)).state is JobState.COMPLETED  # still inspectable
    clock.advance(timedelta(days=2))
    assert (await maintenance.run_once()).pruned == 1
    with pytest.raises(NotFound):
        await fake_boss.get_job(done)
    assert (await fake_boss.get_job(never_run)).state is JobState.CREATED
    assert (await fake_boss.get_job(later)).state is JobState.CREATED


async def test_send_on_the_callers_connection_commits_with_it(boss: Shoal, db_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        await conn.execute("CREATE TABLE orders (id int)")
        await conn.execute("INSERT INTO orders VALUES (1)")
        job_id = await boss.send("q", {"order": 1}, conn=conn)
        assert job_id is not None
        await conn.rollback()
    with pytest.raises(NotFound):
        await boss.get_job(job_id)
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        ids = await boss.insert([{"queue": "q", "data": {"order": 2}}], conn=conn)
        await conn.commit()
    job_id = ids[0]
    assert job_id is not None
    assert (await boss.get_job(job_id)).data == {"order": 2}


async def test_get_job_of_unknown_id_is_not_found(boss: Shoal) -> None:
    with pytest.raises(NotFound, match="job 424242"):
        await boss.get_job(424242)  # type: ignore[arg-type]
