"""shoal.testing: events a test awaits, inline runs, drains and enqueue assertions."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

import shoal.testing
from shoal import App, FakeClock, Job, JobState, PermanentError, Shoal, Snooze
from shoal.hooks import Event, Hooks
from shoal.ingest.message import Message
from shoal.ingest.pipeline import Pipeline
from shoal.testing import (
    Probe,
    assert_enqueued,
    drain,
    refute_enqueued,
    run_item,
    run_job,
)
from tests.conftest import until_done
from tests.ingest_helpers import READINGS, Reading, apply_reading, create_schema


@pytest.fixture
def probe(fake_boss: Shoal) -> Probe:
    return Probe(fake_boss)


def test_the_public_names_are_sorted_and_exist() -> None:
    assert list(shoal.testing.__all__) == sorted(shoal.testing.__all__)
    for name in shoal.testing.__all__:
        assert hasattr(shoal.testing, name), name


# -- the probe -------------------------------------------------------------------------


async def test_a_probe_reports_fetches_outcomes_and_idleness_of_a_worker(
    fake_boss: Shoal, probe: Probe
) -> None:
    async def handler(job: Job) -> int:
        if job.data == "bad":
            raise PermanentError("bad")
        return 1

    worker = fake_boss.work("q", handler)
    await probe.idle("q")  # the empty queue, before anything is sent
    good = await fake_boss.send("q", "good")
    bad = await fake_boss.send("q", "bad")
    finished = await probe.job_finished("q", count=2)
    assert {(e["job_id"], e["outcome"]) for e in finished} == {
        (good, "completed"),
        (bad, "failed"),
    }
    await probe.idle("q")
    await worker.stop()
    assert sum(e["count"] for e in probe.events if e.name == "fetched") == 2


async def test_a_wait_consumes_its_events_so_the_next_wait_needs_new_ones(
    fake_boss: Shoal, probe: Probe
) -> None:
    hooks = fake_boss.hooks
    hooks.emit("job_finished", "q", job_id=1, outcome="completed")
    hooks.emit("job_finished", "q", job_id=2, outcome="completed")
    (first,) = await probe.job_finished("q")
    (second,) = await probe.job_finished("q")
    assert (first["job_id"], second["job_id"]) == (1, 2)
    waiting = asyncio.ensure_future(probe.job_finished("q", job_id=3))
    await asyncio.sleep(0)  # noqa: TID251 - a yield: the wait is registered before the event
    assert not waiting.done()
    hooks.emit("job_finished", "q", job_id=3, outcome="retried")
    (third,) = await waiting
    assert third["outcome"] == "retried"


async def test_discard_drops_what_was_reported_before(fake_boss: Shoal, probe: Probe) -> None:
    fake_boss.hooks.emit("worker_idle", "q")
    probe.discard("worker_idle")
    with pytest.raises(AssertionError):
        await probe.idle("q", timeout_s=0.05)


async def test_a_wait_that_times_out_fails_with_what_was_seen(
    fake_boss: Shoal, probe: Probe
) -> None:
    fake_boss.hooks.emit("job_finished", "q", job_id=9, outcome="failed")
    with pytest.raises(AssertionError) as failure:
        await probe.job_finished("q", outcome="completed", timeout_s=0.05)
    message = str(failure.value)
    assert "1 job_finished event(s) with queue='q', outcome='completed'" in message
    assert "job_finished[q](job_id=9, outcome='failed')" in message


async def test_a_probe_refuses_an_unknown_event_name(probe: Probe) -> None:
    with pytest.raises(ValueError, match="unknown event 'job_done'"):
        await probe.wait_for("job_done")  # type: ignore[arg-type]


def test_a_failing_observer_never_breaks_the_reporter(caplog: pytest.LogCaptureFixture) -> None:
    hooks = Hooks()
    seen: list[Event] = []

    def broken(event: Event) -> None:
        raise RuntimeError("observer bug")

    hooks.add(broken)
    hooks.add(seen.append)
    hooks.emit("fetched", "q", count=0)
    assert [e.name for e in seen] == ["fetched"]
    assert "observer bug" in caplog.text
    hooks.remove(broken)
    hooks.remove(seen.append)
    assert not hooks


async def test_a_probe_reports_applied_and_failed_messages_and_monitor_samples(
    fake_boss: Shoal, clock: FakeClock, probe: Probe
) -> None:
    await create_schema(fake_boss.db)
    pipeline = Pipeline(fake_boss)
    await pipeline.start()
    stop = asyncio.Event()
    apply = apply_reading(fake_boss.db)

    async def apply_or_reject(message: Message[Reading]) -> None:
        if message.body.card_id == 99:
            raise LookupError("card 99 not found")
        await apply(message)

    consumer = pipeline.consumer(READINGS, apply_or_reject)
    monitor = pipeline.monitor([(READINGS.name, "shoal")], interval=timedelta(seconds=60))
    running = [asyncio.create_task(consumer.run(stop)), asyncio.create_task(monitor.run(stop))]
    try:
        ids = [(await pipeline.publish(READINGS, Reading(card_id=i, amount=1))) for i in range(3)]
        applied = await probe.message_applied(READINGS.name, count=3)
        assert sorted(e["message_id"] for e in applied) == sorted(ids)
        rejected = await pipeline.publish(READINGS, Reading(card_id=99, amount=1))
        (failed,) = await probe.message_failed(READINGS.name, settled="business")
        assert (failed["message_id"], failed["attempt"]) == (rejected, 1)
        (first,) = await probe.monitor_sampled(READINGS.name)
        # The next sample comes when the test moves the monitor's clock past its
        # interval. In steps: the monitor's round may still be running (it prunes
        # after it samples) and its sleep then counts from the clock as it finds it.
        again = asyncio.create_task(probe.monitor_sampled(READINGS.name))
        (second,) = await until_done(clock, again, step=timedelta(seconds=10))
        assert first["reading"].topic == second["reading"].topic == READINGS.name
    finally:
        stop.set()
        await asyncio.gather(*running)
        await pipeline.close()


# -- drain ---------------------------------------------------------------------------------


async def test_drain_runs_every_available_job_and_counts_the_outcomes(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    async def handler(job: Job) -> str:
        if job.data == "flaky" and job.attempt == 1:
            raise ValueError("first time")
        if job.data == "broken":
            raise PermanentError("never")
        if job.data == "later" and job.attempt == 1:
            raise ValueError("try again in a minute")
        return f"did {job.data}"

    ok = await fake_boss.send("q", "ok")
    await fake_boss.send("q", "flaky", retry_limit=1, retry_delay=0)
    await fake_boss.send("q", "broken")
    later = await fake_boss.send("q", "later", retry_limit=1, retry_delay=60)
    assert ok is not None and later is not None

    result = await drain(fake_boss, "q", handler)
    # flaky retried at once and ran again; later waits for its retry delay.
    assert (result.completed, result.failed, result.retried, result.ran) == (2, 1, 2, 5)
    assert (await fake_boss.get_job(ok)).output == "did ok"
    assert (await fake_boss.get_job(later)).state is JobState.RETRY

    clock.advance(timedelta(seconds=61))
    again = await drain(fake_boss, "q", handler)
    assert (again.completed, again.ran) == (1, 1)
    assert (await fake_boss.get_job(later)).state is JobState.COMPLETED


async def test_drain_gives_up_on_a_job_that_loops(fake_boss: Shoal) -> None:
    async def handler(job: Job) -> None:
        raise Snooze(timedelta(0))

    await fake_boss.send("q", None)
    with pytest.raises(AssertionError, match="ran more than 5 jobs"):
        await drain(fake_boss, "q", handler, limit=5)


# -- inline runs -------------------------------------------------------------------------


async def test_run_job_reports_what_the_worker_would_make_of_a_run() -> None:
    async def handler(job: Job) -> Any:
        if job.data == "permanent":
            raise PermanentError("no")
        if job.data == "flaky":
            raise ValueError("maybe later")
        if job.data == "snooze":
            raise Snooze(timedelta(seconds=5))
        return {"echo": job.data}

    done = await run_job(handler, "hello")
    assert (done.outcome, done.state, done.output) == (
        "completed",
        JobState.COMPLETED,
        {"echo": "hello"},
    )
    failed = await run_job(handler, "permanent", retry_limit=3)
    assert (failed.outcome, failed.state) == ("failed", JobState.FAILED)
    retried = await run_job(handler, "flaky", retry_limit=1, retry_delay=10)
    assert (retried.outcome, retried.retry_in) == ("retried", timedelta(seconds=10))
    last = await run_job(handler, "flaky", retry_limit=1, attempt=2)
    assert last.outcome == "failed" and isinstance(last.error, ValueError)
    snoozed = await run_job(handler, "snooze")
    assert (snoozed.outcome, snoozed.retry_in) == ("snoozed", timedelta(seconds=5))
    with pytest.raises(Exception, match="retry_limit"):
        await run_job(handler, "x", retry_limit=-1)


async def test_run_item_follows_the_kinds_rules() -> None:
    app = App()

    class Unreadable(Exception):
        pass

    @app.batch(
        "extract",
        retry_limit=2,
        retry_backoff=False,
        retry_delay=timedelta(seconds=3),
        permanent=(Unreadable,),
    )
    async def extract(item: Any) -> Any:
        if item.data == "scan":
            raise Unreadable("not a PDF")
        if item.data == "flaky":
            raise ConnectionError("timeout")
        return {"ref": item.ref, "title": item.params["prefix"] + item.data}

    kind = app.kinds["extract"]
    done = await run_item(kind, "paper", params={"prefix": "T:"}, ref="doi-1")
    assert (done.outcome, done.result) == ("completed", {"ref": "doi-1", "title": "T:paper"})
    assert (await run_item(kind, "scan")).outcome == "error"
    flaky = await run_item(kind, "flaky")
    assert (flaky.outcome, flaky.retry_in) == ("retried", timedelta(seconds=3))
    assert (await run_item(kind, "flaky", attempt=3)).outcome == "error"


# -- enqueue assertions ------------------------------------------------------------------


async def test_assert_enqueued_matches_data_and_options_and_lists_what_was_there(
    fake_boss: Shoal,
) -> None:
    await fake_boss.send("email", {"user_id": 7, "locale": "fr"}, priority=5)
    await fake_boss.send("email", {"user_id": 8})
    (job,) = await assert_enqueued(fake_boss, "email", {"user_id": 7}, priority=5)
    assert job.data == {"user_id": 7, "locale": "fr"}
    await assert_enqueued(fake_boss, "email", count=2)
    with pytest.raises(AssertionError) as failure:
        await assert_enqueued(fake_boss, "email", {"user_id": 9})
    message = str(failure.value)
    assert "expected a job in queue 'email' with data={'user_id': 9}, found 0" in message
    assert "2 created/retry job(s) in queue 'email':" in message
    assert "data={'user_id': 8}" in message
    with pytest.raises(AssertionError, match="no created/retry jobs in queue 'sms'"):
        await assert_enqueued(fake_boss, "sms")


async def test_refute_enqueued_fails_naming_the_matching_job(fake_boss: Shoal) -> None:
    await refute_enqueued(fake_boss, "email")
    await fake_boss.send("email", {"user_id": 7})
    await refute_enqueued(fake_boss, "email", {"user_id": 8})
    with pytest.raises(AssertionError, match=r"expected no job in queue 'email'.*user_id': 7"):
        await refute_enqueued(fake_boss, "email", {"user_id": 7})
    with pytest.raises(ValueError, match="cannot match on 'colour'"):
        await assert_enqueued(fake_boss, "email", colour="red")
