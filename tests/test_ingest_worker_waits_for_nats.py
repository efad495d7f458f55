"""A worker started before its nats-server waits for it instead of exiting.

Real worker processes (``shoal worker --app tests.ingestapp:app``) and a real
nats-server started after them. The worker's pauses between tries are real
time in another process, so the test waits for its log lines and its
progress, never for a duration.
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
from pathlib import Path

from shoal import Shoal
from shoal.ingest.nats import NatsTransport
from shoal.ingest.pipeline import Pipeline
from shoal.testing import NatsServer
from tests.conftest import wait_for
from tests.ingest_helpers import READINGS, Reading, create_schema, scalar
from tests.test_ingest_processes import ingest_workers
from tests.test_processes import EXIT_TIMEOUT_S, WorkerProcesses

WAITING = re.compile(
    r"WARNING .*the nats transport cannot be reached yet \(try (\d+): .*"
    r"trying again in (\d+) s"
)


def nats_env(server: NatsServer) -> dict[str, str]:
    return {
        "SHOAL_INGEST_TRANSPORT": "nats",
        "SHOAL_NATS_URL": server.url,
        "SHOAL_NATS_MONITOR_URL": server.monitor_url,
    }


async def tries_logged(
    workers: WorkerProcesses, proc: subprocess.Popen[bytes], count: int
) -> list[tuple[int, int]]:
    """The worker's first ``count`` waiting lines (try, pause), once it has logged them."""
    found: list[tuple[int, int]] = []

    def logged() -> bool:
        text = workers.log(proc)
        found[:] = [(int(t), int(p)) for t, p in WAITING.findall(text)]
        if proc.poll() is not None:
            raise AssertionError(f"the worker exited while nats-server was down:\n{text[-3000:]}")
        return len(found) >= count

    await wait_for(logged, 60)
    return found[:count]


async def test_a_worker_started_before_nats_server_waits_for_it_then_consumes(
    boss: Shoal, db_url: str, tmp_path: Path
) -> None:
    await create_schema(boss.db)
    server = NatsServer(tmp_path / "nats")  # ports chosen, not started
    workers = ingest_workers(db_url, tmp_path, nats_env(server))
    publisher = Pipeline(boss, NatsTransport(server.url, monitor_url=server.monitor_url))
    try:
        proc = workers.start()
        # A WARN per try, the pause growing.
        assert await tries_logged(workers, proc, 2) == [(1, 1), (2, 2)]

        await asyncio.to_thread(server.start)
        await publisher.start()
        await publisher.publish_many(
            READINGS, [Reading(card_id=i % 10, amount=1) for i in range(200)]
        )

        async def all_applied() -> bool:
            return await scalar(boss.db, "SELECT count(*) FROM applied") == 200

        await wait_for(all_applied, 120)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert await workers.wait_exit(proc, EXIT_TIMEOUT_S) == 0
        assert "the nats transport is reachable after" in workers.log(proc)
    finally:
        workers.cleanup()
        await publisher.close()
        server.stop()


async def test_a_worker_waiting_for_nats_server_stops_on_sigterm(
    db_url: str, tmp_path: Path
) -> None:
    server = NatsServer(tmp_path / "nats")  # never started
    workers = ingest_workers(db_url, tmp_path, nats_env(server))
    try:
        proc = workers.start()
        await tries_logged(workers, proc, 1)
        proc.send_signal(signal.SIGTERM)
        assert await workers.wait_exit(proc, EXIT_TIMEOUT_S) == 0
    finally:
        workers.cleanup()
