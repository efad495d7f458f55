"""Prometheus metrics of one worker process, counted from the events it reports.

``shoal worker --metrics-port N`` registers a :class:`WorkerMetrics` as an
observer of the client's hooks (``boss.hooks``, see :mod:`shoal.hooks`) and
serves ``/metrics`` from a small HTTP server of the ``prometheus-client``
package, in a thread of its own. Nothing is added to the hot path beyond the
events the hooks already report: with no observer registered, a worker pays
one truth test per event.

Counters live in the process: they only grow while it runs (archiving or
deleting job rows does not lower them) and start again from zero when it
restarts, which Prometheus' ``rate()`` and ``increase()`` expect. Every label
is a queue, a batch kind, a topic or an outcome: never a job id.

The same set can be embedded in a process that runs workers some other way::

    metrics = WorkerMetrics()
    metrics.attach(boss)            # counts what boss's workers report
    metrics.serve("127.0.0.1", 9300)

Series (the names Prometheus shows; counters end in ``_total``):

========================================================  =========  =======================
name                                                      type       labels
========================================================  =========  =======================
``shoal_jobs_total``                                      counter    ``queue``, ``outcome``
``shoal_job_run_seconds``                                 histogram  ``queue``
``shoal_job_wait_seconds``                                histogram  ``queue``
``shoal_batch_item_runs_total``                           counter    ``kind``, ``outcome``
``shoal_ingest_messages_total``                           counter    ``topic``, ``outcome``
``shoal_workflow_steps_total``                            counter    ``workflow``, ``outcome``
``shoal_pool_connection_requests_total``                  counter
``shoal_pool_connection_requests_queued_total``           counter
``shoal_pool_connection_wait_seconds_total``              counter
``shoal_pool_connection_errors_total``                    counter
``shoal_pool_connections``                                gauge      ``state``
``shoal_pool_requests_waiting``                           gauge
========================================================  =========  =======================
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from shoal.hooks import Event, Hooks

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from shoal.queue.client import Shoal

# Seconds: from a no-op job to the default expire_in (15 min) and past it.
RUN_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)
WAIT_BUCKETS = RUN_BUCKETS

# A batch item's job reports its item's outcome: an item in error is a failed
# job, and a delivery that ran nothing (phantom, cancelled, superseded) is
# ``skipped`` (shoal.batch.recorder.job_outcome).
JOB_OUTCOMES = (
    "completed",
    "failed",
    "retried",
    "snoozed",
    "released",
    "cancelled",
    "lost",
    "skipped",
)
ITEM_OUTCOMES = (
    "completed",
    "error",
    "retried",
    "released",
    "phantom",
    "skipped_cancelled",
    "superseded",
    "lost",
)
# message_failed's ``settled`` and what it counts as.
_SETTLED = {"retry": "redelivered", "business": "business_error", "dead": "dead_lettered"}
MESSAGE_OUTCOMES = ("applied", "duplicate", "redelivered", "business_error", "dead_lettered")
# An attempt of a workflow's step: done, to be tried again, or failed for good.
STEP_OUTCOMES = ("completed", "retried", "failed")


class _Pool(Protocol):
    def get_stats(self) -> dict[str, int]: ...


class WorkerMetrics:
    """The metrics of one process, fed by hook events (see :meth:`observe`)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.jobs = Counter(
            "shoal_jobs",
            "Job runs whose outcome a worker of this process recorded, by queue and outcome.",
            ["queue", "outcome"],
            registry=r,
        )
        self.run_seconds = Histogram(
            "shoal_job_run_seconds",
            "Seconds a handler ran, per queue (every attempt).",
            ["queue"],
            buckets=RUN_BUCKETS,
            registry=r,
        )
        self.wait_seconds = Histogram(
            "shoal_job_wait_seconds",
            "Seconds from a job's enqueue to the start of a run of its first attempt, per queue.",
            ["queue"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.items = Counter(
            "shoal_batch_item_runs",
            "Batch item deliveries handled by this process, by kind and outcome.",
            ["kind", "outcome"],
            registry=r,
        )
        self.messages = Counter(
            "shoal_ingest_messages",
            "Ingest deliveries settled by this process's consumers, by topic and outcome.",
            ["topic", "outcome"],
            registry=r,
        )
        self.steps = Counter(
            "shoal_workflow_steps",
            "Attempts of workflow steps run by this process, by workflow and outcome "
            "(completed, retried, failed).",
            ["workflow", "outcome"],
            registry=r,
        )
        self._pools: list[_Pool] = []
        self._pool_lock = threading.Lock()
        r.register(_PoolCollector(self))
        # What /metrics serves: the registry without prometheus-client's
        # ``*_created`` series (a timestamp per labelled counter, which
        # dashboards and alerts never read).
        self.exposed = CollectorRegistry(auto_describe=False)
        self.exposed.register(_WithoutCreated(self.registry))
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    # -- feeding ---------------------------------------------------------------

    def attach(self, boss: Shoal | Hooks) -> None:
        """Count what ``boss``'s workers and consumers report; report its pool's waits too."""
        hooks = boss if isinstance(boss, Hooks) else boss.hooks
        hooks.add(self.observe)
        if not isinstance(boss, Hooks):
            self.watch_pool(boss.db.pool)

    def watch_pool(self, pool: _Pool) -> None:
        """Expose ``pool.get_stats()`` (a psycopg_pool pool) at each scrape."""
        with self._pool_lock:
            self._pools.append(pool)

    def observe(self, event: Event) -> None:
        """The hook observer: one event in, a counter or histogram moved."""
        name = event.name
        if name == "job_finished":
            self.jobs.labels(event.queue or "", event["outcome"]).inc()
        elif name == "job_ran":
            queue = event.queue or ""
            self.run_seconds.labels(queue).observe(max(0.0, event["run_s"]))
            if event["attempt"] == 1:
                wait = (event["started_at"] - event["created_at"]).total_seconds()
                self.wait_seconds.labels(queue).observe(max(0.0, wait))
        elif name == "item_finished":
            self.items.labels(event["kind"], event["outcome"]).inc()
        elif name == "message_applied":
            self.messages.labels(event.queue or "", "applied").inc()
        elif name == "message_duplicate":
            self.messages.labels(event.queue or "", "duplicate").inc()
        elif name == "message_failed":
            settled = event["settled"]
            self.messages.labels(event.queue or "", _SETTLED.get(settled, settled)).inc()
        elif name == "step_finished":
            self.steps.labels(event["workflow"], event["outcome"]).inc()

    # -- serving ---------------------------------------------------------------

    def serve(self, host: str, port: int) -> int:
        """Serve ``/metrics`` on ``host:port`` in a daemon thread; returns the bound port."""
        server, thread = start_http_server(port, addr=host, registry=self.exposed)
        self._server, self._thread = server, thread
        return int(server.server_port)

    def close(self) -> None:
        """Stop serving (a no-op when not serving)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def pool_stats(self) -> dict[str, int]:
        """The watched pools' statistics, added up."""
        with self._pool_lock:
            pools = list(self._pools)
        total: dict[str, int] = {}
        for pool in pools:
            for key, value in pool.get_stats().items():
                total[key] = total.get(key, 0) + value
        return total


class _WithoutCreated(Collector):
    """Another registry's metrics, less the ``*_created`` samples of its counters and histograms."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Any]:
        for family in self.registry.collect():
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family


class _PoolCollector(Collector):
    """Reads the pools' own counters at scrape time: nothing is counted per checkout here."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        stats = self.metrics.pool_stats()
        counters = (
            ("requests", "requests_num", 1, "Connections asked of the pool."),
            (
                "requests_queued",
                "requests_queued",
                1,
                "Connection requests that had to wait for a free connection.",
            ),
            (
                "wait_seconds",
                "requests_wait_ms",
                1000,
                "Seconds spent waiting for a connection, all requests together.",
            ),
            (
                "errors",
                "requests_errors",
                1,
                "Connection requests that failed (no connection in time).",
            ),
        )
        for suffix, key, divisor, help_text in counters:
            family = CounterMetricFamily(f"shoal_pool_connection_{suffix}", help_text)
            family.add_metric([], stats.get(key, 0) / divisor)
            yield family
        connections = GaugeMetricFamily(
            "shoal_pool_connections",
            "Connections of the pool: open (size) and idle (available).",
            labels=["state"],
        )
        connections.add_metric(["open"], stats.get("pool_size", 0))
        connections.add_metric(["idle"], stats.get("pool_available", 0))
        yield connections
        waiting = GaugeMetricFamily(
            "shoal_pool_requests_waiting", "Connection requests waiting right now."
        )
        waiting.add_metric([], stats.get("requests_waiting", 0))
        yield waiting


__all__ = [
    "ITEM_OUTCOMES",
    "JOB_OUTCOMES",
    "MESSAGE_OUTCOMES",
    "STEP_OUTCOMES",
    "WorkerMetrics",
]
