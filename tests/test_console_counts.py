"""The console's counts and searches as they are done for a big job table
(bench/console_bench.py): each unfinished state and failed counted from an
index of its own, completed and cancelled estimated past the exact limit, a
search found through the id and singleton-key indexes, and the history
sampler's depths from the same indexes. Each checked against the plain count."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from psycopg import sql

from shoal import FakeClock, PermanentError, Shoal
from shoal.api import create_api
from shoal.batch.service import Batches
from shoal.console.history import History
from shoal.console.queues import ESTIMATED_STATES, QueueInspector
from shoal.queue.history import FINE_S, HistorySampler
from shoal.queue.job import Job
from shoal.queue.registry import GONE_S, WorkerRegistry
from shoal.testing import drain

from .test_console_api import client_for


async def fail(job: Job) -> None:
    if job.data.get("flaky"):
        raise RuntimeError("later")  # retried while attempts remain
    raise PermanentError("no")


async def ok(job: Job) -> None:
    return None


async def analyze(boss: Shoal) -> None:
    query = sql.SQL("ANALYZE {}").format(sql.Identifier(boss.db.schema, "job"))

    async def run(conn: Any) -> None:
        await conn.execute(query)

    await boss.db.run(run)


async def some_of_each_state(boss: Shoal) -> None:
    """email: 3 completed, 2 failed, 1 retrying, 2 waiting, 1 cancelled; sms: 1 completed."""
    for _ in range(3):
        await boss.send("email", {"ok": True})
    await drain(boss, "email", ok)
    for _ in range(2):
        await boss.send("email", {}, retry_limit=0)
    await boss.send("email", {"flaky": True}, retry_limit=1, retry_delay=timedelta(hours=1))
    await drain(boss, "email", fail)  # two fail for good, one waits for its retry
    cancelled = await boss.send("email", {})
    assert cancelled is not None
    await boss.cancel(cancelled)
    await boss.send("email", {})
    await boss.send("email", {}, start_after=timedelta(hours=1))
    await boss.send("sms", {})
    await drain(boss, "sms", ok)


async def test_queues_past_the_exact_limit_count_unfinished_and_failed_and_estimate_the_rest(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    boss = fake_boss
    await some_of_each_state(boss)
    clock.advance(timedelta(seconds=5))
    await analyze(boss)
    inspector = QueueInspector(boss)
    exact = {q.queue: q for q in await inspector.queues()}
    assert exact["email"].counts == {
        "created": 2,
        "retry": 1,
        "active": 0,
        "completed": 3,
        "cancelled": 1,
        "failed": 2,
    }
    assert exact["email"].estimated == ()

    inspector.exact_count_limit = 0  # any table is "big"
    big = {q.queue: q for q in await inspector.queues()}
    assert big.keys() == exact.keys()
    for name, summary in big.items():
        assert summary.estimated == ESTIMATED_STATES
        # Analyzed whole, a small table's estimates are its counts.
        assert summary.counts == exact[name].counts, name
        assert summary.paused == exact[name].paused
    # The one due job waits (the retry and the other are due in an hour).
    assert big["email"].oldest_waiting_s == exact["email"].oldest_waiting_s == 5.0
    assert await inspector.failed_total() == 2

    async with client_for(create_api(boss, Batches(boss, {}), token=None)) as client:
        body = (await client.get("/v1/queues")).json()
        assert all(q["estimated"] == [] for q in body["queues"])
        overview = (await client.get("/v1/overview")).json()
        assert overview["counts"]["failed_jobs"] == 2


async def test_search_finds_finished_and_unfinished_jobs_by_key_and_by_id(boss: Shoal) -> None:
    done = await boss.send("mail", {}, singleton_key="order-7")
    await drain(boss, "mail", ok)
    waiting = await boss.send("mail", {}, singleton_key="order-7")  # the key is free again
    elsewhere = await boss.send("sms", {}, singleton_key="order-7")
    assert None not in (done, waiting, elsewhere)
    numbered = await boss.send("mail", {}, singleton_key=str(done))  # a key that is an id

    async with client_for(create_api(boss, Batches(boss, {}), token=None)) as client:

        async def found(**params: Any) -> list[int]:
            response = await client.get("/v1/jobs", params=params)
            assert response.status_code == 200, response.text
            return [j["id"] for j in response.json()["jobs"]]

        assert await found(q="order-7") == [elsewhere, waiting, done]
        assert await found(q="order-7", queue="mail") == [waiting, done]
        assert await found(q="order-7", state="completed") == [done]
        assert await found(q="order-7", limit=1) == [elsewhere]
        page = (await client.get("/v1/jobs", params={"q": "order-7", "limit": 2})).json()
        rest = await found(q="order-7", cursor=page["next_cursor"])
        assert [j["id"] for j in page["jobs"]] + rest == [elsewhere, waiting, done]
        assert await found(q=str(done)) == [numbered, done]  # each once


async def test_sampled_depths_count_waiting_retrying_and_running_per_queue(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    """Waiting and retrying are counted in the job table; running is what the
    live worker processes reported at their last heartbeat."""
    await fake_boss.send("email", {"flaky": True}, retry_limit=1, retry_delay=timedelta(hours=1))
    await drain(fake_boss, "email", fail)  # now retrying
    for _ in range(2):
        await fake_boss.send("email", {})
    await fake_boss.send("sms", {})
    # A process gone quiet past GONE_S: what it last said it ran does not count.
    gone = WorkerRegistry(fake_boss, app="gone", counters=lambda: ({"sms": 5}, 0))
    await gone.heartbeat()
    clock.advance(timedelta(seconds=GONE_S + 1))
    running = {"sms": 1, "email": 0}
    alive = [WorkerRegistry(fake_boss, app=app, counters=lambda: (running, 0)) for app in "ab"]
    for registry in alive:
        await registry.heartbeat()
    clock.advance(timedelta(seconds=FINE_S))
    await HistorySampler(fake_boss).sample_once()
    for queue, depths in {"email": (2, 1, 0), "sms": (1, 0, 2), "*": (3, 1, 2)}.items():
        (sample,) = (await History(fake_boss).history(queue=queue, window="15m"))[1]
        assert (sample.waiting, sample.retrying, sample.running) == depths, queue
