"""The poller's Prometheus metrics (``shoal-polling poll --metrics-port N``).

Counters live in the poller process: they start from zero when it starts,
which Prometheus' ``rate()`` and ``increase()`` expect. Labels are steps,
outcomes, routes, error reasons, topics and carrier accounts, never card or
observation ids. Accounts are few (a carrier integration has a handful); past
:data:`MAX_ACCOUNT_LABELS` distinct accounts the rest are counted under
``account="other"``, so a misconfigured fleet cannot grow the series without
bound.

=================================================  =========  =============================
name                                               type       labels
=================================================  =========  =============================
``shoal_polling_polls_total``                      counter    ``step``, ``outcome`` (ok,
                                                              failed, stop)
``shoal_polling_gateway_seconds``                  histogram  ``account`` (every call,
                                                              answered or not)
``shoal_polling_gateway_errors_total``             counter    ``account``, ``reason``
                                                              (rate_limited, server_error,
                                                              client_error, transport)
``shoal_polling_gateway_rate_limited_total``       counter    ``account`` (429 answers)
``shoal_polling_account_pauses_total``             counter    ``account`` (429 with
                                                              Retry-After: calls held)
``shoal_polling_accounts_paused``                  gauge      (accounts held right now)
``shoal_polling_account_waits``                    gauge      (polls waiting for a hold)
``shoal_polling_observations_total``               counter    ``route`` (applied, published,
                                                              degraded, handed_off, spooled,
                                                              failed)
``shoal_polling_sql_timeouts_total``               counter    ``kind`` (deadline, statement,
                                                              pool)
``shoal_polling_pool_wait_seconds``                histogram  (wait for a connection)
``shoal_polling_db_calls_total``                   counter
``shoal_polling_db_slow_calls_total``              counter    (over 200 ms, wait included)
``shoal_polling_paused_rounds_total``              counter    (rounds held off: a topic
                                                              paused or the spool full)
``shoal_polling_polls_in_flight``                  gauge
``shoal_polling_spool_messages``                   gauge
``shoal_polling_spool_bytes``                      gauge
``shoal_polling_spool_oldest_seconds``             gauge
``shoal_polling_dead_letters``                     gauge      ``topic`` (waiting for a
                                                              redrive, counted up to
                                                              :data:`DEAD_LETTER_CAP`)
=================================================  =========  =============================

``shoal-polling reconcile --metrics-file PATH`` writes the reconciliation's
findings in the same text format (:func:`write_reconciliation`), for a
node exporter's textfile collector.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import psycopg_pool
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
    write_to_textfile,
)

from shoal import DeadlineExceeded
from shoal.db import CallTimes

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from shoal.ingest import SpoolStats
    from shoal_polling.reconcile import Reconciliation

log = logging.getLogger("shoal_polling.metrics")

MAX_ACCOUNT_LABELS = 100
OTHER_ACCOUNT = "other"
# Waiting dead letters are counted by reading at most this many per topic.
DEAD_LETTER_CAP = 1000
# Seconds: the simulator's 20 ms median to a gateway near its 10 s client timeout.
GATEWAY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Seconds: an idle pool's microseconds to a pool past shoal's 5 s deadline.
POOL_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
QUERY_CANCELED = "57014"  # statement_timeout


def sql_timeout_kind(exc: BaseException | None) -> str | None:
    """``deadline``, ``statement`` or ``pool`` when ``exc`` is a database timeout, else None.

    ``deadline``: shoal abandoned the call past its own deadline;
    ``statement``: the server cancelled it (``statement_timeout``);
    ``pool``: no connection was free in time.
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DeadlineExceeded):
            return "deadline"
        if isinstance(exc, psycopg_pool.PoolTimeout):
            return "pool"
        if isinstance(exc, psycopg.Error) and exc.sqlstate == QUERY_CANCELED:
            return "statement"
        exc = exc.__cause__ or exc.__context__
    return None


def gateway_error_reason(status: int | None) -> str:
    if status is None:
        return "transport"
    if status == 429:
        return "rate_limited"
    return "server_error" if status >= 500 else "client_error"


class PollerMetrics:
    """The poller's series, in a registry of their own (one per poller)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.polls = Counter(
            "shoal_polling_polls",
            "Poll steps finished, by step and outcome (ok, failed, stop: polling the card ended).",
            ["step", "outcome"],
            registry=r,
        )
        self.gateway_seconds = Histogram(
            "shoal_polling_gateway_seconds",
            "Gateway calls, by carrier account: seconds from the request to its answer or error.",
            ["account"],
            buckets=GATEWAY_BUCKETS,
            registry=r,
        )
        self.gateway_errors = Counter(
            "shoal_polling_gateway_errors",
            "Gateway calls that brought no observation, by account and reason.",
            ["account", "reason"],
            registry=r,
        )
        self.rate_limited = Counter(
            "shoal_polling_gateway_rate_limited",
            "429 answers of the gateway, by account.",
            ["account"],
            registry=r,
        )
        self.account_pauses = Counter(
            "shoal_polling_account_pauses",
            "Times an account's calls were held for the gateway's Retry-After.",
            ["account"],
            registry=r,
        )
        self.accounts_paused = Gauge(
            "shoal_polling_accounts_paused",
            "Accounts whose gateway calls are held for a Retry-After right now.",
            registry=r,
        )
        self.account_waits = Gauge(
            "shoal_polling_account_waits",
            "Polls waiting for their account's Retry-After to pass.",
            registry=r,
        )
        self.observations = Counter(
            "shoal_polling_observations",
            "Observations the gateway answered, by what the poller's submit did with them.",
            ["route"],
            registry=r,
        )
        self.sql_timeouts = Counter(
            "shoal_polling_sql_timeouts",
            "Database calls of the poller that timed out: deadline (shoal's), statement "
            "(the server's statement_timeout), pool (no connection free in time).",
            ["kind"],
            registry=r,
        )
        self.pool_wait = Histogram(
            "shoal_polling_pool_wait_seconds",
            "Seconds a database call of the poller waited for a pooled connection.",
            buckets=POOL_BUCKETS,
            registry=r,
        )
        self.db_calls = Counter(
            "shoal_polling_db_calls", "Database calls of the poller process.", registry=r
        )
        self.db_slow_calls = Counter(
            "shoal_polling_db_slow_calls",
            "Database calls over 200 ms from asking for a connection to giving it back.",
            registry=r,
        )
        self.paused_rounds = Counter(
            "shoal_polling_paused_rounds",
            "Rounds that claimed nothing because a topic was paused or the spool was full.",
            registry=r,
        )
        self.in_flight = Gauge(
            "shoal_polling_polls_in_flight", "Polls started and not finished.", registry=r
        )
        self.spool_messages = Gauge(
            "shoal_polling_spool_messages",
            "Observations waiting in the poller's spool on disk.",
            registry=r,
        )
        self.spool_bytes = Gauge(
            "shoal_polling_spool_bytes", "Bytes of the spool's waiting messages.", registry=r
        )
        self.spool_oldest = Gauge(
            "shoal_polling_spool_oldest_seconds",
            "Age of the oldest spooled observation (0 when the spool is empty).",
            registry=r,
        )
        self.dead_letters = Gauge(
            "shoal_polling_dead_letters",
            f"Dead letters of the polling topics waiting for a redrive "
            f"(counted up to {DEAD_LETTER_CAP}).",
            ["topic"],
            registry=r,
        )
        self._accounts: set[str] = set()
        self._lock = threading.Lock()

    def account(self, account_id: str) -> str:
        """The label for ``account_id``: itself, or ``other`` past the first 100 seen."""
        if account_id in self._accounts:
            return account_id
        with self._lock:
            if len(self._accounts) < MAX_ACCOUNT_LABELS:
                self._accounts.add(account_id)
                return account_id
        return OTHER_ACCOUNT

    def sql_timeout(self, exc: BaseException | None) -> bool:
        """Count ``exc`` when it is a database timeout; whether it was."""
        kind = sql_timeout_kind(exc)
        if kind is None:
            return False
        self.sql_timeouts.labels(kind=kind).inc()
        return True

    def spool(self, stats: SpoolStats | None) -> None:
        messages = 0 if stats is None else stats.messages
        self.spool_messages.set(messages)
        self.spool_bytes.set(0 if stats is None else stats.bytes)
        oldest = None if stats is None else stats.oldest_age
        self.spool_oldest.set(0.0 if oldest is None else oldest.total_seconds())

    def serve(self, host: str, port: int) -> MetricsServer:
        """``/metrics`` on ``host:port`` from a thread of its own."""
        server, thread = start_http_server(port, addr=host, registry=self.registry)
        bound = int(server.server_address[1])
        log.info("poller metrics on http://%s:%d/metrics", host, bound)
        return MetricsServer(server, thread, bound)


@dataclass(slots=True)
class MetricsServer:
    server: WSGIServer
    thread: threading.Thread
    port: int

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


class PoolWaits(CallTimes):
    """The pool's waits and slow calls into :class:`PollerMetrics` (``db.call_times``)."""

    def __init__(self, metrics: PollerMetrics) -> None:
        super().__init__()
        self.metrics = metrics

    def record(self, *, wait_s: float, total_s: float) -> None:
        self.calls += 1
        self.metrics.db_calls.inc()
        self.metrics.pool_wait.observe(wait_s)
        if total_s > self.slow_after.total_seconds():
            self.slow += 1
            self.metrics.db_slow_calls.inc()


FINDINGS = (
    "missing_records",
    "doubled_records",
    "missing_applied",
    "unserved_records",
    "unserved_applied",
    "usage_short",
    "usage_doubled",
)


def write_reconciliation(path: Path, report: Reconciliation, *, at: float) -> None:
    """The report as gauges in ``path`` (written whole, then renamed into place)."""
    registry = CollectorRegistry()
    findings = Gauge(
        "shoal_polling_reconcile_findings",
        "Observations (or card periods, for usage) the last reconciliation found off, "
        "by finding; 0 everywhere when nothing is missing or doubled.",
        ["finding"],
        registry=registry,
    )
    for name in FINDINGS:
        findings.labels(finding=name).set(len(getattr(report, name)))
    counts = Gauge(
        "shoal_polling_reconcile_observations",
        "What the last reconciliation compared: served, recorded, failed_records, applied.",
        ["what"],
        registry=registry,
    )
    for what in ("served", "recorded", "failed_records", "applied"):
        counts.labels(what=what).set(getattr(report, what))
    Gauge(
        "shoal_polling_reconcile_clean",
        "1 when the last reconciliation found nothing missing or doubled, else 0.",
        registry=registry,
    ).set(1 if report.clean else 0)
    Gauge(
        "shoal_polling_reconcile_timestamp_seconds",
        "Unix time of the last reconciliation.",
        registry=registry,
    ).set(at)
    write_to_textfile(str(path), registry)
