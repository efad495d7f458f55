"""The poller's Prometheus metrics: scraped over HTTP, they say what the run did.

In process: a round against a gateway failing 30% of its calls, scraped from
the poller's metrics server, each series checked against the poller's own
counts. As a command: ``shoal-polling poll --metrics-port`` scraped while it
runs, then compared with the counts it prints when it stops.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import httpx
import psycopg_pool
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shoal import DeadlineExceeded, Shoal, TransientError
from shoal.db.embedded import free_port
from shoal_polling.cli import main
from shoal_polling.domain import COLLECTION, OBSERVATIONS
from shoal_polling.gateway import GatewaySettings
from shoal_polling.metrics import MAX_ACCOUNT_LABELS, PollerMetrics, PoolWaits, sql_timeout_kind
from tests.polling.conftest import SMALL_FLEET
from tests.polling.processes import REPO, GatewayProcess
from tests.polling.rig import open_rig
from tests.polling.test_cli import wait_up

Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def parse(text: str) -> Samples:
    """sample name -> sorted labels -> value."""
    out: Samples = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name][tuple(sorted(s.labels.items()))] = s.value
    return out


def total(samples: Samples, name: str, **match: str) -> float:
    return sum(
        v
        for labels, v in samples.get(name, {}).items()
        if all(dict(labels).get(k) == want for k, want in match.items())
    )


async def test_a_scrape_counts_what_the_round_did(polling: Shoal) -> None:
    rig = await open_rig(
        polling, GatewaySettings(seed=11, latency_ms=0.0, rate_limit=0.0, error_rate=0.3)
    )
    metrics = rig.poller.metrics
    polling.db.call_times = PoolWaits(metrics)
    server = metrics.serve("127.0.0.1", 0)
    try:
        await rig.round()
        letter = json.dumps(
            {"id": "dead-1", "published_at": "2026-12-01T00:00:00+00:00", "body": {}}
        )
        await rig.pipeline.store.dead_letter(
            OBSERVATIONS.name, "business", [("dead-1", letter, "NotFound", 1)], now=None
        )
        assert await rig.poller.count_dead_letters() == {OBSERVATIONS.name: 1, COLLECTION.name: 0}
        async with httpx.AsyncClient() as http:
            response = await http.get(f"http://127.0.0.1:{server.port}/metrics")
        assert response.status_code == 200
        samples = parse(response.text)
    finally:
        polling.db.call_times = None
        server.close()
        await rig.close()

    stats = rig.poller.stats
    assert stats.gateway_errors > 0 and stats.observations > 0
    calls = stats.observations + stats.gateway_errors
    assert total(samples, "shoal_polling_polls_total") == stats.polls
    assert total(samples, "shoal_polling_polls_total", outcome="failed") == stats.gateway_errors
    assert total(samples, "shoal_polling_polls_total", step="plan") == SMALL_FLEET.accounts * 3
    assert total(samples, "shoal_polling_gateway_seconds_count") == calls
    assert total(samples, "shoal_polling_gateway_errors_total") == stats.gateway_errors
    assert (
        total(samples, "shoal_polling_gateway_errors_total", reason="server_error")
        == stats.gateway_errors
    )
    assert total(samples, "shoal_polling_observations_total", route="applied") == stats.observations
    assert total(samples, "shoal_polling_observations_total") == stats.observations
    assert total(samples, "shoal_polling_gateway_rate_limited_total") == 0
    assert total(samples, "shoal_polling_sql_timeouts_total") == 0
    db_calls = total(samples, "shoal_polling_db_calls_total")
    assert db_calls > 0 and total(samples, "shoal_polling_pool_wait_seconds_count") == db_calls
    assert total(samples, "shoal_polling_dead_letters", topic=OBSERVATIONS.name) == 1
    assert total(samples, "shoal_polling_dead_letters", topic=COLLECTION.name) == 0
    accounts = {
        dict(labels)["account"] for labels in samples["shoal_polling_gateway_seconds_count"]
    }
    assert accounts == {f"acct{i:03d}" for i in range(SMALL_FLEET.accounts)}
    # Labels name steps, outcomes, accounts and topics, never a card.
    for series in samples.values():
        for labels in series:
            assert not any(v.startswith("8986") for _, v in labels), labels


def test_accounts_past_the_label_cap_share_one_label() -> None:
    metrics = PollerMetrics()
    names = {metrics.account(f"a{i}") for i in range(MAX_ACCOUNT_LABELS + 5)}
    assert len(names) == MAX_ACCOUNT_LABELS + 1 and "other" in names
    assert metrics.account("a0") == "a0"


async def test_sql_timeouts_are_told_apart(boss: Shoal) -> None:
    assert sql_timeout_kind(DeadlineExceeded("abandoned after 5s")) == "deadline"
    try:
        raise TransientError("no database connection free in time") from psycopg_pool.PoolTimeout()
    except TransientError as exc:
        assert sql_timeout_kind(exc) == "pool"
    with pytest.raises(TransientError) as cancelled:  # the server's statement_timeout

        async def slow(conn):
            await conn.execute("SET LOCAL statement_timeout = 10")
            # Nothing waits here: the server cancels this statement after 10 ms.
            await conn.execute("SELECT pg_sleep(2)")

        await boss.db.run(slow)
    assert sql_timeout_kind(cancelled.value) == "statement"
    assert sql_timeout_kind(ValueError("no")) is None
    metrics = PollerMetrics()
    assert metrics.sql_timeout(cancelled.value)
    assert (
        metrics.registry.get_sample_value("shoal_polling_sql_timeouts_total", {"kind": "statement"})
        == 1
    )


def test_poll_serves_metrics_while_it_runs(db_url: str, tmp_path: Path) -> None:
    """``poll --metrics-port`` serves the poller's series until it is stopped.

    The scrape follows the poller's own "metrics on" line and precedes its
    SIGTERM, so no wait is timed; what the counts mean is checked in-process
    by test_a_scrape_counts_what_the_round_did.
    """
    gateway = GatewayProcess(tmp_path, "--seed", "6", "--latency-ms", "2").start()
    port = free_port()
    poller: subprocess.Popen[bytes] | None = None
    try:
        wait_up(gateway.url)
        db = ["--database-url", db_url]
        assert main([*db, "seed", "--accounts", "2", "--cards", "3"]) == 0
        quick = [f"--{s}-interval-s" for s in ("traffic", "card-status", "real-name")]
        poller = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "shoal_polling.cli",
                *db,
                "poll",
                "--gateway",
                gateway.url,
                "--metrics-port",
                str(port),
                "--spool-dir",
                str(tmp_path / "spool"),
                *[arg for flag in quick for arg in (flag, "0.2")],
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert poller.stderr is not None
        for line in poller.stderr:  # blocks until the poller says its endpoint is up
            if b"metrics on http://" in line:
                break
        else:
            raise AssertionError("the poller ended without serving its metrics")
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        seen = total(parse(text), "shoal_polling_observations_total")
        families = {family.name for family in text_string_to_metric_families(text)}
        assert {"shoal_polling_observations", "shoal_polling_polls"} <= families, families
        poller.send_signal(signal.SIGTERM)  # stops after writing back what is in flight
        out, _ = poller.communicate(timeout=60)
        assert poller.returncode == 0
    finally:
        if poller is not None and poller.poll() is None:
            poller.kill()
            poller.wait(10)
        gateway.stop()
    stats = json.loads(out.decode().strip().splitlines()[-1])
    assert seen <= stats["observations"]
