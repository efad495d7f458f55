"""``shoal-polling``: the card polling reference app's command line. The environment is read here.

    shoal-polling gateway [--port 8900] [--seed 1] [--latency-ms 20] [--error-rate 0] ...
    shoal-polling seed [--accounts 3] [--cards 10]      the fleet to poll
    shoal-polling poll --gateway URL [--rounds N]       the poller (sync or async per the switch)
    shoal-polling mode [sync|async]                     read or set polling.ingest.mode
    shoal-polling reconcile --gateway URL               served vs recorded vs applied
    shoal-polling experiment                            sync vs async under a slow gateway

The ingest side runs as ``shoal worker --app shoal_polling.app:app``. The
database is ``--database-url``, else ``DATABASE_URL``, else shoal's embedded
PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from shoal_polling.gateway import (
    DEFAULT_LATENCY_MS,
    DEFAULT_PORT,
    DEFAULT_RATE_LIMIT,
    Gateway,
    GatewaySettings,
    build_gateway_app,
)


async def serve_gateway(settings: GatewaySettings, *, host: str, port: int) -> None:
    import uvicorn

    app = build_gateway_app(Gateway(settings))
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    await uvicorn.Server(config).serve()


def cmd_gateway(args: argparse.Namespace) -> int:
    settings = GatewaySettings(
        seed=args.seed,
        latency_ms=args.latency_ms,
        latency_sigma=args.latency_sigma,
        error_rate=args.error_rate,
        rate_limit=args.rate_limit,
        burst=args.burst,
        read_only=not args.writable,
        risk_rate=args.risk_rate,
        id_prefix=args.id_prefix,
        served_log=args.served_log,
    )
    print(f"simulated gateway on http://{args.host}:{args.port} (seed {args.seed})", flush=True)
    asyncio.run(serve_gateway(settings, host=args.host, port=args.port))
    return 0


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
    gateway.add_argument("--error-rate", type=float, default=0.0, help="share of 503 answers")
    gateway.add_argument(
        "--rate-limit", type=float, default=DEFAULT_RATE_LIMIT, help="per account/s; 0: none"
    )
    gateway.add_argument("--burst", type=float, default=0.0, help="bucket size (default 1 s)")
    gateway.add_argument("--risk-rate", type=float, default=0.0, help="share of risk answers")
    gateway.add_argument("--writable", action="store_true", help="turn the read-only switch off")
    gateway.add_argument("--id-prefix", default="", help="observation id prefix (default s<seed>)")
    gateway.add_argument("--served-log", type=Path, help="append every answer here (JSON lines)")
    return parser


COMMANDS = {"gateway": cmd_gateway}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return COMMANDS[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
