"""A real ``shoal worker`` process: its Prometheus metrics and its JSON log lines.

The worker runs ``tests.metricsapp:app`` with ``SHOAL_METRICS_PORT`` and
``SHOAL_LOG_FORMAT=json``; the test sends jobs through its own client, waits
for their rows to settle, then scrapes ``/metrics`` with httpx until the
counters show them (the worker counts an outcome right after writing it).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from shoal import Shoal
from tests.conftest import wait_for
from tests.test_processes import (
    EXIT_TIMEOUT_S,
    REPO,
    START_TIMEOUT_S,
    WorkerProcesses,
    rows,
    state_counts,
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def metrics_port() -> int:
    return free_port()


@pytest.fixture
def workers(db_url: str, tmp_path: Path, metrics_port: int) -> Iterator[WorkerProcesses]:
    procs = WorkerProcesses(
        db_url,
        tmp_path,
        app="tests.metricsapp:app",
        env={"SHOAL_METRICS_PORT": str(metrics_port), "SHOAL_LOG_FORMAT": "json"},
    )
    try:
        yield procs
    finally:
        procs.cleanup()


async def scrape(port: int) -> dict[str, list[Sample]] | None:
    """Samples by name, or None while nothing answers on ``port``."""
    try:
        async with httpx.AsyncClient() as http:
            response = await http.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    except httpx.TransportError:
        return None
    response.raise_for_status()
    samples: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def value(samples: dict[str, list[Sample]], name: str, **labels: str) -> float:
    """The sample ``name`` with exactly these labels (0 when it is not there yet)."""
    for sample in samples.get(name, []):
        if sample.labels == labels:
            return float(sample.value)
    return 0.0


async def settled(client: Shoal, queue: str, states: dict[str, int]) -> bool:
    return await state_counts(client, queue) == states


@pytest.mark.slow
async def test_worker_process_counts_outcomes_and_times_runs_on_its_metrics_port(
    observer: Shoal, workers: WorkerProcesses, metrics_port: int
) -> None:
    client = observer
    proc = workers.start()
    await wait_for(lambda: scrape(metrics_port), timeout_s=START_TIMEOUT_S, interval_s=0.1)

    for _ in range(3):
        await client.send("obs_ok")
    failing = await client.send("obs_fail", retry_limit=1)
    await client.send("obs_snooze")
    await wait_for(lambda: settled(client, "obs_ok", {"completed": 3}), timeout_s=30)
    await wait_for(lambda: settled(client, "obs_fail", {"failed": 1}), timeout_s=30)
    await wait_for(lambda: settled(client, "obs_snooze", {"completed": 1}), timeout_s=30)

    expected = {
        ("obs_ok", "completed"): 3,
        ("obs_fail", "retried"): 1,
        ("obs_fail", "failed"): 1,
        ("obs_snooze", "snoozed"): 1,
        ("obs_snooze", "completed"): 1,
    }

    async def counted() -> dict[str, list[Sample]] | None:
        samples = await scrape(metrics_port)
        if samples is None:
            return None
        got = {
            key: value(samples, "shoal_jobs_total", queue=key[0], outcome=key[1])
            for key in expected
        }
        return samples if got == expected else None

    await wait_for(counted, timeout_s=30, interval_s=0.1)
    samples = await scrape(metrics_port)
    assert samples is not None
    # Every run is timed (two attempts of obs_fail, two runs of obs_snooze);
    # the wait is measured to the runs of each job's first attempt (a snooze
    # spends no attempt, so both runs of obs_snooze's job count).
    runs = {q: value(samples, "shoal_job_run_seconds_count", queue=q) for q in expected_queues()}
    assert runs == {"obs_ok": 3, "obs_fail": 2, "obs_snooze": 2}
    waits = {q: value(samples, "shoal_job_wait_seconds_count", queue=q) for q in expected_queues()}
    assert waits == {"obs_ok": 3, "obs_fail": 1, "obs_snooze": 2}
    assert value(samples, "shoal_job_run_seconds_bucket", queue="obs_ok", le="+Inf") == 3
    assert value(samples, "shoal_pool_connection_requests_total") > 0
    assert value(samples, "shoal_pool_connections", state="open") >= 1

    # Counters live in the process: rows leaving the table lower nothing.
    await rows(client, "DELETE FROM shoal.job WHERE queue LIKE 'obs\\_%%'")
    after = await scrape(metrics_port)
    assert after is not None
    assert value(after, "shoal_jobs_total", queue="obs_ok", outcome="completed") == 3

    proc.terminate()
    assert await workers.wait_exit(proc, EXIT_TIMEOUT_S) == 0

    # The log is JSON lines, and the final failure names its queue and job.
    lines = [line for line in workers.log(proc).splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    failed = [r for r in records if "failed for good" in r["message"]]
    assert len(failed) == 1
    assert (failed[0]["level"], failed[0]["queue"], failed[0]["job_id"]) == (
        "WARNING",
        "obs_fail",
        failing,
    )
    assert any(r["logger"] == "shoal.metrics" for r in records)  # where it serves


def expected_queues() -> tuple[str, ...]:
    return ("obs_ok", "obs_fail", "obs_snooze")


def test_worker_refuses_a_busy_metrics_port_in_one_line(db_url: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "shoal.cli",
                "--database-url",
                db_url,
                "worker",
                "--app",
                "tests.metricsapp:app",
                "--metrics-port",
                str(port),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
        )
    assert done.returncode == 2, done.stderr
    assert f"--metrics-port: cannot serve metrics on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr
