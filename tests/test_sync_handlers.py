"""Plain ``def`` handlers and item handlers run in threads, with the outcomes of async ones."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from datetime import timedelta
from typing import Any

import pytest

from shoal import App, InvalidInput, Job, JobState, PermanentError, Shoal
from shoal.batch.item import Item
from shoal.batch.states import TaskStatus
from shoal.testing import Probe, drain, run_job

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


async def test_a_plain_def_handler_runs_in_a_thread_and_its_outcomes_are_recorded(
    boss: Shoal,
) -> None:
    loop_thread = threading.current_thread()
    seen: list[tuple[str, bool]] = []

    def handler(job: Job) -> dict[str, Any]:
        seen.append((job.data["kind"], threading.current_thread() is loop_thread))
        if job.data["kind"] == "bad":
            raise PermanentError("no such user")
        if job.data["kind"] == "flaky" and job.attempt == 1:
            raise ConnectionError("smtp down")
        return {"sent": job.data["kind"]}

    ok = await boss.send("mail", {"kind": "ok"})
    bad = await boss.send("mail", {"kind": "bad"}, retry_limit=3)
    flaky = await boss.send("mail", {"kind": "flaky"}, retry_limit=1, retry_delay=0)
    assert ok is not None and bad is not None and flaky is not None

    result = await drain(boss, "mail", handler)

    assert (result.completed, result.failed, result.retried) == (2, 1, 1)
    assert all(not on_loop for _, on_loop in seen), "a plain def ran on the event loop"
    assert (await boss.get_job(ok)).output == {"sent": "ok"}
    assert (await boss.get_job(bad)).state is JobState.FAILED  # permanent: no retry
    flaky_job = await boss.get_job(flaky)
    assert (flaky_job.state, flaky_job.output) == (JobState.COMPLETED, {"sent": "flaky"})


async def test_plain_def_handlers_run_as_many_at_once_as_the_concurrency(boss: Shoal) -> None:
    # Each run waits at the barrier for the other three: with fewer threads
    # than the concurrency the barrier breaks and every job would retry.
    barrier = threading.Barrier(4, timeout=30)

    def handler(job: Job) -> int:
        return barrier.wait()

    probe = Probe(boss)
    await boss.insert([{"queue": "wide", "data": {"i": i}, "retry_limit": 0} for i in range(4)])
    worker = boss.work("wide", handler, concurrency=4)
    try:
        finished = await probe.job_finished("wide", count=4)
    finally:
        await worker.stop()
    assert sorted(e["outcome"] for e in finished) == ["completed"] * 4
    assert not barrier.broken


async def test_a_plain_def_handler_sees_the_context_variables_of_its_caller() -> None:
    def handler(job: Job) -> str:
        return REQUEST_ID.get()

    REQUEST_ID.set("req-7")
    run = await run_job(handler)
    assert (run.outcome, run.output) == ("completed", "req-7")


async def test_a_plain_def_item_handler_completes_a_batch_task(boss: Shoal) -> None:
    app = App()
    loop_thread = threading.current_thread()
    threads: set[bool] = set()

    @app.batch("sync.items", concurrency=3)
    def handle(item: Item) -> dict[str, int]:
        threads.add(threading.current_thread() is loop_thread)
        if item.ref == "broken":
            raise PermanentError("unreadable")
        return {"length": len(item.ref)}

    probe = Probe(boss)
    stop = asyncio.Event()
    runner = asyncio.create_task(app.run(boss, stop=stop, maintenance=False))
    try:
        batches = app.batches(boss)
        created = await batches.create("sync.items", ["a", "bb", "ccc", "broken"])

        def closes_it(event: Any) -> bool:
            return any(t.id == created.task_id for t in event["report"].closed)

        await probe.aggregator_pass(closes_it)
        view = await batches.get(created.task_id)
    finally:
        stop.set()
        await runner
    assert view.status is TaskStatus.COMPLETED
    assert (view.progress.completed, view.progress.error) == (3, 1)
    assert threads == {False}


async def test_a_handler_that_is_not_callable_is_refused_when_registered(boss: Shoal) -> None:
    with pytest.raises(InvalidInput, match="handler"):
        boss.work("q", "send_email", poll_interval=timedelta(seconds=1))  # type: ignore[arg-type]


def test_a_plain_def_ingest_consumer_is_refused_when_declared() -> None:
    from shoal import Message, Topic

    app = App()

    def apply(message: Message[Any]) -> None:
        pass

    with pytest.raises(InvalidInput, match=r"card\.ingest.*async def"):
        app.consumer(Topic("card.ingest"))(apply)  # type: ignore[arg-type]
