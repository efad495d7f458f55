"""``/metrics``: Prometheus text exposition, written directly from shoal's own counts.

Nothing is kept in this process: every scrape asks the database, so any number
of API processes report the same cluster-wide numbers and a restart loses
nothing. Series:

=============================================  =======  ===================================
name                                           type     labels
=============================================  =======  ===================================
``shoal_batch_items``                          gauge    ``kind``, ``state`` (unfinished tasks)
``shoal_batch_phantom_skips_total``            counter  (item jobs the phantom guard skipped)
``shoal_batch_superseded_skips_total``         counter  (buffered items taken from their worker)
``shoal_batch_cancelled_skips_total``          counter  (item jobs skipped: their task was stopped)
``shoal_batch_zombies_reaped_total``           counter  (running items reaped by heartbeat)
``shoal_batch_completion_detection_seconds``   summary  ``kind``, ``quantile``
``shoal_queue_jobs``                           gauge    ``queue``, ``state``
``shoal_queue_oldest_waiting_seconds``         gauge    ``queue``
``shoal_ingest_topic_depth``                   gauge    ``topic``, ``part`` (ready, in_flight,
                                                        delayed, total)
``shoal_ingest_topic_wait_seconds``            gauge    ``topic`` (now - published_at)
``shoal_ingest_topic_oldest_seconds``          gauge    ``topic``
``shoal_ingest_topic_paused``                  gauge    ``topic`` (1 while producers hold off)
``shoal_queue_limit_running``                  gauge    ``queue`` (active jobs of a limited queue)
``shoal_queue_limit_held_jobs``                gauge    ``queue``, ``reason`` (concurrency, rate,
                                                        paused: waiting jobs of partitions held
                                                        back, and why)
``shoal_queue_limit_held_partitions``          gauge    ``queue``, ``reason``
``shoal_workflow_runs``                        gauge    ``workflow``, ``status`` (pending,
                                                        running, sleeping, waiting, failed)
=============================================  =======  ===================================

Workflow runs are counted while unfinished, and while failed (until retried):
completed and cancelled runs only grow, so a scrape leaves them out (the
worker's ``shoal_workflow_steps_total`` counts steps as they end). At most
:data:`WORKFLOW_RUNS_COUNTED` runs are read per scrape.

The ingest series are the backlog monitor's last reading of each topic.

Completion detection is the time from a task's last item finishing to the
aggregator closing the task. Its quantiles cover the most recent
:data:`LATENCY_WINDOW` closed tasks; it carries no ``_sum``/``_count``, which
over a sliding window would not be the monotonic counters Prometheus assumes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from shoal.batch.aggregator import ZOMBIES_REAPED
from shoal.batch.item_runner import CANCELLED_SKIPS, PHANTOM_SKIPS, SUPERSEDED_SKIPS
from shoal.batch.service import Batches
from shoal.batch.states import ItemStatus
from shoal.db.usage import quantile
from shoal.ingest.store import IngestStore
from shoal.queue.client import Shoal
from shoal.queue.limits import LimitState
from shoal.queue.states import JobState
from shoal.workflow.service import Workflows
from shoal.workflow.states import RunStatus

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Enough closed tasks for a stable p99, few enough that a scrape stays one cheap query.
LATENCY_WINDOW = 1000
QUANTILES = (0.5, 0.9, 0.99, 1.0)
# Partitions of limited queues read per scrape (busiest first); the limit
# series sum over them.
LIMIT_PARTITIONS = 10_000
# Open and failed workflow runs read per scrape: past it the gauge stops growing.
WORKFLOW_RUNS_COUNTED = 100_000
COUNTED_RUN_STATUSES = (
    RunStatus.PENDING,
    RunStatus.RUNNING,
    RunStatus.SLEEPING,
    RunStatus.WAITING,
    RunStatus.FAILED,
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class Exposition:
    """Builds one scrape's text: each family's HELP and TYPE, then its samples."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(
        self,
        name: str,
        kind: str,
        help_text: str,
        samples: Iterable[tuple[str, Mapping[str, str], float]],
    ) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for suffix, labels, value in samples:
            self.lines.append(f"{name}{suffix}{_labels(labels)} {_number(value)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


async def render(boss: Shoal, batches: Batches, workflows: Workflows | None = None) -> str:
    """One scrape: a few queries, no state kept between scrapes."""
    store = batches.store
    items = await store.items_by_status()
    counters = await store.counters()
    latencies = await store.completion_latencies(limit=LATENCY_WINDOW)
    queue_rows = await boss.stats()
    topics = await IngestStore(boss.db).topic_states()
    limits = await boss.limits(limit=LIMIT_PARTITIONS)
    out = Exposition()

    counts: dict[tuple[str, str], int] = {}
    for kind in batches.kinds:
        for status in ItemStatus:
            counts[(kind, status.value)] = 0
    for kind, status, n in items:
        counts[(kind, status.value)] = counts.get((kind, status.value), 0) + n
    out.family(
        "shoal_batch_items",
        "gauge",
        "Items of unfinished (processing) tasks, by batch kind and item state.",
        (("", {"kind": k, "state": s}, n) for (k, s), n in sorted(counts.items())),
    )
    out.family(
        "shoal_batch_phantom_skips_total",
        "counter",
        "Item jobs that found their item already running or finished and did nothing "
        "(phantom-retry guard).",
        [("", {}, counters.get(PHANTOM_SKIPS, 0))],
    )
    out.family(
        "shoal_batch_cancelled_skips_total",
        "counter",
        "Item jobs that found their item cancelled (its task was stopped) and did nothing.",
        [("", {}, counters.get(CANCELLED_SKIPS, 0))],
    )
    out.family(
        "shoal_batch_superseded_skips_total",
        "counter",
        "Claimed items a worker did not run because they were taken from it (reaped "
        "or cancelled) while they waited in its buffer.",
        [("", {}, counters.get(SUPERSEDED_SKIPS, 0))],
    )
    out.family(
        "shoal_batch_zombies_reaped_total",
        "counter",
        "Running items the aggregator reaped after their heartbeat went stale.",
        [("", {}, counters.get(ZOMBIES_REAPED, 0))],
    )
    by_kind: dict[str, list[float]] = {}
    for kind, seconds in latencies:
        by_kind.setdefault(kind, []).append(max(0.0, seconds))
    samples: list[tuple[str, Mapping[str, str], float]] = []
    for kind in sorted(by_kind):
        values = sorted(by_kind[kind])
        samples.extend(
            ("", {"kind": kind, "quantile": f"{q:g}"}, quantile(values, q)) for q in QUANTILES
        )
    out.family(
        "shoal_batch_completion_detection_seconds",
        "summary",
        f"Seconds from a task's last item finishing to the task being closed, "
        f"over the {LATENCY_WINDOW} most recently closed tasks.",
        samples,
    )

    jobs: dict[tuple[str, str], int] = {}
    oldest: dict[str, float] = {}
    for row in queue_rows:
        for state in JobState:
            jobs.setdefault((row.queue, state.value), 0)
        jobs[(row.queue, row.state.value)] += row.count
        if row.oldest_waiting is not None:
            age = row.oldest_waiting.total_seconds()
            oldest[row.queue] = max(oldest.get(row.queue, 0.0), age)
    out.family(
        "shoal_queue_jobs",
        "gauge",
        "Jobs per queue and state (the queue depth is the created and retry states).",
        (("", {"queue": q, "state": s}, n) for (q, s), n in sorted(jobs.items())),
    )
    out.family(
        "shoal_queue_oldest_waiting_seconds",
        "gauge",
        "Age of the oldest job waiting to run, per queue.",
        (("", {"queue": q}, age) for q, age in sorted(oldest.items())),
    )
    out.family(
        "shoal_ingest_topic_depth",
        "gauge",
        "Unacknowledged messages per ingest topic, by part (the backlog monitor's last reading).",
        (
            ("", {"topic": t.topic, "part": part}, n)
            for t in topics
            for part, n in (
                ("ready", t.ready),
                ("in_flight", t.in_flight),
                ("delayed", t.delayed),
                ("total", t.depth),
            )
        ),
    )
    out.family(
        "shoal_ingest_topic_wait_seconds",
        "gauge",
        "Now minus published_at of recently applied messages, per topic.",
        (("", {"topic": t.topic}, t.wait_s) for t in topics if t.wait_s is not None),
    )
    out.family(
        "shoal_ingest_topic_oldest_seconds",
        "gauge",
        "Age of the oldest unacknowledged message, per topic.",
        (("", {"topic": t.topic}, t.oldest_age_s) for t in topics if t.oldest_age_s is not None),
    )
    out.family(
        "shoal_ingest_topic_paused",
        "gauge",
        "1 while the topic's pause flag tells producers to take no new work.",
        (("", {"topic": t.topic}, 1.0 if t.paused else 0.0) for t in topics),
    )
    limit_families(out, limits)
    if workflows is not None:
        await workflow_families(out, workflows)
    return out.text()


async def workflow_families(out: Exposition, workflows: Workflows) -> None:
    runs: dict[tuple[str, str], int] = {}
    for name in workflows.specs:
        for status in COUNTED_RUN_STATUSES:
            runs[(name, status.value)] = 0
    for name, status, n in await workflows.store.count_open_runs(cap=WORKFLOW_RUNS_COUNTED):
        runs[(name, status.value)] = runs.get((name, status.value), 0) + n
    out.family(
        "shoal_workflow_runs",
        "gauge",
        "Workflow runs not finished (pending, running, sleeping, waiting) and failed ones, "
        "by workflow and status.",
        (("", {"workflow": w, "status": s}, n) for (w, s), n in sorted(runs.items())),
    )


HELD_REASONS = ("concurrency", "rate", "paused")


def held_reason(state: LimitState) -> str | None:
    """Why a partition's waiting jobs cannot start now, if they cannot."""
    if state.paused_until is not None:
        return "paused"
    if state.global_concurrency is not None and state.running >= state.global_concurrency:
        return "concurrency"
    if state.tokens is not None and state.tokens < 1:
        return "rate"
    return None


def limit_families(out: Exposition, limits: Sequence[LimitState]) -> None:
    running: dict[str, int] = {}
    held_jobs: dict[tuple[str, str], int] = {}
    held_parts: dict[tuple[str, str], int] = {}
    for state in limits:
        running[state.queue] = running.get(state.queue, 0) + state.running
        for each in HELD_REASONS:
            held_jobs.setdefault((state.queue, each), 0)
            held_parts.setdefault((state.queue, each), 0)
        reason = held_reason(state)
        if reason is not None and state.waiting:
            held_jobs[(state.queue, reason)] += state.waiting
            held_parts[(state.queue, reason)] += 1
    out.family(
        "shoal_queue_limit_running",
        "gauge",
        "Active jobs of each queue with limits (each partition counts against its limit).",
        (("", {"queue": q}, n) for q, n in sorted(running.items())),
    )
    out.family(
        "shoal_queue_limit_held_jobs",
        "gauge",
        "Waiting jobs of partitions their limits hold back now: at their concurrency, "
        "out of rate tokens, or paused by a handler's RetryAfter.",
        (("", {"queue": q, "reason": r}, n) for (q, r), n in sorted(held_jobs.items())),
    )
    out.family(
        "shoal_queue_limit_held_partitions",
        "gauge",
        "Partitions with waiting jobs that their limits hold back now, by reason.",
        (("", {"queue": q, "reason": r}, n) for (q, r), n in sorted(held_parts.items())),
    )


def metrics_router(boss: Shoal, batches: Batches, workflows: Workflows | None = None) -> APIRouter:
    router = APIRouter(tags=["metrics"])

    @router.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses={200: {"content": {CONTENT_TYPE: {}}, "description": "Prometheus text format"}},
    )
    async def metrics() -> PlainTextResponse:
        """Prometheus metrics for this shoal schema (items, guards, latency, queues,
        workflow runs)."""
        return PlainTextResponse(await render(boss, batches, workflows), media_type=CONTENT_TYPE)

    return router


__all__ = ["CONTENT_TYPE", "LATENCY_WINDOW", "metrics_router", "quantile", "render"]
