"""The commands that run shoal: ``migrate``, ``worker``, ``api`` and ``demo``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
from datetime import timedelta
from typing import TYPE_CHECKING

from rich.console import Console

# The modules of the subcommands are imported by the commands that use them, so
# `shoal --help` and `shoal migrate` load neither the HTTP API nor the ingest
# supervisor, and a missing extra is an error of the one command that needs it.
from shoal.api.defaults import (
    DEFAULT_HEADER_TIMEOUT_S,
)
from shoal.cli.common import (
    announce,
    connect,
    console,
    ingest_transport,
    load_app,
    prepare_threshold,
)
from shoal.db.pool import DEFAULT_POOL_SIZE
from shoal.errors import InvalidInput, MissingExtra

if TYPE_CHECKING:
    from shoal.app import App
    from shoal.metrics import WorkerMetrics


async def cmd_migrate(args: argparse.Namespace, url: str) -> int:
    from shoal.db.migrate import migrate
    from shoal.db.pool import Database

    async with Database(url, schema=args.schema, prepare_threshold=prepare_threshold()) as db:
        applied = await migrate(db, lock_wait=timedelta(seconds=args.lock_wait), tries=args.tries)
    console.print(f"schema {args.schema!r}: " + (f"applied {applied}" if applied else "up to date"))
    return 0


def worker_pool_size(args: argparse.Namespace, app: App) -> int:
    """``--pool-size``, else the default pool, grown to fit the app's consumers and sinks
    beside the reserve (so a worker's defaults pass its own connection budget check)."""
    from shoal.ingest.pipeline import pool_size_for
    from shoal.ingest.supervisor import consumer_slots, sink_writers

    if args.pool_size is not None:
        return int(args.pool_size)
    need = consumer_slots(app.consumers) + sink_writers(app.sinks)
    if not need:
        return DEFAULT_POOL_SIZE
    return max(
        DEFAULT_POOL_SIZE, pool_size_for(need, reserve=app.ingest_settings.connection_reserve)
    )


def metrics_class() -> type[WorkerMetrics]:
    """:class:`~shoal.metrics.WorkerMetrics`, or one line naming the extra to install."""
    try:
        from shoal.metrics import WorkerMetrics
    except ImportError as exc:
        if not (exc.name or "").startswith("prometheus_client"):
            raise
        raise MissingExtra("shoal worker --metrics-port", "metrics") from None
    return WorkerMetrics


def serve_metrics(args: argparse.Namespace) -> WorkerMetrics | None:
    """With ``--metrics-port``, the process's metrics, already served on it."""
    if args.metrics_port is None:
        return None
    metrics = metrics_class()()
    try:
        port = metrics.serve(args.metrics_host, args.metrics_port)
    except OSError as exc:
        raise InvalidInput(
            "--metrics-port",
            f"cannot serve metrics on {args.metrics_host}:{args.metrics_port}: "
            f"{exc.strerror or exc}",
        ) from None
    logging.getLogger("shoal.metrics").info(
        "metrics on http://%s:%d/metrics", args.metrics_host, port
    )
    return metrics


async def cmd_worker(args: argparse.Namespace, url: str) -> int:
    app = load_app(args.app)
    transport = ingest_transport()
    metrics = serve_metrics(args)
    try:
        boss = await connect(
            args,
            url,
            max_size=worker_pool_size(args, app),
            write_stall_after=timedelta(seconds=args.write_stall_after),
            rescue_after=timedelta(seconds=args.rescue_after),
        )
        if metrics is not None:
            metrics.attach(boss)
        stop = asyncio.Event()
        hurry = asyncio.Event()

        def on_signal() -> None:
            # The first signal stops gracefully; a second one stops at once.
            if stop.is_set():
                hurry.set()
            stop.set()

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        try:
            await app.run(
                boss,
                stop=stop,
                hurry=hurry,
                grace=timedelta(seconds=args.grace),
                transport=transport,
                queues=args.queues,
                exclude_queues=args.exclude_queues or (),
                maintenance=not args.no_maintenance,
                scheduler=not args.no_scheduler,
                aggregator=not args.no_aggregator,
            )
        finally:
            await boss.close()
    finally:
        if metrics is not None:
            metrics.close()
    return 0


def api_token(args: argparse.Namespace) -> str | None:
    """``--token``, else ``SHOAL_API_TOKEN``; refuses a blank one, and a non-loopback
    bind without one."""
    from shoal.api.auth import TOKEN_ENV, is_loopback

    token = args.token or os.environ.get(TOKEN_ENV) or None
    if token is not None and not token.strip():
        # Almost surely a slip (a quoted blank, an unexpanded variable): no
        # client can send it, and it must not pass for "a token is set".
        raise InvalidInput(
            "--token" if args.token else TOKEN_ENV,
            "the bearer token is only whitespace; set a real one (openssl rand -hex 32), "
            "or leave it unset on a loopback bind",
        )
    if token is None and not is_loopback(args.host):
        raise InvalidInput(
            "--host",
            f"refusing to serve on {args.host!r} without a token: anyone who can reach it could "
            f"create and cancel tasks. Set {TOKEN_ENV} (or --token), or bind to 127.0.0.1.",
        )
    return token


async def cmd_api(args: argparse.Namespace, url: str) -> int:
    from shoal.api.server import listen_socket

    token = api_token(args)
    app = load_app(args.app)
    # Bound before anything else: a port that is taken is one error line, with
    # no "serving on" said first and no database connected for nothing.
    sock = listen_socket(args.host, args.port)
    try:
        return await _serve_api(args, url, app, token, sock)
    finally:
        sock.close()


async def _serve_api(
    args: argparse.Namespace, url: str, app: App, token: str | None, sock: socket.socket
) -> int:
    import uvicorn

    from shoal.api import create_api
    from shoal.api.console import LazyTransport
    from shoal.api.server import api_config, quiet_console_reads

    boss = await connect(args, url, max_size=args.pool_size, listen=False)
    limits = {
        "max_body_bytes": args.max_body_bytes,
        "request_deadline_s": args.request_deadline,
    }
    # Topic redrives publish on the workers' transport, connected on first use.
    make_transport = app.ingest_settings.transport or ingest_transport()
    transport = LazyTransport(lambda: make_transport(boss))
    api = create_api(
        boss,
        app.batches(boss),
        token=token,
        read_only=args.read_only,
        transport=transport,
        allowed_hosts=args.allowed_hosts,
        workflows=app.workflows(boss),
        **{name: value for name, value in limits.items() if value is not None},
    )
    for hook in app.api_hooks:
        await hook(api, boss, token)
    server = uvicorn.Server(
        api_config(
            api,
            host=args.host,
            port=args.port,
            log_level="debug" if args.verbose else args.log_level.lower(),
            # uvicorn's loggers go through the root's handler: JSON lines, or
            # text lines with their time (uvicorn's own format has none).
            log_config=None,
            access_log=args.access_log,
            lifespan="off",
            server_header=False,
            header_timeout_s=(
                DEFAULT_HEADER_TIMEOUT_S if args.header_timeout is None else args.header_timeout
            ),
        )
    )
    quiet_console_reads()
    port = sock.getsockname()[1]  # the port given, or the one taken for port 0
    host = f"[{args.host}]" if ":" in args.host else args.host
    announce(
        args,
        f"shoal API and console on http://{host}:{port}/"
        + (" (bearer token required)" if token else "")
        + (" read-only" if args.read_only else ""),
    )
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal
    # to the handler it found; a no-op one lets the pool (and an embedded
    # server started here) close normally instead of dying mid-cleanup.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        await server.serve(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        await transport.close()
        await boss.close()
    return 0


async def cmd_demo(args: argparse.Namespace, url: str) -> int:
    from shoal.demo import run_demo

    return await run_demo(
        url,
        schema=args.schema,
        items=args.items,
        console=Console(),
        port=args.port,
        stay=args.stay,
    )
