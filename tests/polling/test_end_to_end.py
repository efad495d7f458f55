"""The whole system on one machine: ``shoal-polling gateway`` (its own process), the poller,
and ``shoal worker --app shoal_polling.app:app`` (its own process) on the postgres and the
nats transports; the poller starts in sync mode and switches to async mid-run, and the ingest
worker is killed with SIGKILL mid-run and replaced. Afterwards
``shoal-polling reconcile`` finds nothing missing or doubled."""

from __future__ import annotations

import asyncio
import signal
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from shoal import Pipeline, Shoal, SystemClock
from shoal.ingest.postgres import PostgresTransport
from shoal.ingest.transport import Transport
from shoal.testing import NatsServer
from shoal_polling.domain import MODE_KEY
from shoal_polling.fleet import FleetSpec, create_fleet
from shoal_polling.gateway_client import GatewayClient
from shoal_polling.ingest import PollingIngest
from shoal_polling.poller import Poller, PollerSettings, add_priority_item
from shoal_polling.reconcile import reconcile
from shoal_polling.schema import ensure_schema
from tests.conftest import wait_for
from tests.polling.processes import REPO, GatewayProcess
from tests.polling.test_gateway import wait_up
from tests.test_processes import WorkerProcesses

pytestmark = pytest.mark.slow

FLEET = FleetSpec(accounts=2, cards_per_account=10, quota_kb=20_000)
CARDS = FLEET.accounts * FLEET.cards_per_account
ROUNDS = 2
QUICK = timedelta(milliseconds=300)
ACK_WAIT = timedelta(seconds=2)
SETTINGS = PollerSettings(
    traffic_interval=QUICK,
    card_status_interval=QUICK,
    real_name_interval=QUICK,
    plan_interval=QUICK,
    failure_backoff=QUICK,
    idle_wait=timedelta(milliseconds=50),
)


async def test_polling_rounds_on_both_transports_reconcile_with_nothing_missing_or_doubled(
    boss: Shoal, db_url: str, tmp_path: Path, transport_kind: str, nats: NatsServer | None
) -> None:
    gateway = GatewayProcess(
        tmp_path, "--seed", "5", "--latency-ms", "5", "--error-rate", "0.05", "--risk-rate", "0.01"
    ).start()
    if nats is not None:
        from shoal.ingest.nats import NatsTransport

        transport: Transport = NatsTransport(nats.url, monitor_url=nats.monitor_url)
        env = {
            "SHOAL_INGEST_TRANSPORT": "nats",
            "SHOAL_NATS_URL": nats.url,
            "SHOAL_NATS_MONITOR_URL": nats.monitor_url,
        }
    else:
        transport = PostgresTransport(boss)
        env = {"SHOAL_INGEST_TRANSPORT": "postgres"}
    env["SHOAL_POLLING_ACK_WAIT_S"] = str(ACK_WAIT.total_seconds())
    workers = WorkerProcesses(db_url, tmp_path, app="shoal_polling.app:app", env=env)
    client = GatewayClient(gateway.url)
    pipeline = Pipeline(boss, transport, mode_key=MODE_KEY)
    try:
        await ensure_schema(boss.db, today=SystemClock().now().date())
        await create_fleet(boss.db, FLEET)
        await pipeline.start()
        await wait_up(client)
        workers.start()
        ingest = PollingIngest(boss.db, pipeline, plan_interval=SETTINGS.plan_interval)
        poller = Poller(boss.db, pipeline, ingest, client, settings=SETTINGS)
        await add_priority_item(boss.db, "8986001" + "00000002", "traffic")
        await pipeline.config.set(MODE_KEY, "sync")
        stop = asyncio.Event()
        running = asyncio.create_task(poller.run(stop))
        target = ROUNDS * CARDS * 3
        await wait_for(lambda: poller.stats.observations >= target // 3, 30)
        await pipeline.config.set(MODE_KEY, "async")
        # The ingest worker dies mid-stream (SIGKILL); another takes over. What the
        # dead one held comes back after its ack wait and is applied harmlessly.
        await wait_for(lambda: poller.stats.observations >= target * 2 // 3, 30)
        first = workers.procs[0][0]
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        workers.start()
        await wait_for(lambda: poller.stats.observations >= target, 30)
        stop.set()
        await running

        served = await client.served()
        assert len(served) >= target

        async def clean() -> bool:
            return (await reconcile(boss.db, served)).clean

        await wait_for(clean, 45, interval_s=0.2)
        report = await reconcile(boss.db, served)
        assert report.failed_records > 0, "the gateway's error rate left failure records"
        assert poller.stats.priority_applied == 1

        if transport_kind == "nats":
            return
        # The command line says the same.
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "shoal_polling.cli",
            "--database-url",
            db_url,
            "reconcile",
            "--gateway",
            gateway.url,
            cwd=REPO,
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await proc.communicate()
        assert proc.returncode == 0, out.decode()
        assert b"nothing missing or doubled" in out
    finally:
        await client.close()
        await pipeline.close()
        workers.cleanup()
        gateway.stop()
