"""The worker registry and the history sampler, driven by a FakeClock; and their
routes (/v1/workers, /v1/history, /v1/overview) over a real database."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from shoal import FakeClock, PermanentError, Shoal
from shoal.api import create_api
from shoal.app import App
from shoal.batch.service import Batches
from shoal.console.history import History
from shoal.db.pool import Database
from shoal.queue.history import COARSE_S, FINE_S, HistorySampler
from shoal.queue.job import Job
from shoal.queue.registry import HEARTBEAT_S, WorkerRegistry
from shoal.testing import drain

from .conftest import wait_for

START = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
async def timed(db_url: str, clock: FakeClock) -> AsyncIterator[Shoal]:
    db = await Database(db_url, max_size=6).open()
    boss = Shoal(db, clock=clock, listen=False)
    try:
        yield boss
    finally:
        await boss.close()


def client_for(boss: Shoal) -> httpx.AsyncClient:
    api = create_api(boss, Batches(boss, {}), token=None)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://127.0.0.1")


# -- registry -------------------------------------------------------------------


async def test_workers_heartbeat_show_as_gone_then_are_dropped(
    timed: Shoal, clock: FakeClock
) -> None:
    a = WorkerRegistry(
        timed, app="a:app", queues={"email": 10}, counters=lambda: ({"email": 3}, 42)
    )
    b = WorkerRegistry(timed, app="b:app", queues={"report": 1})
    for registry in (a, b):
        await registry.register()
        await registry.heartbeat()
    async with client_for(timed) as client:
        workers = (await client.get("/v1/workers")).json()["workers"]
        assert {(w["app"], w["gone"]) for w in workers} == {("a:app", False), ("b:app", False)}
        (wa,) = [w for w in workers if w["app"] == "a:app"]
        assert wa["queues"] == {"email": 10} and wa["running"] == 3 and wa["done"] == 42

        clock.advance(timedelta(seconds=31))
        await a.heartbeat()  # b stopped heartbeating
        gone = {w["app"]: w["gone"] for w in (await client.get("/v1/workers")).json()["workers"]}
        assert gone == {"a:app": False, "b:app": True}

        clock.advance(timedelta(seconds=300))
        await a.heartbeat()  # any heartbeat drops rows gone that long
        apps = [w["app"] for w in (await client.get("/v1/workers")).json()["workers"]]
        assert apps == ["a:app"]

        await a.deregister()
        assert (await client.get("/v1/workers")).json()["workers"] == []
        # A process whose row was dropped while it stalled registers again.
        await a.heartbeat()
        assert len(await a.workers()) == 1


async def test_a_running_app_registers_its_process_and_removes_it_on_stop(boss: Shoal) -> None:
    app = App(name="tests:registry_app")

    @app.handler("email", concurrency=7)
    async def send(job: Job) -> None:
        return None

    stop = asyncio.Event()
    registry = WorkerRegistry(boss)
    run = asyncio.create_task(app.run(boss, stop=stop, maintenance=False, scheduler=False))

    async def registered() -> bool:
        return bool(await registry.workers())

    await wait_for(registered)
    (row,) = await registry.workers()
    assert row.app == "tests:registry_app" and row.queues == {"email": 7} and not row.gone
    stop.set()
    await run
    assert await registry.workers() == []


async def test_the_jobs_an_app_runs_are_its_heartbeats_running_and_the_samples_running(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    app = App(name="tests:busy_app")
    started: list[int] = []
    release = asyncio.Event()

    @app.handler("email", concurrency=4)
    async def send(job: Job) -> None:
        started.append(job.id)
        await release.wait()

    stop = asyncio.Event()
    registry = WorkerRegistry(fake_boss)
    run = asyncio.create_task(app.run(fake_boss, stop=stop, maintenance=False, scheduler=False))
    try:
        await wait_for(lambda: registry.workers())
        await fake_boss.insert([{"queue": "email"}] * 3)
        await wait_for(lambda: len(started) == 3)

        async def reported() -> bool:
            if [w.running for w in await registry.workers()] == [3]:
                return True
            clock.advance(timedelta(seconds=HEARTBEAT_S))  # the next heartbeat
            return False

        await wait_for(reported)
        await HistorySampler(fake_boss).sample_once()
        for queue in ("email", "*"):
            (sample,) = (await History(fake_boss).history(queue=queue, window="15m"))[1]
            assert (sample.waiting, sample.running) == (0, 3), queue
    finally:
        release.set()
        stop.set()
        await run


async def test_a_process_running_workers_without_an_app_registers_too(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    """A library's own ``work()`` shows on the Workers page, with what it runs."""
    started: list[int] = []
    release = asyncio.Event()

    async def send(job: Job) -> None:
        started.append(job.id)
        await release.wait()

    registry = WorkerRegistry(fake_boss)
    fake_boss.work("email", send, concurrency=3)
    fake_boss.work("sms", send, concurrency=2)
    await fake_boss.insert([{"queue": "email"}] * 2)

    async def reported() -> bool:
        rows = await registry.workers()
        if [(w.app, w.queues, w.running) for w in rows] == [("", {"email": 3, "sms": 2}, 2)]:
            return True
        clock.advance(timedelta(seconds=HEARTBEAT_S))  # the next heartbeat
        return False

    try:
        await wait_for(lambda: len(started) == 2)
        await wait_for(reported)
    finally:
        release.set()
    await fake_boss.stop_workers(timedelta(seconds=5))
    assert await registry.workers() == []


# -- history --------------------------------------------------------------------


def percentile(values: list[float], fraction: float) -> float:
    """PostgreSQL's percentile_cont: linear between the two nearest ranks."""
    position = fraction * (len(values) - 1)
    low = int(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


async def test_sampler_writes_one_sample_per_interval_with_counts_depths_percentiles(
    timed: Shoal, clock: FakeClock
) -> None:
    async def work(job: Job) -> None:
        clock.advance(timedelta(seconds=job.data["run_s"]))
        if job.data["fail"]:
            raise PermanentError("no")

    await timed.send("email", {}, start_after=timedelta(hours=1))  # waiting
    await timed.send("report", {})
    for i in range(4):  # each waits i/4 s and runs (i + 1)/2 s: all within one interval
        await timed.send("email", {"fail": i == 3, "run_s": (i + 1) / 2}, retry_limit=0)
        clock.advance(timedelta(seconds=i / 4))
        assert (await drain(timed, "email", work)).ran == 1
    sampler = HistorySampler(timed)
    charts = History(timed)
    clock.advance(timedelta(seconds=FINE_S))
    written = await sampler.sample_once()
    assert written[FINE_S] == 4  # email, report, '*' and '**'
    assert (await sampler.sample_once())[FINE_S] == 0  # this slot is taken

    resolution, samples = await charts.history(queue="email", window="15m")
    assert resolution == FINE_S
    (sample,) = samples
    assert (sample.completed, sample.failed, sample.waiting) == (3, 1, 1)
    # The percentiles are those of the finished jobs' own rows.
    finished = [j for j in await timed.jobs("email") if j.finished_at is not None]
    runs = sorted((j.finished_at - j.started_at).total_seconds() for j in finished)  # type: ignore[operator]
    waits = sorted((j.started_at - j.created_at).total_seconds() for j in finished)  # type: ignore[operator]
    assert len(set(runs)) > 1
    assert sample.run_p50_s == pytest.approx(percentile(runs, 0.5), rel=1e-5)
    assert sample.run_p95_s == pytest.approx(percentile(runs, 0.95), rel=1e-5)
    assert sample.wait_p50_s == pytest.approx(percentile(waits, 0.5), rel=1e-5)
    assert sample.wait_p95_s == pytest.approx(percentile(waits, 0.95), rel=1e-5)
    (everything,) = (await charts.history(queue="*", window="15m"))[1]
    assert (everything.completed, everything.waiting) == (3, 2)

    clock.advance(timedelta(seconds=FINE_S))
    await sampler.sample_once()
    samples = (await charts.history(queue="email", window="15m"))[1]
    assert [s.completed for s in samples] == [3, 0]  # counts are per interval

    clock.advance(timedelta(hours=25))
    await sampler.sample_once()
    samples = (await charts.history(queue="*", window="1h"))[1]
    assert len(samples) == 1  # older 10 s samples are past their 24 h
    assert (await charts.history(queue="*", window="24h"))[0] == COARSE_S


async def test_past_the_cap_finished_counts_are_scaled_from_the_latest_jobs(
    timed: Shoal, clock: FakeClock
) -> None:
    async def work(job: Job) -> None:
        clock.advance(timedelta(seconds=job.data["run_s"]))

    # Four jobs finish 1, 3, 5 and 7 s into the interval, each after a 1 s run.
    for at_s in (1, 3, 5, 7):
        clock.advance(START + timedelta(seconds=at_s - 1) - clock.now())
        await timed.send("bulk", {"run_s": 1}, retry_limit=0)
        assert (await drain(timed, "bulk", work)).ran == 1
    clock.advance(START + timedelta(seconds=FINE_S) - clock.now())
    sampler = HistorySampler(timed)
    charts = History(timed)
    sampler.finished_cap = 1
    assert (await sampler.sample_once())[FINE_S] == 3  # bulk, '*' and '**'

    (sample,) = (await charts.history(queue="bulk", window="15m"))[1]
    # Two read (the cap and one more, to know it was passed), finished in the
    # last 5 s of the 10 s interval: the count is twice theirs.
    assert sample.completed == 4
    assert sample.run_p50_s == pytest.approx(1.0)


async def test_past_the_cap_waiting_is_estimated_from_the_ids_of_one_priority(
    timed: Shoal, clock: FakeClock
) -> None:
    for i in range(5):  # interleaved: each queue's ids are every other one
        await timed.send("even", {"i": i})
        await timed.send("odd", {"i": i})
    for priority in (0, 0, 0, 5, 5):  # two priorities: counted, not estimated
        await timed.send("mixed", {}, priority=priority)
    await timed.send("small", {})
    clock.advance(timedelta(seconds=FINE_S))
    sampler = HistorySampler(timed)
    charts = History(timed)
    sampler.depth_cap = 2
    await sampler.sample_once()

    async def waiting(queue: str) -> int:
        (sample,) = (await charts.history(queue=queue, window="15m"))[1]
        return sample.waiting

    # even and odd: 3 read over 5 ids, the last 4 ids further: round(3 * 9 / 5).
    assert [await waiting(q) for q in ("even", "odd", "mixed", "small")] == [5, 5, 5, 1]
    assert await waiting("*") == 16


async def test_two_samplers_at_once_write_one_sample(timed: Shoal, clock: FakeClock) -> None:
    await timed.send("email", {})
    clock.advance(timedelta(seconds=FINE_S))
    results = await asyncio.gather(*(HistorySampler(timed).sample_once() for _ in range(4)))
    assert sum(r[FINE_S] for r in results) == 3  # email, '*' and '**', written once


async def test_history_and_overview_routes(timed: Shoal, clock: FakeClock) -> None:
    async def fail(job: Job) -> None:
        raise PermanentError("no")

    await timed.send("email", {}, retry_limit=0)
    clock.advance(timedelta(seconds=1))  # inside the interval that ends at 12:00:10
    await drain(timed, "email", fail)
    clock.advance(timedelta(seconds=FINE_S - 1))
    await HistorySampler(timed).sample_once()
    registry = WorkerRegistry(timed, app="x", queues={"email": 1})
    await registry.register()
    async with client_for(timed) as client:
        r = await client.get("/v1/history", params={"series": "failed,waiting", "queue": "email"})
        body: dict[str, Any] = r.json()
        assert body["resolution_s"] == FINE_S and body["queue"] == "email"
        assert body["series"] == {"failed": [1], "waiting": [0]} and len(body["at"]) == 1

        r = await client.get("/v1/overview", params={"window": "15m"})
        overview = r.json()
        assert overview["counts"] == {
            "failed_jobs": 1,
            "dead_letters": 0,
            "open_tasks": 0,
            "live_workers": 1,
            "paused_queues": 0,
        }
        assert overview["history"]["series"]["failed"] == [1]

        for params, status, field in [
            ({"window": "2h"}, 422, "window"),
            ({"series": "completed,bogus"}, 422, "series"),
            ({"queue": "nope"}, 404, "queue"),
            ({"queue": "a\x00b"}, 422, "queue"),  # refused by its syntax, before any SQL
        ]:
            r = await client.get("/v1/history", params=params)
            assert r.status_code == status and r.json()["field"] == field, r.text
        r = await client.get("/v1/overview", params={"window": "7d"})
        assert r.status_code == 422 and r.json()["field"] == "window"
