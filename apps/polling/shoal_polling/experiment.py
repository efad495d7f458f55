"""The reference's problem and its fix, reproduced on one machine: ``shoal-polling experiment``.

One process polls a fleet through a slow gateway and shares one connection
pool with everything else it does, as the reference's worker did (card
polling, stop/resume, device evaluation and async tasks on one
``MAX_OPEN_CONNS=60`` pool, a 3 s write timeout). The experiment runs the
same fleet and seed three times, each on a scratch database of its own:

- ``sync``: every poll writes its observation itself. The writes waiting for
  a connection follow the polls in flight (accounts x 20), not the pool:
  waits pass the deadline and writes time out, the reference's symptom. The
  reference lost those writes; shoal hands each one to the topic
  (``Pipeline.submit``), so a consumer applies it later and nothing is lost;
- ``async``: polls only call the gateway and publish; a consumer with a fixed
  concurrency (30 of 60, as in the reference) writes. The writes lag behind
  instead of failing, and the backlog drains;
- ``switch`` (``chaos=True``): the topics on a nats-server of the
  experiment's own, the consumer in a ``shoal worker`` process of its own.
  The run starts in sync mode and switches to async a quarter of the way in;
  at half-time the worker is killed with SIGKILL and started again; at three
  quarters nats-server is killed with SIGKILL and started again.

The app's pool is the one starved on purpose (its size and deadline are the
experiment's settings). Setting a run up (migrations, the domain schema, the
fleet, the starting mode) and reconciling it afterwards are the experiment's
own bookkeeping, not the app's work: they run on a small control pool with
shoal's normal deadline, so a slow DDL or a long reconciliation query on a
busy machine cannot fail the run.

Reported per run: polls/s, SQL timeouts, slow statements and pool waits (as
the app's pool saw them, :class:`~shoal.db.CallTimes`), ingest lag, the
largest backlog, the time to drain it, and the reconciliation of what the
gateway served against what was recorded and applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from shoal import Database, Pipeline, Shoal, ShoalError, SystemClock
from shoal.db import CallTimes, free_port
from shoal.ingest import (
    IngestStore,
    PostgresTransport,
    RuntimeConfig,
    Transport,
    check_connection_budget,
)
from shoal_polling.domain import COLLECTION, MODE_KEY, OBSERVATIONS
from shoal_polling.fleet import FleetSpec, create_fleet
from shoal_polling.gateway_client import GatewayClient, GatewayError
from shoal_polling.ingest import DEFAULT_PLAN_INTERVAL, PollingIngest
from shoal_polling.poller import Poller, PollerSettings
from shoal_polling.reconcile import Reconciliation, reconcile
from shoal_polling.schema import ensure_schema

log = logging.getLogger("shoal_polling.experiment")

RUNS = ("sync", "async", "switch")
# The control pool's connections: set-up, the mode switch and reconciliation
# run one call at a time. One more than the app, worker and carrier pools
# (60 + 35 + 4 at full size): the server's max_connections must hold 100.
CONTROL_POOL_SIZE = 1


@dataclass(frozen=True, slots=True)
class ExperimentSettings:
    duration_s: float = 30.0
    # The reference's shape at the size one 2-CPU machine can drive: 2,000 cards
    # over 40 accounts, up to 800 poll steps in flight (accounts x 20), one pool
    # of 60 with 30 ingest slots and a reserve of 20, and a gateway answering in
    # 50-500 ms. Writes are lighter than the reference's (150 ms of server time
    # here), so its 3 s write timeout is scaled to 1 s.
    accounts: int = 40
    cards_per_account: int = 50
    pool_size: int = 60
    consumers: int = 30
    reserve: int = 20
    # Tasks of other work sharing the pool (the reference's stop/resume, device
    # evaluation and async task queue), each a 50 ms query every 100 ms.
    other_load: int = 20
    deadline_s: float = 1.0
    latency_ms: float = 150.0
    latency_sigma: float = 0.6
    latency_range_ms: tuple[float, float] = (50.0, 500.0)
    # Each gateway step of each card is due this often, first due times spread
    # over it (the plan step every 30 minutes, as in the reference).
    step_interval_s: float = 20.0
    # The stand-in for the reference's slow production write (bigger tables,
    # triggers, contention): server time added to each apply.
    apply_cost_ms: float = 150.0
    transport_pool: int = 4
    nats_url: str | None = None  # sync and async runs on this nats server instead of postgres
    chaos: bool = True  # the third run: switch mode, kill the worker and nats-server
    drain_timeout_s: float = 180.0
    seed: int = 1


@dataclass(slots=True)
class RunResult:
    run: str
    transport: str = "postgres"
    polls: int = 0
    polls_per_s: float = 0.0
    observations: int = 0
    sql_timeouts: int = 0  # in-place applies that failed (then handed to the topic)
    handed_off: int = 0
    resubmitted: int = 0  # neither applied nor published at first, tried again by submit
    spooled: int = 0  # neither applied nor published for a while: spooled to disk, replayed
    not_applied: int = 0  # submits that raised (a business error); none are dropped otherwise
    slow_statements: int = 0
    db_calls: int = 0
    pool_wait_p50_ms: float = 0.0
    pool_wait_p99_ms: float = 0.0
    lag_p50_ms: float = 0.0
    lag_p99_ms: float = 0.0
    other_work_failed: int = 0
    max_backlog: int = 0
    drain_s: float = 0.0
    served: int = 0
    lost: int = 0  # served, never applied
    records_missing: int = 0
    doubled: int = 0  # recorded twice, applied but never served, usage above the served maximum
    reconciled: bool = False
    events: list[str] = field(default_factory=list)

    def reconciliation(self) -> str:
        if self.reconciled:
            return "complete"
        return f"{self.lost} lost, {self.records_missing} unrecorded, {self.doubled} doubled"


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
            "--latency-range-ms",
            "{:g}-{:g}".format(*s.latency_range_ms),
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


async def _other_work(boss: Shoal, stop: asyncio.Event, result: RunResult) -> None:
    """Short queries of the rest of the worker, on the same pool."""
    while not stop.is_set():
        try:
            await boss.db.run(lambda c: c.execute("SELECT pg_sleep(0.05)"), transaction=False)
        except ShoalError:
            result.other_work_failed += 1
        await asyncio.sleep(0.05)


class _WorkerProcess:
    """``shoal worker --app shoal_polling.app:app`` on the run's database and nats-server."""

    def __init__(self, url: str, env: dict[str, str], settings: ExperimentSettings) -> None:
        self.url = url
        self.env = env
        self.settings = settings
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed by stop()
            prefix="shoal-polling-worker-", suffix=".log", delete=False
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        s = self.settings
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "shoal.cli",
                "--database-url",
                self.url,
                "worker",
                "--app",
                "shoal_polling.app:app",
                # Its consumer's slots, the sink's writer and a few for the rest:
                # the server's max_connections must hold this and the poller's pool.
                "--pool-size",
                str(s.consumers + 5),
            ],
            env=dict(os.environ)
            | self.env
            | {
                "SHOAL_POLLING_APPLY_COST_MS": str(s.apply_cost_ms),
                # A killed worker's messages come back this soon.
                "SHOAL_POLLING_ACK_WAIT_S": "5",
                "SHOAL_POLLING_CONCURRENCY": str(s.consumers),
            },
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def restart_if_exited(self) -> int | None:
        """Start the worker again if it exited by itself; its exit code then, else None.

        What a process supervisor does, for a worker that ends by itself on an
        error it cannot wait out. (A worker started while nats-server is down
        waits for it: on a busy machine the restart after the kill can take
        that long.) One killed by :meth:`kill` is left for its caller to start.
        """
        if self.proc is None or self.proc.poll() is None:
            return None
        code = self.proc.returncode
        if code == -signal.SIGKILL:
            return None
        self.start()
        return code

    def kill(self) -> int:
        assert self.proc is not None
        pid = self.proc.pid
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        return pid

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        log.info("worker log: %s", self.log.name)


async def _depth(pipeline: Pipeline) -> int:
    total = 0
    for topic in (OBSERVATIONS, COLLECTION):
        total += (await pipeline.transport.depth(topic.name, "shoal")).total
    return total


async def _ingest_lag_ms(boss: Shoal) -> tuple[float, float]:
    """p50 and p99 of applied-at minus observed-at, over every applied observation."""

    async def run(conn: Any) -> tuple[float, float]:
        cur = await conn.execute(
            "SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP"
            " (ORDER BY extract(epoch FROM applied_at - observed_at))"
            " FROM shoal_polling.applied_observation"
        )
        row = await cur.fetchone()
        p50, p99 = row[0] if row and row[0] else (0.0, 0.0)
        return round(p50 * 1000, 1), round(p99 * 1000, 1)

    return await boss.db.run(run, transaction=False)


def _account(result: RunResult, report: Reconciliation) -> None:
    result.served = report.served
    result.lost = len(report.missing_applied) + len(report.usage_short)
    result.records_missing = len(report.missing_records)
    result.doubled = (
        len(report.doubled_records)
        + len(report.unserved_records)
        + len(report.unserved_applied)
        + len(report.usage_doubled)
    )
    result.reconciled = report.clean


Step = Callable[[], Coroutine[Any, Any, str]]


@dataclass(frozen=True, slots=True)
class RunPools:
    """A run's three pools on its database.

    ``app`` is the poller process's one shared pool, starved on purpose
    (``pool_size``, ``deadline_s``); only what the experiment measures uses
    it. ``control`` has shoal's normal deadline and serves the experiment's
    bookkeeping: migrations, set-up, mode changes, reconciliation. ``carrier``
    is the topics' own connections (the reference's NSQ stood outside the
    app's pool too).
    """

    app: Shoal
    control: Shoal
    carrier: Shoal


async def open_pools(
    stack: contextlib.AsyncExitStack, url: str, settings: ExperimentSettings
) -> RunPools:
    """The run's pools on ``url``, each closed when ``stack`` closes; migrates first."""
    control = await Shoal.connect(url, max_size=CONTROL_POOL_SIZE, listen=False)
    stack.push_async_callback(control.close)
    app = await Shoal.connect(
        url,
        max_size=settings.pool_size,
        deadline=timedelta(seconds=settings.deadline_s),
        run_migrations=False,
    )
    stack.push_async_callback(app.close)
    carrier = await Shoal.connect(url, max_size=settings.transport_pool, run_migrations=False)
    stack.push_async_callback(carrier.close)
    return RunPools(app=app, control=control, carrier=carrier)


async def set_up(db: Database, settings: ExperimentSettings, *, today: date) -> None:
    """The domain schema and the run's fleet, on ``db`` (the control pool's)."""
    await ensure_schema(db, today=today)
    await create_fleet(
        db,
        FleetSpec(
            accounts=settings.accounts,
            cards_per_account=settings.cards_per_account,
            spread_s=settings.step_interval_s,
            plan_spread_s=DEFAULT_PLAN_INTERVAL.total_seconds(),
        ),
    )


async def run_mode(server_url: str, run: str, settings: ExperimentSettings) -> RunResult:
    """One run (``sync``, ``async`` or ``switch``) on a scratch database of its own."""
    if run not in RUNS:
        raise ValueError(f"run must be one of {', '.join(RUNS)}, not {run!r}")
    s = settings
    chaos = run == "switch"
    clock = SystemClock()
    interval = timedelta(seconds=s.step_interval_s)
    poller_settings = PollerSettings(
        traffic_interval=interval,
        card_status_interval=interval,
        real_name_interval=interval,
        plan_interval=DEFAULT_PLAN_INTERVAL,
        failure_backoff=interval,
        idle_wait=timedelta(milliseconds=100),
        lease=timedelta(minutes=5),
    )
    async with contextlib.AsyncExitStack() as stack:
        url = await stack.enter_async_context(scratch_database(server_url))
        nats_url, monitor_url, nats = s.nats_url, None, None
        if chaos:
            from shoal.testing import NatsServer  # a development server, killed mid-run

            store = stack.enter_context(tempfile.TemporaryDirectory(prefix="shoal-polling-nats-"))
            nats = NatsServer(Path(store))
            await asyncio.to_thread(nats.start)
            stack.callback(nats.stop)
            nats_url, monitor_url = nats.url, nats.monitor_url
        result = RunResult(run, transport="postgres" if nats_url is None else "nats")
        pools = await open_pools(stack, url, s)
        boss, carrier = pools.app, pools.carrier
        # As `shoal-polling mode` from another process would: not on the app's pool.
        control_config = RuntimeConfig(IngestStore(pools.control.db))
        gateway = _Gateway(s)
        stack.push_async_callback(gateway.stop)
        await gateway.start()
        await set_up(pools.control.db, s, today=clock.now().date())
        topics: Transport = PostgresTransport(carrier)
        if nats_url is not None:
            from shoal.ingest import NatsTransport

            topics = NatsTransport(nats_url, monitor_url=monitor_url)
        # The poller's spool: what neither path takes in time waits here, on disk.
        spool_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="shoal-polling-spool-"))
        pipeline = Pipeline(boss, topics, mode_key=MODE_KEY, spool_dir=spool_dir)
        stack.push_async_callback(pipeline.close)
        await pipeline.start()
        await control_config.set(MODE_KEY, "sync" if chaos else run)
        ingest = PollingIngest(
            boss.db,
            pipeline,
            plan_interval=DEFAULT_PLAN_INTERVAL,
            apply_cost=timedelta(milliseconds=s.apply_cost_ms),
        )
        client = GatewayClient(gateway.url, timeout=timedelta(seconds=30))
        stack.push_async_callback(client.close)
        poller = Poller(boss.db, pipeline, ingest, client, settings=poller_settings)
        poller.check_budget(s.accounts, "sync" if chaos else run)
        check_connection_budget(
            pool_size=s.pool_size, consumers=s.consumers, writers=1, reserve=s.reserve
        )

        stop = asyncio.Event()
        ingest_stop = asyncio.Event()
        tasks: list[asyncio.Task[None]] = []
        worker: _WorkerProcess | None = None
        if chaos:
            assert nats is not None
            worker = _WorkerProcess(
                url,
                {
                    "SHOAL_INGEST_TRANSPORT": "nats",
                    "SHOAL_NATS_URL": nats.url,
                    "SHOAL_NATS_MONITOR_URL": nats.monitor_url,
                },
                s,
            )
            worker.start()
            stack.callback(worker.stop)
        else:
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
        tasks += [asyncio.create_task(_other_work(boss, stop, result)) for _ in range(s.other_load)]

        async def halt() -> None:
            stop.set()
            ingest_stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)

        stack.push_async_callback(halt)

        started = clock.monotonic()

        def note(event: str) -> str:
            line = f"t={clock.monotonic() - started:.1f}s {event}"
            log.warning("experiment %s: %s", run, line)
            result.events.append(line)
            return line

        async def switch_to_async() -> str:
            # Not on the app's pool, which the sync polls keep exhausted.
            await control_config.set(MODE_KEY, "async")
            return note("polling.ingest.mode set to async")

        async def kill_worker() -> str:
            assert worker is not None
            pid = worker.kill()
            note(f"ingest worker {pid} killed (SIGKILL)")
            await asyncio.sleep(1.0)
            worker.start()
            return note("ingest worker started again")

        async def kill_nats() -> str:
            assert nats is not None
            nats.kill()
            note("nats-server killed (SIGKILL)")
            await asyncio.sleep(2.0)
            await asyncio.to_thread(nats.start)
            return note("nats-server started again")

        if worker is not None:
            supervised = worker

            async def supervise() -> None:
                while True:
                    await asyncio.sleep(1.0)
                    code = supervised.restart_if_exited()
                    if code is not None:
                        note(f"ingest worker exited with {code}; started again")

            supervisor = asyncio.create_task(supervise())

            async def stop_supervising() -> None:
                supervisor.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await supervisor

            # Before the worker is stopped: the stack unwinds in reverse.
            stack.push_async_callback(stop_supervising)

        script: list[tuple[float, Step]] = (
            [(0.25, switch_to_async), (0.5, kill_worker), (0.75, kill_nats)] if chaos else []
        )
        times = CallTimes()
        boss.db.call_times = times
        polling = asyncio.create_task(poller.run(stop))
        tasks.append(polling)
        # Until the run's time is up and every step of the script has run: on a
        # slow machine a step may run late, never not at all (a switch run that
        # ended before its switch would report a run that never switched).
        while script or clock.monotonic() - started < s.duration_s:
            if script and clock.monotonic() - started >= script[0][0] * s.duration_s:
                await script.pop(0)[1]()
                continue
            await asyncio.sleep(0.5)
            with contextlib.suppress(Exception):  # a transport down mid-run reads nothing
                result.max_backlog = max(result.max_backlog, await _depth(pipeline))
        stop.set()
        await polling
        elapsed = clock.monotonic() - started
        boss.db.call_times = None

        drain_from = clock.monotonic()
        served = await client.served()
        report = await reconcile(pools.control.db, served)
        # Writes handed to the topic, and records whose write found no connection,
        # may still be on the retry ladder: drained means reconciled.
        while not report.clean and clock.monotonic() - drain_from < s.drain_timeout_s:
            await asyncio.sleep(1.0)
            report = await reconcile(pools.control.db, served)
        result.drain_s = round(clock.monotonic() - drain_from, 1)
        _account(result, report)
        result.polls = poller.stats.polls
        result.polls_per_s = round(poller.stats.polls / elapsed, 1)
        result.observations = poller.stats.observations
        result.sql_timeouts = poller.stats.apply_errors
        result.handed_off = poller.stats.handed_off
        result.resubmitted = poller.stats.resubmitted
        result.spooled = poller.stats.spooled
        result.not_applied = poller.stats.apply_errors - poller.stats.handed_off
        result.slow_statements = times.slow
        result.db_calls = times.calls
        result.pool_wait_p50_ms = round(times.waits.quantile(0.5) * 1000, 1)
        result.pool_wait_p99_ms = round(times.waits.quantile(0.99) * 1000, 1)
        result.lag_p50_ms, result.lag_p99_ms = await _ingest_lag_ms(pools.control)
        if poller.stats.degraded:
            note(f"{poller.stats.degraded} applied in place after a failed publish (degraded)")
    return result


async def run_experiment(server_url: str, settings: ExperimentSettings) -> list[RunResult]:
    results = []
    for run in RUNS if settings.chaos else RUNS[:2]:
        log.warning("experiment: %s run for %.0f s", run, settings.duration_s)
        results.append(await run_mode(server_url, run, settings))
    return results


def as_rows(results: list[RunResult]) -> list[dict[str, Any]]:
    return [asdict(r) | {"reconciliation": r.reconciliation()} for r in results]
