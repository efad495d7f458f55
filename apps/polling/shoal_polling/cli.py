"""``shoal-polling``: the card polling reference app's command line. The environment is read here.

    shoal-polling gateway [--port 8900] [--seed 1] [--latency-ms 20] [--error-rate 0] ...
    shoal-polling seed [--accounts 3] [--cards 10]      the fleet to poll
    shoal-polling poll --gateway URL [--metrics-port N] the poller (sync or async per the switch)
    shoal-polling mode [sync|async]                     read or set polling.ingest.mode
    shoal-polling reconcile --gateway URL | --served-log FILE   served vs recorded vs applied
    shoal-polling experiment                            sync vs async under a slow gateway
    shoal-polling action suspend|reactivate CARD --gateway URL [--callback URL]
                                                        an action, its confirmation awaited
    shoal-polling callbacks [--port 8950]               takes the gateway's confirmations

The ingest side runs as ``shoal worker --app shoal_polling.app:app``. The
database is ``--database-url``, else ``DATABASE_URL``, else shoal's embedded
PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

from shoal import DeadlineExceeded, Pipeline, Shoal, SystemClock
from shoal.cli import database_url, ingest_transport
from shoal_polling.actions import (
    CARD_ACTION,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_POLLS,
    DEFAULT_WAIT,
    ActionRequest,
)
from shoal_polling.domain import ACCOUNT_CONCURRENCY, ACTIONS, MODE_KEY, AsyncConn
from shoal_polling.experiment import ExperimentSettings, as_rows, run_experiment
from shoal_polling.fleet import DEFAULT_QUOTA_KB, FleetSpec, create_fleet
from shoal_polling.gateway import (
    DEFAULT_CONFIRM_AFTER_S,
    DEFAULT_LATENCY_MS,
    DEFAULT_PORT,
    DEFAULT_RATE_LIMIT,
    Gateway,
    GatewaySettings,
    build_gateway_app,
    read_served_log,
)
from shoal_polling.gateway_client import GatewayClient
from shoal_polling.ingest import (
    DEFAULT_PLAN_INTERVAL,
    PLAN_INTERVAL_KEY,
    PollingIngest,
    share_plan_interval,
)
from shoal_polling.metrics import PollerMetrics, PoolWaits, write_reconciliation
from shoal_polling.poller import Poller, PollerSettings
from shoal_polling.reconcile import compare, load_snapshot
from shoal_polling.schema import ensure_schema


async def serve_gateway(settings: GatewaySettings, *, host: str, port: int) -> None:
    import uvicorn

    from shoal.api import api_config

    app = build_gateway_app(Gateway(settings))
    # Served as shoal api is: a deadline on request heads, a lingering close.
    config = api_config(app, host=host, port=port, log_level="warning", access_log=False)
    await uvicorn.Server(config).serve()


def latency_range(text: str | None) -> tuple[float, float] | None:
    """``"50-500"`` as (50.0, 500.0); a clear error for anything else."""
    if text is None:
        return None
    low, sep, high = text.partition("-")
    try:
        bounds = (float(low), float(high))
    except ValueError:
        bounds = (-1.0, -1.0)
    if not sep or not 0 <= bounds[0] <= bounds[1]:
        raise SystemExit(f"--latency-range-ms: expected LOW-HIGH in ms (e.g. 50-500), got {text!r}")
    return bounds


def cmd_gateway(args: argparse.Namespace) -> int:
    settings = GatewaySettings(
        seed=args.seed,
        latency_ms=args.latency_ms,
        latency_sigma=args.latency_sigma,
        latency_range_ms=latency_range(args.latency_range_ms),
        error_rate=args.error_rate,
        rate_limit=args.rate_limit,
        burst=args.burst,
        read_only=not args.writable,
        risk_rate=args.risk_rate,
        id_prefix=args.id_prefix,
        served_log=args.served_log,
        confirm_after_s=None if args.never_confirm else args.confirm_after_s,
    )
    print(f"simulated gateway on http://{args.host}:{args.port} (seed {args.seed})", flush=True)
    asyncio.run(serve_gateway(settings, host=args.host, port=args.port))
    return 0


@contextmanager
def _url(args: argparse.Namespace) -> Iterator[str]:
    with database_url(args) as url:
        yield url


async def _open(url: str, *, pool_size: int = 10, listen: bool = False) -> Shoal:
    boss = await Shoal.connect(url, max_size=pool_size, listen=listen)
    await ensure_schema(boss.db, today=SystemClock().now().date())
    return boss


def cmd_seed(args: argparse.Namespace) -> int:
    spec = FleetSpec(
        accounts=args.accounts,
        cards_per_account=args.cards,
        quota_kb=args.quota_kb,
        stop_percent=args.stop_percent,
    )

    async def run(url: str) -> int:
        boss = await _open(url)
        try:
            cards = await create_fleet(boss.db, spec)
        finally:
            await boss.close()
        print(f"{args.accounts} accounts, {cards} cards, every step due now")
        return 0

    with _url(args) as url:
        return asyncio.run(run(url))


def cmd_mode(args: argparse.Namespace) -> int:
    async def run(url: str) -> int:
        boss = await _open(url)
        try:
            pipeline = Pipeline(boss, mode_key=MODE_KEY)
            if args.mode:
                await pipeline.config.set(MODE_KEY, args.mode)
            print(f"{MODE_KEY} = {await pipeline.mode()}")
        finally:
            await boss.close()
        return 0

    with _url(args) as url:
        return asyncio.run(run(url))


def poller_settings(args: argparse.Namespace) -> PollerSettings:
    return PollerSettings(
        account_concurrency=args.account_concurrency,
        traffic_interval=timedelta(seconds=args.traffic_interval_s),
        card_status_interval=timedelta(seconds=args.card_status_interval_s),
        real_name_interval=timedelta(seconds=args.real_name_interval_s),
        plan_interval=DEFAULT_PLAN_INTERVAL
        if args.plan_interval_s is None
        else timedelta(seconds=args.plan_interval_s),
    )


def spool_dir(args: argparse.Namespace) -> Path:
    """``--spool-dir``, else ``$SHOAL_POLLING_DATA_DIR/spool``, else under the user's data dir."""
    if args.spool_dir is not None:
        return Path(args.spool_dir)
    data_dir = os.environ.get("SHOAL_POLLING_DATA_DIR")
    if data_dir:
        return Path(data_dir) / "spool"
    import platformdirs

    return Path(platformdirs.user_data_dir("shoal-polling")) / "spool"


def cmd_poll(args: argparse.Namespace) -> int:
    settings = poller_settings(args)

    async def run(url: str) -> int:
        transport = ingest_transport()
        boss = await _open(url, pool_size=args.pool_size, listen=True)
        pipeline = Pipeline(boss, transport(boss), mode_key=MODE_KEY, spool_dir=spool_dir(args))
        await pipeline.start()
        # One plan interval for this poller's schedule and every apply's marker (D8).
        given = None if args.plan_interval_s is None else settings.plan_interval
        plan_interval = await share_plan_interval(pipeline, given)
        ingest = PollingIngest(boss.db, pipeline)
        gateway = GatewayClient(args.gateway)
        metrics = PollerMetrics()
        boss.db.call_times = PoolWaits(metrics)
        poller = Poller(
            boss.db,
            pipeline,
            ingest,
            gateway,
            settings=dataclasses.replace(settings, plan_interval=plan_interval),
            metrics=metrics,
        )
        # Before the endpoint is announced: whoever reads the announcement may
        # stop the poller at once, and it must then stop gracefully.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        server = None
        if args.metrics_port is not None:
            server = metrics.serve(args.metrics_host, args.metrics_port)
            print(
                f"metrics on http://{args.metrics_host}:{server.port}/metrics",
                file=sys.stderr,
                flush=True,
            )
        if args.duration_s:
            loop.call_later(args.duration_s, stop.set)
        accounts = await _count(boss, "SELECT count(*) FROM shoal_polling.account")
        poller.check_budget(accounts, await pipeline.mode())
        try:
            await poller.run(stop)
        finally:
            await gateway.close()
            await pipeline.close()
            await boss.close()
            if server is not None:
                server.close()
        print(json.dumps(asdict(poller.stats)))
        return 0

    with _url(args) as url:
        return asyncio.run(run(url))


async def _count(boss: Shoal, query: str) -> int:
    async def run(conn: AsyncConn) -> int:
        cur = await conn.execute(query)
        row = await cur.fetchone()
        return 0 if row is None else int(row[0])

    return await boss.db.run(run, transaction=False)


def cmd_reconcile(args: argparse.Namespace) -> int:
    if args.settle_s < 0:
        raise SystemExit(f"--settle-s: must not be negative, got {args.settle_s}")

    async def run(url: str) -> int:
        boss = await _open(url)
        try:
            # The database first: whatever it holds was served before the log is read.
            snapshot = await load_snapshot(boss.db)
        finally:
            await boss.close()
        if args.served_log is not None:
            served = read_served_log(args.served_log)
        else:
            gateway = GatewayClient(args.gateway)
            try:
                served = await gateway.served()
            finally:
                await gateway.close()
        cut = None
        if args.settle_s:
            cut = SystemClock().now() - timedelta(seconds=args.settle_s)
        report = compare(snapshot, served, settled_before=cut)
        for line in report.lines():
            print(line)
        if args.metrics_file is not None:
            write_reconciliation(args.metrics_file, report, at=SystemClock().now().timestamp())
        return 0 if report.clean else 1

    with _url(args) as url:
        return asyncio.run(run(url))


EXPERIMENT_COLUMNS = (
    ("polls/s", "polls_per_s"),
    ("observations served", "served"),
    ("SQL timeouts", "sql_timeouts"),
    ("  handed to the topic", "handed_off"),
    ("neither path at first, retried", "resubmitted"),
    ("  of those, spooled to disk", "spooled"),
    ("observations not applied", "not_applied"),
    ("slow statements (> 200 ms)", "slow_statements"),
    ("pool wait p50 ms", "pool_wait_p50_ms"),
    ("pool wait p99 ms", "pool_wait_p99_ms"),
    ("ingest lag p50 ms", "lag_p50_ms"),
    ("ingest lag p99 ms", "lag_p99_ms"),
    ("other work failed", "other_work_failed"),
    ("peak backlog", "max_backlog"),
    ("drained in s", "drain_s"),
    ("reconciliation", "reconciliation"),
)


def experiment_table(rows: list[dict[str, Any]]) -> list[str]:
    """The runs side by side, one line per measure."""
    width = max(len(title) for title, _ in EXPERIMENT_COLUMNS)
    lines = [" " * width + "".join(f"{r['run'] + '/' + r['transport']:>18}" for r in rows)]
    for title, key in EXPERIMENT_COLUMNS:
        lines.append(f"{title:<{width}}" + "".join(f"{r[key]!s:>18}" for r in rows))
    for r in rows:
        lines += [f"{r['run']}: {event}" for event in r["events"]]
    return lines


def cmd_experiment(args: argparse.Namespace) -> int:
    settings = ExperimentSettings(
        duration_s=args.duration_s,
        accounts=args.accounts,
        cards_per_account=args.cards,
        pool_size=args.pool_size,
        consumers=args.consumers,
        other_load=args.other_load,
        deadline_s=args.deadline_s,
        latency_ms=args.latency_ms,
        apply_cost_ms=args.apply_cost_ms,
        step_interval_s=args.step_interval_s,
        nats_url=args.nats_url,
        chaos=not args.no_chaos,
        seed=args.seed,
    )
    with _url(args) as url:
        results = asyncio.run(run_experiment(url, settings))
    rows = as_rows(results)
    if args.json:
        print(json.dumps({"settings": asdict(settings), "results": rows}, indent=2))
    print("\n".join(experiment_table(rows)))
    return 0 if all(r.reconciled for r in results) else 1


DEFAULT_CALLBACK_PORT = 8950


def cmd_action(args: argparse.Namespace) -> int:
    async def run(url: str) -> int:
        from shoal_polling.app import app

        boss = await _open(url)
        try:

            async def account_of(conn: AsyncConn) -> str | None:
                cur = await conn.execute(
                    "SELECT account_id FROM shoal_polling.card WHERE id = %s", (args.card,)
                )
                row = await cur.fetchone()
                return None if row is None else str(row[0])

            account = await boss.db.run(account_of, transaction=False)
            if account is None:
                print(f"no card {args.card!r}", file=sys.stderr)
                return 2
            request = ActionRequest(
                request=args.request or f"{args.action}-{args.card}-{uuid.uuid4().hex[:12]}",
                account=account,
                card=args.card,
                action=args.action,
                gateway=args.gateway,
                callback=args.callback,
                wait_s=args.wait_s,
                poll_interval_s=args.poll_interval_s,
                polls=args.polls,
            )
            workflows = app.workflows(boss)
            started = await workflows.start(CARD_ACTION, request.to_json(), id=request.request)
            print(
                f"run {started.id} of {CARD_ACTION}"
                f" ({'started' if started.created else 'started before'})",
                flush=True,
            )
            if not args.follow_s:
                return 0
            try:
                view = await workflows.wait(started.id, timeout=timedelta(seconds=args.follow_s))
            except DeadlineExceeded as exc:
                print(exc, file=sys.stderr)
                return 1
            print(json.dumps({"status": view.status.value, "result": view.result}))
            if view.error:
                print(view.error.strip().splitlines()[-1], file=sys.stderr)
            return 0 if view.status.value == "completed" else 1
        finally:
            await boss.close()

    with _url(args) as url:
        return asyncio.run(run(url))


def cmd_callbacks(args: argparse.Namespace) -> int:
    async def run(url: str) -> int:
        import uvicorn

        from shoal.api import api_config
        from shoal_polling.app import app
        from shoal_polling.callbacks import CONFIRMATIONS_PATH, build_callback_app

        boss = await _open(url)
        try:
            api = build_callback_app(app.workflows(boss))
            config = api_config(
                api, host=args.host, port=args.port, log_level="warning", access_log=False
            )
            print(
                f"confirmations taken at http://{args.host}:{args.port}{CONFIRMATIONS_PATH}",
                flush=True,
            )
            await uvicorn.Server(config).serve()
        finally:
            await boss.close()
        return 0

    with _url(args) as url:
        return asyncio.run(run(url))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shoal-polling", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--database-url", help="PostgreSQL URL (default: DATABASE_URL, else embedded)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO")
    sub = parser.add_subparsers(dest="command", required=True)

    gateway = sub.add_parser("gateway", help="run the simulated carrier gateway")
    gateway.add_argument("--host", default="127.0.0.1")
    gateway.add_argument("--port", type=int, default=DEFAULT_PORT)
    gateway.add_argument("--seed", type=int, default=1)
    gateway.add_argument("--latency-ms", type=float, default=DEFAULT_LATENCY_MS, help="median")
    gateway.add_argument("--latency-sigma", type=float, default=0.5, help="log-normal spread")
    gateway.add_argument(
        "--latency-range-ms", metavar="LOW-HIGH", help="clip latencies to it, e.g. 50-500"
    )
    gateway.add_argument("--error-rate", type=float, default=0.0, help="share of 503 answers")
    gateway.add_argument(
        "--rate-limit", type=float, default=DEFAULT_RATE_LIMIT, help="per account/s; 0: none"
    )
    gateway.add_argument("--burst", type=float, default=0.0, help="bucket size (default 1 s)")
    gateway.add_argument("--risk-rate", type=float, default=0.0, help="share of risk answers")
    gateway.add_argument("--writable", action="store_true", help="turn the read-only switch off")
    gateway.add_argument("--id-prefix", default="", help="observation id prefix (default s<seed>)")
    gateway.add_argument(
        "--served-log",
        type=Path,
        help="append every answer here (JSON lines); a gateway started on it resumes from it",
    )
    gateway.add_argument(
        "--confirm-after-s",
        type=float,
        default=DEFAULT_CONFIRM_AFTER_S,
        help="how long an operator action stays pending before it is confirmed",
    )
    gateway.add_argument(
        "--never-confirm", action="store_true", help="leave every operator action pending"
    )

    seed = sub.add_parser("seed", help="create the fleet of accounts and cards to poll")
    seed.add_argument("--accounts", type=int, default=3)
    seed.add_argument("--cards", type=int, default=10, help="cards per account")
    seed.add_argument("--quota-kb", type=int, default=DEFAULT_QUOTA_KB)
    seed.add_argument("--stop-percent", type=int, default=100, help="channel threshold")

    mode = sub.add_parser("mode", help=f"read or set {MODE_KEY}")
    mode.add_argument("mode", nargs="?", choices=["sync", "async"])

    poll = sub.add_parser("poll", help="run the poller")
    poll.add_argument("--gateway", default=f"http://127.0.0.1:{DEFAULT_PORT}")
    poll.add_argument("--duration-s", type=float, default=0.0, help="stop after (0: never)")
    poll.add_argument("--pool-size", type=int, default=10)
    poll.add_argument("--account-concurrency", type=int, default=ACCOUNT_CONCURRENCY)
    poll.add_argument(
        "--spool-dir",
        type=Path,
        help="where observations wait while neither the database nor the broker takes them "
        "(default: $SHOAL_POLLING_DATA_DIR/spool, else the user's data dir); one poller each",
    )
    defaults = PollerSettings()
    for step in ("traffic", "card_status", "real_name"):
        poll.add_argument(
            f"--{step.replace('_', '-')}-interval-s",
            type=float,
            default=defaults.interval(step).total_seconds(),
        )
    poll.add_argument(
        "--plan-interval-s",
        type=float,
        default=None,
        help=f"written to {PLAN_INTERVAL_KEY}, which the workers' applies follow too"
        f" (default: that setting, else {DEFAULT_PLAN_INTERVAL.total_seconds():.0f})",
    )
    poll.add_argument(
        "--metrics-port", type=int, help="serve Prometheus metrics on it (0: a free port)"
    )
    poll.add_argument("--metrics-host", default="127.0.0.1", help="the metrics' address")

    rec = sub.add_parser("reconcile", help="served vs recorded vs applied")
    source = rec.add_mutually_exclusive_group()
    source.add_argument("--gateway", default=f"http://127.0.0.1:{DEFAULT_PORT}")
    source.add_argument(
        "--served-log",
        type=Path,
        help="read what was served from this file (a gateway's --served-log), not the gateway",
    )
    rec.add_argument(
        "--settle-s",
        type=float,
        default=0.0,
        help="observations served this recently are still on their way: checked for doubles, "
        "not for being missing (for a reconcile while polling goes on; default 0)",
    )
    rec.add_argument(
        "--metrics-file",
        type=Path,
        help="also write the findings there in Prometheus' text format (a textfile collector's)",
    )

    exp = sub.add_parser(
        "experiment", help="sync vs async under a slow gateway, then a switch run with kills"
    )
    d = ExperimentSettings()
    exp.add_argument("--duration-s", type=float, default=d.duration_s, help="per run")
    exp.add_argument("--accounts", type=int, default=d.accounts)
    exp.add_argument("--cards", type=int, default=d.cards_per_account, help="per account")
    exp.add_argument("--pool-size", type=int, default=d.pool_size)
    exp.add_argument("--consumers", type=int, default=d.consumers, help="async ingest slots")
    exp.add_argument("--other-load", type=int, default=d.other_load)
    exp.add_argument("--deadline-s", type=float, default=d.deadline_s)
    exp.add_argument("--latency-ms", type=float, default=d.latency_ms)
    exp.add_argument("--apply-cost-ms", type=float, default=d.apply_cost_ms)
    exp.add_argument("--step-interval-s", type=float, default=d.step_interval_s)
    exp.add_argument("--seed", type=int, default=d.seed)
    exp.add_argument("--nats-url", help="run sync and async with the topics on this NATS server")
    exp.add_argument(
        "--no-chaos", action="store_true", help="skip the switch run (mode switch and kills)"
    )
    exp.add_argument("--json", action="store_true", help="print settings and results as JSON too")

    action = sub.add_parser(
        "action", help=f"an action on a card, its confirmation awaited ({CARD_ACTION})"
    )
    action.add_argument("action", choices=sorted(ACTIONS))
    action.add_argument("card")
    action.add_argument("--gateway", default=f"http://127.0.0.1:{DEFAULT_PORT}")
    action.add_argument(
        "--callback",
        help="where the gateway posts the confirmation (a `shoal-polling callbacks`, e.g. "
        f"http://127.0.0.1:{DEFAULT_CALLBACK_PORT}/v1/confirmations); without it, polls only",
    )
    action.add_argument("--request", help="the request's id, also the run's (default: a new one)")
    action.add_argument(
        "--wait-s",
        type=float,
        default=DEFAULT_WAIT.total_seconds(),
        help="how long to wait for the callback before polling the gateway",
    )
    action.add_argument(
        "--poll-interval-s", type=float, default=DEFAULT_POLL_INTERVAL.total_seconds()
    )
    action.add_argument(
        "--polls", type=int, default=DEFAULT_POLLS, help="status polls before the run fails"
    )
    action.add_argument(
        "--follow-s",
        type=float,
        default=0.0,
        help="wait up to this long for the run to end and print it (exit 1 unless completed)",
    )

    callbacks = sub.add_parser("callbacks", help="take the gateway's confirmations (callbacks)")
    callbacks.add_argument("--host", default="127.0.0.1")
    callbacks.add_argument("--port", type=int, default=DEFAULT_CALLBACK_PORT)
    return parser


COMMANDS = {
    "action": cmd_action,
    "callbacks": cmd_callbacks,
    "experiment": cmd_experiment,
    "gateway": cmd_gateway,
    "seed": cmd_seed,
    "mode": cmd_mode,
    "poll": cmd_poll,
    "reconcile": cmd_reconcile,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return COMMANDS[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
