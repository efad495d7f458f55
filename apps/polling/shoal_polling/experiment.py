"""The reference's problem and its fix, reproduced on one machine: ``shoal-polling experiment``.

One process polls a fleet through a slow gateway and shares one connection
pool with everything else it does, as the reference's worker did (card
polling, stop/resume, device evaluation and async tasks on one
``MAX_OPEN_CONNS`` pool). The experiment runs the same fleet twice, each on a
scratch database of its own:

- ``sync``: every poll writes its observation itself. The number of writes
  waiting for a connection follows the number of polls in flight (accounts x
  20), not the pool: waits pass the deadline, writes time out, and what the
  gateway served is lost;
- ``async``: polls only call the gateway and publish; a consumer with a fixed
  concurrency writes (30 of 60 in the reference, the same ratio here). The
  writes lag behind instead of failing, and the backlog drains.

Reported per mode: polls and observations per second, SQL timeouts (writes
that found no connection in time or ran past the deadline), observations lost
(served by the gateway, never applied: the reconciliation), the largest
backlog, and the time to drain it after polling stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import uuid
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from shoal import Pipeline, Shoal, ShoalError, SystemClock
from shoal.db.embedded import free_port
from shoal.ingest.pipeline import check_connection_budget
from shoal.ingest.postgres import PostgresTransport
from shoal.ingest.transport import Transport
from shoal_polling.domain import COLLECTION, MODE_KEY, OBSERVATIONS
from shoal_polling.fleet import FleetSpec, create_fleet
from shoal_polling.gateway_client import GatewayClient, GatewayError
from shoal_polling.ingest import PollingIngest
from shoal_polling.poller import Poller, PollerSettings
from shoal_polling.reconcile import reconcile
from shoal_polling.schema import ensure_schema

log = logging.getLogger("shoal_polling.experiment")


@dataclass(frozen=True, slots=True)
class ExperimentSettings:
    duration_s: float = 20.0
    # Sized for one small machine (the figures in docs/polling.md come from 2 CPUs):
    # 100 cards, every step every 2 s, 150 observations/s wanted.
    accounts: int = 10
    cards_per_account: int = 10
    # The reference's pool of 60 with 30 ingest slots (half) and a reserve of 20, at 1/5;
    # its 3 s write timeout scaled the same way.
    pool_size: int = 12
    consumers: int = 6
    reserve: int = 4
    other_load: int = 2  # tasks of other work sharing the pool (stop/resume, device evaluation)
    deadline_s: float = 1.0
    latency_ms: float = 300.0
    latency_sigma: float = 0.8
    step_interval_s: float = 2.0
    apply_cost_ms: float = 100.0
    transport_pool: int = 4
    nats_url: str | None = None  # the nats transport instead of postgres
    drain_timeout_s: float = 120.0
    seed: int = 1


@dataclass(slots=True)
class ModeResult:
    mode: str
    transport: str = "postgres"
    polls: int = 0
    observations: int = 0
    observations_per_s: float = 0.0
    sql_timeouts: int = 0
    pool_timeouts: int = 0
    other_work_failed: int = 0
    served: int = 0
    lost: int = 0
    records_missing: int = 0
    max_backlog: int = 0
    drain_s: float = 0.0
    clean: bool = False


class _Gateway:
    """``shoal-polling gateway`` as a child process of the experiment."""

    def __init__(self, settings: ExperimentSettings) -> None:
        self.settings = settings
        self.port = free_port()
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        s = self.settings
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "shoal_polling.cli",
            "gateway",
            "--port",
            str(self.port),
            "--seed",
            str(s.seed),
            "--latency-ms",
            str(s.latency_ms),
            "--latency-sigma",
            str(s.latency_sigma),
            "--rate-limit",
            "0",
            stdout=asyncio.subprocess.DEVNULL,
        )
        client = GatewayClient(self.url)
        try:
            for _ in range(300):
                with contextlib.suppress(Exception):
                    if (await client.http.get("/healthz")).status_code == 200:
                        return
                await asyncio.sleep(0.05)
            raise GatewayError("the gateway did not start")
        finally:
            await client.close()

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            await self.proc.wait()


@contextlib.asynccontextmanager
async def scratch_database(server_url: str) -> Any:
    """A database of the experiment's own on ``server_url``'s server, dropped afterwards."""
    name = f"shoal_polling_exp_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(server_url, dbname=name)
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


async def _other_work(boss: Shoal, stop: asyncio.Event, result: ModeResult) -> None:
    """Short queries of the rest of the worker, on the same pool."""
    while not stop.is_set():
        try:
            await boss.db.run(lambda c: c.execute("SELECT pg_sleep(0.05)"), transaction=False)
        except ShoalError:
            result.other_work_failed += 1
        await asyncio.sleep(0.05)


async def run_mode(server_url: str, mode: str, settings: ExperimentSettings) -> ModeResult:
    s = settings
    result = ModeResult(mode, "postgres" if settings.nats_url is None else "nats")
    interval = timedelta(seconds=s.step_interval_s)
    poller_settings = PollerSettings(
        traffic_interval=interval,
        card_status_interval=interval,
        real_name_interval=interval,
        plan_interval=interval,
        failure_backoff=interval,
        idle_wait=timedelta(milliseconds=100),
        lease=timedelta(minutes=5),
    )
    clock = SystemClock()
    async with scratch_database(server_url) as url:
        boss = await Shoal.connect(
            url, max_size=s.pool_size, deadline=timedelta(seconds=s.deadline_s)
        )
        # The topics' own connections, outside the app's pool, as the reference's
        # NSQ was: the experiment measures the app's pool, not the transport's.
        carrier = await Shoal.connect(url, max_size=s.transport_pool, run_migrations=False)
        gateway = _Gateway(s)
        stop = asyncio.Event()
        ingest_stop = asyncio.Event()
        tasks: list[asyncio.Task[None]] = []
        try:
            await ensure_schema(boss.db, today=clock.now().date())
            await create_fleet(
                boss.db, FleetSpec(accounts=s.accounts, cards_per_account=s.cards_per_account)
            )
            await gateway.start()
            topics: Transport = PostgresTransport(carrier)
            if s.nats_url is not None:
                from shoal.ingest.nats import NatsTransport

                topics = NatsTransport(s.nats_url)
            pipeline = Pipeline(boss, topics, mode_key=MODE_KEY)
            await pipeline.start()
            await pipeline.config.set(MODE_KEY, mode)
            ingest = PollingIngest(
                boss.db,
                pipeline,
                plan_interval=interval,
                apply_cost=timedelta(milliseconds=s.apply_cost_ms),
            )
            client = GatewayClient(gateway.url, timeout=timedelta(seconds=30))
            poller = Poller(boss.db, pipeline, ingest, client, settings=poller_settings)
            if mode == "sync":
                poller.check_budget(s.accounts, mode)
            else:
                check_connection_budget(
                    pool_size=s.pool_size, consumers=s.consumers, writers=1, reserve=s.reserve
                )
            tasks.append(
                asyncio.create_task(
                    pipeline.consumer(OBSERVATIONS, ingest.apply, concurrency=s.consumers).run(
                        ingest_stop
                    )
                )
            )
            tasks.append(
                asyncio.create_task(
                    pipeline.batch_consumer(COLLECTION, ingest.write_batch).run(ingest_stop)
                )
            )
            tasks += [
                asyncio.create_task(_other_work(boss, stop, result)) for _ in range(s.other_load)
            ]
            boss.db.pool.pop_stats()
            started = clock.monotonic()
            polling = asyncio.create_task(poller.run(stop))
            while clock.monotonic() - started < s.duration_s:
                await asyncio.sleep(1.0)
                with contextlib.suppress(ShoalError):
                    depth = await pipeline.transport.depth(OBSERVATIONS.name, "shoal")
                    result.max_backlog = max(result.max_backlog, depth.total)
            stop.set()
            await polling
            elapsed = clock.monotonic() - started
            drain_from = clock.monotonic()
            while clock.monotonic() - drain_from < s.drain_timeout_s:
                with contextlib.suppress(ShoalError):
                    obs = await pipeline.transport.depth(OBSERVATIONS.name, "shoal")
                    rec = await pipeline.transport.depth(COLLECTION.name, "shoal")
                    if obs.total == 0 and rec.total == 0:
                        break
                await asyncio.sleep(0.5)
            stats = boss.db.pool.get_stats()
            result.pool_timeouts = int(stats.get("requests_errors", 0))
            result.polls = poller.stats.polls
            result.observations = poller.stats.observations
            result.observations_per_s = round(poller.stats.observations / elapsed, 1)
            result.sql_timeouts = poller.stats.apply_errors
            served = await client.served()
            await client.close()
            report = await reconcile(boss.db, served)
            # Async writes may still be waiting on the retry ladder (a record
            # whose write found no connection): drained means reconciled.
            while (
                mode == "async"
                and not report.clean
                and clock.monotonic() - drain_from < s.drain_timeout_s
            ):
                await asyncio.sleep(1.0)
                report = await reconcile(boss.db, served)
            result.drain_s = round(clock.monotonic() - drain_from, 1)
            result.served = report.served
            result.lost = len(report.missing_applied)
            result.records_missing = len(report.missing_records)
            result.clean = report.clean
        finally:
            stop.set()
            ingest_stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                await pipeline.close()
            await boss.close()
            await carrier.close()
            await gateway.stop()
    return result


async def run_experiment(server_url: str, settings: ExperimentSettings) -> list[ModeResult]:
    results = []
    for mode in ("sync", "async"):
        log.warning("experiment: %s mode for %.0f s", mode, settings.duration_s)
        results.append(await run_mode(server_url, mode, settings))
    return results


def as_rows(results: list[ModeResult]) -> list[dict[str, Any]]:
    return [asdict(r) for r in results]
