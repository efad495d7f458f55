"""Limits across processes, through the public API on a real PostgreSQL.

Claims here go through ``Shoal.fetch`` (the limited claim) and
``shoal.testing.drain`` on a fake clock: the database's idea of now is the
test's, so a rate's refill and a RetryAfter's pause move only with
``clock.advance``. The real-process checks are in test_limits_processes.py.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta
from typing import Any

import httpx
import pytest

from shoal import (
    FakeClock,
    InvalidInput,
    Job,
    JobState,
    Rate,
    RetryAfter,
    Shoal,
    Snooze,
)
from shoal.api import create_api
from shoal.app import App
from shoal.batch.service import Batches
from shoal.db import Database
from shoal.testing import drain
from tests.conftest import wait_for

Q = "limited"


async def active_by_partition(boss: Shoal, queue: str = Q) -> Counter[str]:
    async with boss.db.connection() as conn:
        cur = await conn.execute(
            "SELECT partition_key, count(*) FROM shoal.job "
            "WHERE queue = %s AND state = 'active' GROUP BY 1",
            (queue,),
        )
        return Counter({k: n for k, n in await cur.fetchall()})


async def test_global_concurrency_caps_active_jobs_and_frees_slots_on_completion(
    fake_boss: Shoal,
) -> None:
    await fake_boss.declare_limits(Q, global_concurrency=3)
    await fake_boss.insert_many(Q, list(range(10)))
    first = await fake_boss.fetch(Q, 10)
    assert len(first) == 3
    assert await fake_boss.fetch(Q, 10) == []
    assert await fake_boss.complete(first[0])
    again = await fake_boss.fetch(Q, 10)
    assert len(again) == 1
    # Oldest first, as without limits.
    assert [j.data for j in [*first, *again]] == [0, 1, 2, 3]


async def test_concurrent_claimers_never_exceed_the_global_limit(db_url: str) -> None:
    clients = [Shoal(await Database(db_url, max_size=2).open(), listen=False) for _ in range(8)]
    try:
        await clients[0].declare_limits(Q, global_concurrency=5)
        await clients[0].insert_many(Q, list(range(100)))
        for _ in range(3):
            claims = await asyncio.gather(*(c.fetch(Q, 4) for c in clients))
            assert sum(len(c) for c in claims) <= 5
        assert (await active_by_partition(clients[0]))[""] == 5
    finally:
        for client in clients:
            await client.close()


async def test_rate_limit_allows_a_burst_then_refills_with_time(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    await fake_boss.declare_limits(Q, rate_limit=Rate(10, per=timedelta(seconds=1), burst=5))
    await fake_boss.insert_many(Q, list(range(50)))
    assert len(await fake_boss.fetch(Q, 50)) == 5  # the full bucket
    assert await fake_boss.fetch(Q, 50) == []
    clock.advance(timedelta(milliseconds=500))
    assert len(await fake_boss.fetch(Q, 50)) == 5  # 10/s for half a second
    clock.advance(timedelta(milliseconds=150))
    assert len(await fake_boss.fetch(Q, 50)) == 1
    clock.advance(timedelta(hours=1))
    assert len(await fake_boss.fetch(Q, 50)) == 5  # never more than the bucket holds
    (state,) = await fake_boss.limits(Q)
    assert state.rate == Rate(10, per=timedelta(seconds=1), burst=5)
    assert state.tokens is not None and state.tokens < 1


async def test_weighted_costs_spend_tokens_by_cost(fake_boss: Shoal, clock: FakeClock) -> None:
    await fake_boss.declare_limits(Q, rate_limit=Rate(1000, per=timedelta(minutes=1), burst=1000))
    for tokens in (400, 400, 400, 100):
        await fake_boss.send(Q, {"tokens": tokens}, cost=tokens)
    assert [j.data["tokens"] for j in await fake_boss.fetch(Q, 10)] == [400, 400]
    clock.advance(timedelta(seconds=12))  # 200 tokens more: 400 in the bucket
    assert [j.data["tokens"] for j in await fake_boss.fetch(Q, 10)] == [400]


async def test_a_reported_cost_charges_the_difference_after_the_run(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    await fake_boss.declare_limits(Q, rate_limit=Rate(1000, per=timedelta(minutes=1)))
    await fake_boss.send(Q, {"used": 900}, cost=100)  # estimated 100, used 900
    await fake_boss.send(Q, {"used": 0}, cost=100)

    async def handler(job: Job) -> None:
        job.report_cost(job.data["used"])

    assert (await drain(fake_boss, Q, handler)).completed == 2
    (state,) = await fake_boss.limits(Q)
    # 1000 - 100 - 100 at the starts; then -800 and +100 after the runs.
    assert state.tokens == pytest.approx(100)
    with pytest.raises(InvalidInput, match="cost"):
        Job.report_cost(Job(None), -1)  # type: ignore[arg-type]


async def test_partitions_are_limited_each_and_take_turns(fake_boss: Shoal) -> None:
    await fake_boss.declare_limits(Q, global_concurrency=2, partition_by="account_id")
    await fake_boss.insert_many(Q, [{"account_id": a, "n": n} for a in "abc" for n in range(5)])
    claimed = await fake_boss.fetch(Q, 100)
    assert Counter(j.data["account_id"] for j in claimed) == {"a": 2, "b": 2, "c": 2}
    assert await fake_boss.fetch(Q, 100) == []
    for job in claimed:
        await fake_boss.complete(job)
    # Claims of three: each starts after the partition the previous one served last.
    turns = []
    for _ in range(3):
        batch = await fake_boss.fetch(Q, 3)
        turns.append("".join(j.data["account_id"] for j in batch))
        for job in batch:
            await fake_boss.complete(job)
    assert turns == ["aab", "cca", "bbc"]


async def test_a_partition_function_keys_jobs_when_they_are_sent(fake_boss: Shoal) -> None:
    await fake_boss.declare_limits(
        Q, global_concurrency=1, partition_by=lambda data: data["tenant"].lower()
    )
    await fake_boss.insert_many(Q, [{"tenant": t} for t in ("A", "a", "B")])
    await fake_boss.send(Q, {"tenant": "C"})
    claimed = await fake_boss.fetch(Q, 10)
    assert sorted(j.data["tenant"] for j in claimed) == ["A", "B", "C"]
    states = {s.partition_key: s for s in await fake_boss.limits(Q)}
    assert states["a"].running == 1 and states["a"].waiting == 1
    assert states["a"].partition_by is not None and "lambda" in states["a"].partition_by


async def test_thousands_of_partitions_need_no_configuration(fake_boss: Shoal) -> None:
    await fake_boss.declare_limits(Q, global_concurrency=1, partition_by="k")
    await fake_boss.insert_many(Q, [{"k": i % 2000} for i in range(4000)])
    seen: Counter[str] = Counter()
    for _ in range(5):
        batch = await fake_boss.fetch(Q, 500)
        assert max((await active_by_partition(fake_boss)).values()) == 1
        seen.update(str(j.data["k"]) for j in batch)
    assert len(seen) == 2000 and set(seen.values()) == {1}


async def test_jobs_sent_before_the_limits_were_declared_are_limited_too(
    fake_boss: Shoal,
) -> None:
    await fake_boss.insert_many(Q, [{"account_id": i % 2} for i in range(6)])
    await fake_boss.declare_limits(Q, global_concurrency=1, partition_by="account_id")
    assert sorted(j.data["account_id"] for j in await fake_boss.fetch(Q, 10)) == [0, 1]


async def test_a_partition_key_sent_with_the_job_wins_over_the_field(fake_boss: Shoal) -> None:
    await fake_boss.declare_limits(Q, global_concurrency=1, partition_by="account_id")
    await fake_boss.send(Q, {"account_id": 1}, partition_key="x")
    await fake_boss.send(Q, {"account_id": 2}, partition_key="x")
    assert len(await fake_boss.fetch(Q, 10)) == 1


async def test_slots_of_expired_leases_come_back(fake_boss: Shoal, clock: FakeClock) -> None:
    await fake_boss.declare_limits(Q, global_concurrency=2)
    await fake_boss.insert_many(Q, list(range(4)), expire_in=timedelta(seconds=30))
    assert len(await fake_boss.fetch(Q, 10)) == 2  # then their worker "dies"
    assert await fake_boss.fetch(Q, 10) == []
    clock.advance(timedelta(seconds=31))
    report = await fake_boss.maintain()
    assert report.retried == 2
    assert len(await fake_boss.fetch(Q, 10)) == 2


async def test_retry_after_pauses_only_its_partition_and_spends_no_attempt(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    await fake_boss.declare_limits(Q, global_concurrency=5, partition_by="account_id")
    throttled = await fake_boss.send(Q, {"account_id": "a", "n": 0})
    assert throttled is not None
    ran: list[tuple[str, int]] = []
    throttle = [True]

    async def handler(job: Job) -> None:
        ran.append((job.data["account_id"], job.data["n"]))
        if throttle.pop() if throttle else False:  # the gateway's 429, once
            raise RetryAfter(30)

    result = await drain(fake_boss, Q, handler)
    assert result.released == 1
    record = await fake_boss.get_job(throttled)
    assert record.state is JobState.CREATED and record.attempt == 0
    await fake_boss.insert_many(Q, [{"account_id": a, "n": n} for a in "ab" for n in (1, 2)])
    ran.clear()
    await drain(fake_boss, Q, handler)
    assert ran == [("b", 1), ("b", 2)]  # "a" waits, "b" goes on
    (paused,) = [s for s in await fake_boss.limits(Q) if s.partition_key == "a"]
    assert paused.paused_until == clock.now() + timedelta(seconds=30)
    clock.advance(timedelta(seconds=30))
    ran.clear()
    await drain(fake_boss, Q, handler)
    assert sorted(ran) == [("a", 0), ("a", 1), ("a", 2)]
    record = await fake_boss.get_job(throttled)
    assert record.state is JobState.COMPLETED and record.attempt == 1


async def test_partition_state_is_pruned_once_it_says_nothing(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    await fake_boss.declare_limits(
        Q, rate_limit=Rate(10, per=timedelta(seconds=1)), partition_by="k"
    )
    await fake_boss.insert_many(Q, [{"k": k} for k in range(100)])
    assert len(await fake_boss.fetch(Q, 100)) == 100
    assert (await fake_boss.maintain()).buckets_pruned == 0  # each spent a token
    clock.advance(timedelta(milliseconds=100))  # one token back: full again
    assert (await fake_boss.maintain()).buckets_pruned == 100
    assert {s.running for s in await fake_boss.limits(Q)} == {1}


async def test_retry_after_is_a_snooze() -> None:
    error = RetryAfter(timedelta(seconds=7))
    assert isinstance(error, Snooze) and error.delay == timedelta(seconds=7)


async def test_a_worker_with_limits_declares_them_and_holds_to_them(
    boss: Shoal, observer: Shoal
) -> None:
    await observer.insert_many(Q, [{"account_id": i % 3} for i in range(30)])
    peak = 0
    running: Counter[int] = Counter()
    release = asyncio.Event()

    async def handler(job: Job) -> None:
        nonlocal peak
        running[job.data["account_id"]] += 1
        peak = max(peak, *running.values())
        await release.wait()
        running[job.data["account_id"]] -= 1

    worker = boss.work(Q, handler, concurrency=20, global_concurrency=2, partition_by="account_id")
    await wait_for(lambda: sum(running.values()) == 6)
    assert peak == 2
    release.set()
    await wait_for(lambda: worker.stats.completed == 30)
    assert peak == 2
    await worker.stop()


async def test_a_worker_without_limits_takes_up_limits_declared_elsewhere(
    fake_boss: Shoal, observer: Shoal, clock: FakeClock
) -> None:
    started = asyncio.Event()
    running = 0
    release = asyncio.Event()

    async def handler(job: Job) -> None:
        nonlocal running
        running += 1
        started.set()
        await release.wait()
        running -= 1

    worker = fake_boss.work(Q, handler, concurrency=10)
    await observer.declare_limits(Q, global_concurrency=2)
    clock.advance(timedelta(seconds=31))  # past its next look at the queue's limits
    await fake_boss.insert_many(Q, list(range(6)))  # due on the test's clock
    await started.wait()
    await wait_for(lambda: worker.stats.claimed >= 2)
    assert len(await observer.fetch(Q, 10)) == 0  # the worker holds both slots
    assert running == 2
    release.set()
    await wait_for(lambda: worker.stats.completed == 6)
    await worker.stop()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"global_concurrency": -1}, "global_concurrency"),
        ({"global_concurrency": 0}, "global_concurrency"),
        ({"global_concurrency": True}, "global_concurrency"),
        ({"partition_by": 3.5}, "partition_by"),
        ({"partition_by": ""}, "partition_by"),
        ({"rate_limit": 100}, "rate_limit"),
        ({}, "limits"),
    ],
)
async def test_bad_limits_are_refused_naming_the_field(
    fake_boss: Shoal, kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidInput) as caught:
        await fake_boss.declare_limits(Q, **kwargs)
    assert caught.value.field == field
    if kwargs:
        with pytest.raises(InvalidInput) as caught:
            App().handler(Q, **kwargs)
        assert caught.value.field == field
        with pytest.raises(InvalidInput) as caught:
            fake_boss.work(Q, lambda job: None, **kwargs)
        assert caught.value.field == field
    assert await fake_boss.limits() == []


@pytest.mark.parametrize(
    ("rate", "field"),
    [
        ({"count": -1}, "rate_limit.count"),
        ({"count": 10, "per": 0}, "rate_limit.per"),
        ({"count": 10, "per": "1s"}, "rate_limit.per"),
        ({"count": 10, "burst": 0}, "rate_limit.burst"),
    ],
)
def test_bad_rates_are_refused_naming_the_field(rate: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        Rate(**rate)
    assert caught.value.field == field


async def test_bad_costs_and_keys_are_refused_naming_the_field(fake_boss: Shoal) -> None:
    for options, field in (
        ({"cost": 0}, "cost"),
        ({"cost": 1.5}, "cost"),
        ({"partition_key": ["a"]}, "partition_key"),
    ):
        with pytest.raises(InvalidInput) as caught:
            await fake_boss.send(Q, {}, **options)
        assert caught.value.field == field
    await fake_boss.declare_limits(Q, global_concurrency=1, partition_by=lambda d: d["missing"])
    with pytest.raises(InvalidInput, match="partition_by function of queue 'limited' failed"):
        await fake_boss.send(Q, {})
    await fake_boss.declare_limits(Q, global_concurrency=1, partition_by=lambda d: {"a": 1})
    with pytest.raises(InvalidInput, match="partition_key: a partition key must be a string"):
        await fake_boss.send(Q, {})


async def test_the_api_and_metrics_show_running_against_limits_and_what_is_held(
    fake_boss: Shoal,
) -> None:
    await fake_boss.declare_limits(Q, global_concurrency=1, partition_by="account_id")
    await fake_boss.insert_many(Q, [{"account_id": a} for a in "aab"])
    await fake_boss.fetch(Q, 10)
    api = create_api(fake_boss, Batches(fake_boss, {}), token=None)
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        rows = (await client.get("/v1/limits", params={"queue": Q})).json()["limits"]
        by_key = {r["partition_key"]: r for r in rows}
        assert by_key["a"]["running"] == 1 and by_key["a"]["waiting"] == 1
        assert (
            by_key["a"]["global_concurrency"] == 1 and by_key["a"]["partition_by"] == "account_id"
        )
        assert by_key["b"]["running"] == 1 and by_key["b"]["waiting"] == 0
        bad = await client.get("/v1/limits", params={"queue": "no way"})
        assert bad.status_code == 422
        text = (await client.get("/metrics")).text
    assert f'shoal_queue_limit_running{{queue="{Q}"}} 2' in text
    assert f'shoal_queue_limit_held_jobs{{queue="{Q}",reason="concurrency"}} 1' in text
    assert f'shoal_queue_limit_held_partitions{{queue="{Q}",reason="paused"}} 0' in text
