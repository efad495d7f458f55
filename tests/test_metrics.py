"""``shoal.metrics.WorkerMetrics`` in this process: batch items, ingest messages, the pool.

(A real ``shoal worker --metrics-port`` process, with its job counters and
histograms scraped over HTTP, is tests/test_observe_processes.py.)
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from shoal import PermanentError, Shoal, ShoalError, tracing
from shoal.batch.item import Item
from shoal.cli.serve import metrics_class
from shoal.ingest.message import Message
from shoal.ingest.pipeline import Pipeline
from shoal.ingest.postgres import PostgresTransport
from shoal.metrics import WorkerMetrics
from shoal.testing import Probe

from .batch_helpers import make_batches, running, settle
from .ingest_helpers import READINGS, Reading, create_schema

FAST = timedelta(milliseconds=50)


@pytest.fixture
def metrics(boss: Shoal) -> WorkerMetrics:
    metrics = WorkerMetrics()
    metrics.attach(boss)
    return metrics


def sample(metrics: WorkerMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_batch_item_outcomes_are_counted_by_kind(boss: Shoal, metrics: WorkerMetrics) -> None:
    async def handler(item: Item) -> str:
        if item.ref == "bad":
            raise PermanentError("not a PDF")
        return "ok"

    batches = make_batches(boss, handler)
    done = await batches.create("test.kind", ["a", "b", "bad"])
    stopped = await batches.create("test.kind", ["c", "d"])
    await batches.cancel(stopped.task_id)
    probe = Probe(boss)
    async with running(batches):
        await settle(batches, done.task_id)
        await settle(batches, stopped.task_id)
        await probe.wait_for("item_finished", outcome="skipped_cancelled", count=2)
    outcomes = {
        outcome: sample(metrics, "shoal_batch_item_runs_total", kind="test.kind", outcome=outcome)
        for outcome in ("completed", "error", "skipped_cancelled", "phantom")
    }
    assert outcomes == {"completed": 2, "error": 1, "skipped_cancelled": 2, "phantom": 0}
    # The item jobs are jobs of the kind's queue, timed like any other.
    assert sample(metrics, "shoal_job_run_seconds_count", queue="batch.test.kind") == 5
    # And counted by their item's outcome: an alert on failed jobs sees the item in error.
    jobs = {
        outcome: sample(metrics, "shoal_jobs_total", queue="batch.test.kind", outcome=outcome)
        for outcome in ("completed", "failed", "skipped")
    }
    assert jobs == {"completed": 2, "failed": 1, "skipped": 2}


async def test_metrics_served_over_http_have_no_created_series(
    boss: Shoal, metrics: WorkerMetrics
) -> None:
    await boss.send("plain", {})
    probe = Probe(boss)
    worker = boss.work("plain", lambda job: None)
    await probe.wait_for("job_finished", outcome="completed")
    await worker.stop()
    port = metrics.serve("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        await writer.drain()
        text = (await reader.read()).decode()
        writer.close()
    finally:
        metrics.close()
    assert 'shoal_jobs_total{outcome="completed",queue="plain"} 1.0' in text
    assert "shoal_job_run_seconds_count" in text
    assert "_created" not in text


@pytest.fixture
async def pipeline(boss: Shoal) -> AsyncIterator[Pipeline]:
    await create_schema(boss.db)
    p = Pipeline(boss, PostgresTransport(boss))
    await p.start()
    yield p
    await p.close()


async def test_ingest_applies_duplicates_redeliveries_and_dead_letters_per_topic(
    pipeline: Pipeline, boss: Shoal, metrics: WorkerMetrics
) -> None:
    async def apply(message: Message[Reading]) -> None:
        if message.body.card_id == 2:
            raise TimeoutError("gateway")  # retryable: redelivered, then dead past the cap
        if message.body.card_id == 3:
            raise LookupError("no such card")  # a business error

    probe = Probe(boss)
    consumer = pipeline.consumer(
        READINGS, apply, concurrency=2, retry_limit=1, ladder=[timedelta(0)], poll=FAST
    )
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop, grace=timedelta(seconds=5)))
    try:
        await pipeline.publish(READINGS, Reading(card_id=1, amount=1), id="m-1")
        await probe.wait_for("message_applied", queue=READINGS.name, message_id="m-1")
        await pipeline.publish(READINGS, Reading(card_id=1, amount=1), id="m-1")  # a replay
        await pipeline.publish(READINGS, Reading(card_id=2, amount=1), id="m-2")
        await pipeline.publish(READINGS, Reading(card_id=3, amount=1), id="m-3")
        await probe.wait_for("message_duplicate", queue=READINGS.name, message_id="m-1")
        await probe.wait_for("message_failed", message_id="m-2", settled="dead")
        await probe.wait_for("message_failed", message_id="m-3", settled="business")
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    counted = {
        outcome: sample(
            metrics, "shoal_ingest_messages_total", topic=READINGS.name, outcome=outcome
        )
        for outcome in ("applied", "duplicate", "redelivered", "business_error", "dead_lettered")
    }
    assert counted == {
        "applied": 1,
        "duplicate": 1,
        "redelivered": 1,
        "business_error": 1,
        "dead_lettered": 1,
    }


async def test_pool_requests_and_waits_are_read_from_the_pool_at_scrape_time(
    boss: Shoal, metrics: WorkerMetrics
) -> None:
    before = sample(metrics, "shoal_pool_connection_requests_total")
    await boss.stats()
    assert sample(metrics, "shoal_pool_connection_requests_total") >= before + 1
    assert sample(metrics, "shoal_pool_connections", state="open") >= 1
    assert sample(metrics, "shoal_pool_connection_wait_seconds_total") >= 0


def test_a_missing_prometheus_client_is_one_line_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "shoal.metrics")
    with pytest.raises(ShoalError, match=r"pip install 'shoal\[metrics\]'$"):
        metrics_class()


def test_instrument_without_opentelemetry_is_one_line_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # as if not installed
    with pytest.raises(ShoalError, match=r"pip install 'shoal\[otel\]'$"):
        tracing.instrument()
    assert tracing.tracer() is None
