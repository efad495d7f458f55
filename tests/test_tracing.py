"""OpenTelemetry tracing: a job's run span is a child of the span that sent it.

Spans go to the SDK's in-memory exporter through a provider handed to
``shoal.tracing.instrument``; the global provider is never set, so no other
test runs traced.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from shoal import Job, Shoal, tracing
from shoal.ingest.message import Message
from shoal.testing import Probe, drain

from .test_processes import REPO, rows

NOW = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.instrument(provider)
    try:
        yield exporter
    finally:
        tracing.uninstrument()
        provider.shutdown()


def attempt(span: ReadableSpan) -> int:
    return int((span.attributes or {})["shoal.job.attempt"])  # type: ignore[arg-type]


def runs(exporter: InMemorySpanExporter, queue: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == f"process {queue}"]


async def test_run_span_is_a_child_of_the_sending_span_with_job_attributes(
    boss: Shoal, spans: InMemorySpanExporter
) -> None:
    seen: list[object] = []

    async def handler(job: Job) -> None:
        seen.append(job.data)

    probe = Probe(boss)
    sender = tracing.tracer()
    assert sender is not None
    with sender.start_as_current_span("checkout") as parent:
        job_id = await boss.send("traced", {"order": 7})
    boss.work("traced", handler)
    await probe.job_finished("traced", outcome="completed")

    (run,) = runs(spans, "traced")
    context = parent.get_span_context()
    assert run.parent is not None
    assert (run.parent.trace_id, run.parent.span_id) == (context.trace_id, context.span_id)
    assert run.context is not None and run.context.trace_id == context.trace_id
    assert run.kind is SpanKind.CONSUMER
    assert dict(run.attributes or {}) == {
        "messaging.system": "shoal",
        "messaging.destination.name": "traced",
        "shoal.queue": "traced",
        "shoal.job.id": job_id,
        "shoal.job.attempt": 1,
        "shoal.job.outcome": "completed",
    }
    # The handler sees what was sent; the row keeps the context for the run.
    assert seen == [{"order": 7}]
    (stored,) = (await rows(boss, "SELECT data FROM shoal.job WHERE id = %s", (job_id,)))[0]
    assert stored["order"] == 7
    assert stored[tracing.TRACE_KEY]["traceparent"].split("-")[1] == f"{context.trace_id:032x}"


async def test_a_drained_run_is_a_span_as_a_workers_is(
    boss: Shoal, spans: InMemorySpanExporter
) -> None:
    # The worker wraps its handler call in the span, so every path that runs
    # a job through it (here shoal.testing.drain, a worker never started) is
    # traced alike.
    async def handler(job: Job) -> None:
        return None

    sender = tracing.tracer()
    assert sender is not None
    with sender.start_as_current_span("checkout") as parent:
        await boss.send("drained", {"order": 8})
    assert (await drain(boss, "drained", handler)).completed == 1

    (run,) = runs(spans, "drained")
    assert run.parent is not None
    assert run.parent.span_id == parent.get_span_context().span_id
    assert (run.attributes or {})["shoal.job.outcome"] == "completed"


async def test_each_attempt_is_a_span_under_the_sender_and_failures_are_errors(
    boss: Shoal, spans: InMemorySpanExporter
) -> None:
    async def flaky(job: Job) -> str:
        if job.attempt == 1:
            raise RuntimeError("first attempt fails")
        return "ok"

    probe = Probe(boss)
    sender = tracing.tracer()
    assert sender is not None
    with sender.start_as_current_span("enqueue many") as parent:
        (job_id,) = await boss.insert_many("flaky", [{"n": 1}], retry_limit=1)
    boss.work("flaky", flaky)
    await probe.job_finished("flaky", outcome="completed")

    first, second = sorted(
        runs(spans, "flaky"), key=lambda s: str((s.attributes or {}).get("shoal.job.attempt"))
    )
    for run in (first, second):
        assert run.parent is not None
        assert run.parent.span_id == parent.get_span_context().span_id
        assert (run.attributes or {})["shoal.job.id"] == job_id
    assert (first.attributes or {})["shoal.job.outcome"] == "retried"
    assert first.status.status_code is StatusCode.ERROR
    assert [e.name for e in first.events] == ["exception"]
    assert (second.attributes or {})["shoal.job.outcome"] == "completed"
    assert second.status.status_code is StatusCode.UNSET


async def test_a_job_sent_outside_a_span_runs_in_a_root_span_and_stores_no_context(
    boss: Shoal, spans: InMemorySpanExporter
) -> None:
    async def handler(job: Job) -> None:
        return None

    probe = Probe(boss)
    job_id = await boss.send("untraced", {"a": 1})
    sender = tracing.tracer()
    assert sender is not None
    with sender.start_as_current_span("scalar"):
        await boss.send("untraced", [1, 2])  # not an object: travels without a context
    boss.work("untraced", handler)
    await probe.job_finished("untraced", count=2)
    assert all(run.parent is None for run in runs(spans, "untraced"))
    stored = await rows(boss, "SELECT data FROM shoal.job WHERE queue = 'untraced' ORDER BY id")
    assert [data for (data,) in stored] == [{"a": 1}, [1, 2]]
    assert job_id is not None


async def test_tracing_off_leaves_payloads_and_handlers_as_they_are(boss: Shoal) -> None:
    async def handler(job: Job) -> None:
        return None

    assert tracing.tracer() is None  # no instrument(), no global provider in this process
    job_id = await boss.send("plain", {"a": 1})
    worker = boss.work("plain", handler, poll_interval=timedelta(seconds=1))
    assert worker.handler is handler  # not wrapped: nothing runs per job
    (stored,) = (await rows(boss, "SELECT data FROM shoal.job WHERE id = %s", (job_id,)))[0]
    assert stored == {"a": 1}


async def test_shoals_own_queues_run_without_spans_unless_asked(
    boss: Shoal, spans: InMemorySpanExporter
) -> None:
    async def handler(job: Job) -> None:
        return None

    internal, other = "shoal.batch.aggregate", "shoal.other"
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing.instrument(provider, internal_queues=True)
    probe = Probe(boss)
    boss.work(internal, handler, poll_interval=timedelta(seconds=1))
    await boss.send(internal, {})
    await probe.job_finished(internal, outcome="completed")
    assert len(runs(spans, internal)) == 1

    # The default, for workers started after it: no span for shoal's own
    # queues, a user's queue traced.
    tracing.instrument(provider)
    boss.work(other, handler, poll_interval=timedelta(seconds=1))
    boss.work("plain", handler, poll_interval=timedelta(seconds=1))
    await boss.send(other, {})
    await probe.job_finished(other, outcome="completed")
    await boss.send("plain", {})
    await probe.job_finished("plain", outcome="completed")
    assert runs(spans, other) == []
    assert len(runs(spans, "plain")) == 1


GLOBAL_PROVIDER_SCRIPT = """
import asyncio, os
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from shoal import Shoal
from shoal.db import Database
from shoal.ingest.message import Message
from shoal.testing import Probe, drain

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

async def main():
    boss = Shoal(await Database(os.environ["DATABASE_URL"], max_size=4).open())
    probe = Probe(boss)
    with trace.get_tracer("app").start_as_current_span("sender") as sender:
        await boss.send("auto", {"x": 1})
    async def handler(job):
        assert job.data == {"x": 1}
    boss.work("auto", handler)
    await probe.job_finished("auto", outcome="completed")
    await boss.close()
    (run,) = [s for s in exporter.get_finished_spans() if s.name == "process auto"]
    assert run.parent.span_id == sender.get_span_context().span_id
    print("linked")

asyncio.run(main())
"""


def test_a_global_tracer_provider_turns_tracing_on_without_instrument(db_url: str) -> None:
    # Its own process: a global provider can be set once per process, and
    # would turn tracing on for every later test.
    done = subprocess.run(
        [sys.executable, "-c", GLOBAL_PROVIDER_SCRIPT],
        cwd=REPO,
        env={"DATABASE_URL": db_url, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "linked"


async def test_an_ingest_apply_runs_in_a_span_of_its_topic(spans: InMemorySpanExporter) -> None:
    applied: list[str] = []

    async def apply(message: Message[Any]) -> None:
        applied.append(message.id)

    traced = tracing.traced_apply("card.ingest", apply)
    assert traced is not apply
    message: Message[Any] = Message(
        id="m-1", topic="card.ingest", body={}, published_at=NOW, attempt=2
    )
    await traced(message)
    (span,) = [s for s in spans.get_finished_spans() if s.name == "apply card.ingest"]
    assert applied == ["m-1"]
    assert span.kind is SpanKind.CONSUMER
    assert dict(span.attributes or {}) == {
        "messaging.system": "shoal",
        "messaging.destination.name": "card.ingest",
        "shoal.topic": "card.ingest",
        "shoal.message.id": "m-1",
        "shoal.message.attempt": 2,
    }


def test_an_apply_is_left_as_it_is_while_tracing_is_off() -> None:
    async def apply(message: Message[Any]) -> None:
        return None

    assert tracing.traced_apply("card.ingest", apply) is apply
