"""Workflows seen from outside: step counters of the worker process, the runs gauge of
``/metrics``, and a trace span per attempt of a step (issue 39, item 5)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import timedelta

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client.parser import text_string_to_metric_families

from shoal import Shoal, tracing
from shoal.api import create_api
from shoal.metrics import WorkerMetrics
from shoal.testing import Probe
from shoal.workflow import RunStatus, Workflows

from . import wfopsapp
from .conftest import wait_for


@pytest.fixture(autouse=True)
def fresh_app_state() -> None:
    wfopsapp.broken["reserve"] = True
    wfopsapp.gateway_failures["left"] = 0


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


@pytest.fixture
async def workflows(boss: Shoal) -> AsyncIterator[Workflows]:
    """The app's workflows, their workers started now (after tracing, when a test turns it on)."""
    api = wfopsapp.app.workflows(boss)
    for name in api.specs:
        api.work(name)
    yield api
    await boss.stop_workers(timedelta(seconds=5))


async def settled(workflows: Workflows, run_id: str, *statuses: RunStatus) -> RunStatus:
    want = set(statuses) or {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED}

    async def done() -> bool:
        return (await workflows.get(run_id)).status in want

    await wait_for(done)
    return (await workflows.get(run_id)).status


async def test_the_worker_counts_step_attempts_by_workflow_and_outcome(
    boss: Shoal, workflows: Workflows
) -> None:
    metrics = WorkerMetrics()
    metrics.attach(boss)

    def steps(workflow: str, outcome: str) -> float:
        labels = {"workflow": workflow, "outcome": outcome}
        return metrics.registry.get_sample_value("shoal_workflow_steps_total", labels) or 0.0

    wfopsapp.gateway_failures["left"] = 1
    await workflows.start("ops.flaky", 4, id="flaky-1")
    assert await settled(workflows, "flaky-1") is RunStatus.COMPLETED
    assert steps("ops.flaky", "retried") == 1
    assert steps("ops.flaky", "completed") == 1

    await workflows.start("ops.order", {"sku": "M"}, id="order-m")
    assert await settled(workflows, "order-m") is RunStatus.FAILED
    assert steps("ops.order", "completed") == 1  # check stock
    assert steps("ops.order", "failed") == 1  # reserve
    # A replay returns checkpoints without running them: nothing more is counted.
    wfopsapp.broken["reserve"] = False
    assert await workflows.retry("order-m")
    assert await settled(workflows, "order-m") is RunStatus.COMPLETED
    assert steps("ops.order", "completed") == 2
    assert steps("ops.order", "failed") == 1


async def test_metrics_gauge_counts_open_and_failed_runs_by_workflow_and_status(
    boss: Shoal, workflows: Workflows
) -> None:
    for n in range(2):
        await workflows.start("ops.nap", id=f"nap-{n}")
        await settled(workflows, f"nap-{n}", RunStatus.SLEEPING)
    await workflows.start("ops.order", {"sku": "Q"}, id="order-q")
    await settled(workflows, "order-q")
    await workflows.start("ops.flaky", 1, id="flaky-done")
    await settled(workflows, "flaky-done")
    api = create_api(boss, wfopsapp.app.batches(boss), token=None, workflows=workflows)
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        text = (await client.get("/metrics")).text
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "shoal_workflow_runs"]
    assert family.type == "gauge"
    values = {(s.labels["workflow"], s.labels["status"]): s.value for s in family.samples}
    assert values[("ops.nap", "sleeping")] == 2
    assert values[("ops.order", "failed")] == 1
    assert values[("ops.approval", "waiting")] == 0  # every declared workflow, zeros included
    assert not any(status in ("completed", "cancelled") for _, status in values)


async def test_each_step_attempt_is_a_span_under_the_job_that_ran_it(
    spans: InMemorySpanExporter, workflows: Workflows
) -> None:
    wfopsapp.gateway_failures["left"] = 1
    await workflows.start("ops.flaky", 5, id="traced")
    assert await settled(workflows, "traced") is RunStatus.COMPLETED
    finished = spans.get_finished_spans()
    steps = [s for s in finished if s.name == "step ops.flaky gateway"]
    assert [dict(s.attributes or {}) for s in steps] == [
        {
            "shoal.workflow": "ops.flaky",
            "shoal.workflow.run_id": "traced",
            "shoal.workflow.step.seq": 1,
            "shoal.workflow.step.name": "gateway",
            "shoal.workflow.step.attempt": attempt,
            "shoal.workflow.step.outcome": outcome,
        }
        for attempt, outcome in [(1, "retried"), (2, "completed")]
    ]
    assert steps[0].status.status_code is StatusCode.ERROR
    assert steps[0].events[0].name == "exception"
    assert "gateway reset" in str(steps[0].status.description)
    assert steps[1].status.status_code is StatusCode.UNSET
    assert all(s.kind is SpanKind.INTERNAL for s in steps)
    jobs = [s for s in finished if s.name == "process workflow.ops.flaky"]
    assert len(jobs) == 1
    assert all(s.parent is not None for s in steps)
    assert {s.parent.span_id for s in steps if s.parent} == {jobs[0].context.span_id}


async def test_a_runs_first_job_is_a_child_of_the_span_that_started_it(
    spans: InMemorySpanExporter, workflows: Workflows
) -> None:
    tracer = tracing.tracer()
    assert tracer is not None
    with tracer.start_as_current_span("POST /orders") as request:
        await workflows.start("ops.flaky", 1, id="from-a-request")
        (many,) = await workflows.start_many("ops.flaky", [2], ids=["from-a-batch"])
    assert many.created
    for run_id in ("from-a-request", "from-a-batch"):
        assert await settled(workflows, run_id) is RunStatus.COMPLETED
    jobs = [s for s in spans.get_finished_spans() if s.name == "process workflow.ops.flaky"]
    assert len(jobs) == 2
    assert all(s.parent is not None for s in jobs)
    assert {s.parent.span_id for s in jobs if s.parent} == {request.get_span_context().span_id}
    assert {s.context.trace_id for s in jobs} == {request.get_span_context().trace_id}


async def test_a_failed_step_span_says_failed_and_without_tracing_there_is_none(
    spans: InMemorySpanExporter, boss: Shoal
) -> None:
    api = wfopsapp.app.workflows(boss)
    api.work("ops.order")
    try:
        await api.start("ops.order", {"sku": "F"}, id="fails")
        assert await settled(api, "fails") is RunStatus.FAILED
    finally:
        await boss.stop_workers(timedelta(seconds=5))
    (reserve,) = [s for s in spans.get_finished_spans() if s.name == "step ops.order reserve"]
    assert (reserve.attributes or {})["shoal.workflow.step.outcome"] == "failed"
    assert reserve.status.status_code is StatusCode.ERROR
    tracing.uninstrument()
    spans.clear()
    api.work("ops.order")
    try:
        await api.start("ops.order", {"sku": "G"}, id="untraced")
        await settled(api, "untraced")
    finally:
        await boss.stop_workers(timedelta(seconds=5))
    assert spans.get_finished_spans() == ()


async def test_a_probe_awaits_the_end_of_a_steps_attempt(boss: Shoal, workflows: Workflows) -> None:
    probe = Probe(boss)
    await workflows.start("ops.flaky", 3, id="probed")
    (event,) = await probe.wait_for("step_finished", queue="workflow.ops.flaky", run_id="probed")
    fields = {k: event[k] for k in ("workflow", "seq", "step", "attempt", "outcome")}
    assert fields == {
        "workflow": "ops.flaky",
        "seq": 1,
        "step": "gateway",
        "attempt": 1,
        "outcome": "completed",
    }
