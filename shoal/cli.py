"""``shoal``: the command line. Environment variables are read here and nowhere deeper.

    shoal migrate                     create or upgrade the schema
    shoal worker --app module:attr    run an App's handlers, schedules and maintenance
    shoal api --app module:attr       serve the HTTP API and dashboard for an App's batch kinds
    shoal status                      queue depths as a table
    shoal queue pause|resume NAME     stop or restart claiming from a queue, everywhere
    shoal queue redrive DLQ           send dead-lettered jobs back to their queues
    shoal demo                        the end-to-end demo

The database is ``--database-url``, else ``DATABASE_URL``, else an embedded
PostgreSQL in ``SHOAL_DATA_DIR`` (default: under the user's data directory),
started on demand and stopped on exit by the process that started it.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from rich.console import Console
from rich.table import Table

from shoal.app import App
from shoal.db.embedded import EmbeddedPostgres, default_data_dir
from shoal.db.migrate import migrate
from shoal.db.pool import Database
from shoal.errors import InvalidInput, ShoalError
from shoal.ingest.store import IngestStore, TopicState
from shoal.queue.client import Shoal
from shoal.queue.states import JobState

EMBEDDED_DATABASE = "shoal"
console = Console(stderr=True)


@contextmanager
def database_url(args: argparse.Namespace) -> Iterator[str]:
    """The URL to use; starts (and afterwards stops) the embedded server when none is given."""
    url = args.database_url or os.environ.get("DATABASE_URL")
    if url:
        yield url
        return
    data_dir = Path(os.environ.get("SHOAL_DATA_DIR") or default_data_dir())
    server = EmbeddedPostgres(data_dir)
    if not server.is_running():
        console.print(f"[dim]starting embedded PostgreSQL in {data_dir}[/dim]")
    server.start()
    try:
        yield server.ensure_database(EMBEDDED_DATABASE)
    finally:
        if server.started_here and server.stop_if_unused():
            console.print("[dim]embedded PostgreSQL stopped[/dim]")


def load_app(spec: str) -> App:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"--app must look like module:attribute, got {spec!r}")
    sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise SystemExit(f"{spec} is not a shoal.App (got {type(app).__name__})")
    return app


async def _connect(args: argparse.Namespace, url: str, **kwargs: object) -> Shoal:
    return await Shoal.connect(url, schema=args.schema, **kwargs)  # type: ignore[arg-type]  # kwargs are Shoal.connect's own


async def cmd_migrate(args: argparse.Namespace, url: str) -> int:
    async with Database(url, schema=args.schema) as db:
        applied = await migrate(db)
    console.print(f"schema {args.schema!r}: " + (f"applied {applied}" if applied else "up to date"))
    return 0


async def cmd_worker(args: argparse.Namespace, url: str) -> int:
    app = load_app(args.app)
    boss = await _connect(args, url, max_size=args.pool_size)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await app.run(boss, stop=stop, grace=timedelta(seconds=args.grace))
    finally:
        await boss.close()
    return 0


def api_token(args: argparse.Namespace) -> str | None:
    """``--token``, else ``SHOAL_API_TOKEN``; refuses a non-loopback bind without one."""
    from shoal.api.auth import TOKEN_ENV, is_loopback

    token = args.token or os.environ.get(TOKEN_ENV) or None
    if token is None and not is_loopback(args.host):
        raise SystemExit(
            f"refusing to serve on {args.host!r} without a token: anyone who can reach it could "
            f"create and cancel tasks. Set {TOKEN_ENV} (or --token), or bind to 127.0.0.1."
        )
    return token


async def cmd_api(args: argparse.Namespace, url: str) -> int:
    import uvicorn

    from shoal.api import create_api

    token = api_token(args)
    app = load_app(args.app)
    boss = await _connect(args, url, max_size=args.pool_size, listen=False)
    limits = {
        "max_body_bytes": args.max_body_bytes,
        "request_deadline_s": args.request_deadline,
    }
    api = create_api(
        boss,
        app.batches(boss),
        token=token,
        **{name: value for name, value in limits.items() if value is not None},
    )
    for hook in app.api_hooks:
        await hook(api, boss, token)
    server = uvicorn.Server(
        uvicorn.Config(
            api,
            host=args.host,
            port=args.port,
            log_level="debug" if args.verbose else "info",
            lifespan="off",
            server_header=False,
        )
    )
    console.print(
        f"shoal API and dashboard on http://{args.host}:{args.port}/"
        + (" (bearer token required)" if token else "")
    )
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal
    # to the handler it found; a no-op one lets the pool (and an embedded
    # server started here) close normally instead of dying mid-cleanup.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        await server.serve()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        await boss.close()
    return 0


async def cmd_status(args: argparse.Namespace, url: str) -> int:
    boss = await _connect(args, url, listen=False)
    try:
        rows = await boss.stats()
        paused = set(await boss.paused_queues())
        topics = await IngestStore(boss.db).topic_states()
    finally:
        await boss.close()
    states = list(JobState)
    table = Table(title=f"shoal queues (schema {args.schema})")
    table.add_column("queue")
    for state in states:
        table.add_column(state.value, justify="right")
    table.add_column("oldest waiting", justify="right")
    table.add_column("paused")
    by_queue: dict[str, dict[JobState, int]] = {}
    oldest: dict[str, timedelta] = {}
    for row in rows:
        by_queue.setdefault(row.queue, {})[row.state] = row.count
        if row.oldest_waiting is not None:
            oldest[row.queue] = max(oldest.get(row.queue, timedelta(0)), row.oldest_waiting)
    for queue in sorted(by_queue.keys() | paused):
        counts = by_queue.get(queue, {})
        age = oldest.get(queue)
        table.add_row(
            queue,
            *(str(counts.get(state, 0)) for state in states),
            "-" if age is None else f"{age.total_seconds():.1f}s",
            "[yellow]paused[/yellow]" if queue in paused else "",
        )
    Console(width=max(120, Console().width)).print(table)
    if topics:
        print_topics(topics)
    return 0


def print_topics(topics: list[TopicState]) -> None:
    table = Table(title="ingest topics (as the backlog monitor last saw them)")
    for column in ("topic", "depth", "ready", "in flight", "delayed", "oldest", "wait", "paused"):
        table.add_column(column, justify="left" if column == "topic" else "right")
    for t in topics:
        table.add_row(
            t.topic,
            str(t.depth),
            str(t.ready),
            str(t.in_flight),
            str(t.delayed),
            "-" if t.oldest_age_s is None else f"{t.oldest_age_s:.1f}s",
            "-" if t.wait_s is None else f"{t.wait_s:.1f}s",
            "[yellow]paused[/yellow]" if t.paused else "",
        )
    Console(width=max(120, Console().width)).print(table)


async def cmd_queue(args: argparse.Namespace, url: str) -> int:
    boss = await _connect(args, url, listen=False)
    try:
        if args.action == "pause":
            await boss.pause_queue(args.name)
            console.print(f"queue {args.name!r} paused in every process")
        elif args.action == "resume":
            await boss.resume_queue(args.name)
            console.print(f"queue {args.name!r} resumed")
        else:
            moved = await boss.redrive(args.name)
            console.print(f"redrove {len(moved)} job(s) from {args.name!r}")
    finally:
        await boss.close()
    return 0


async def cmd_topic(args: argparse.Namespace, url: str) -> int:
    from shoal.ingest.pipeline import Pipeline
    from shoal.ingest.runner import transport_from_env

    boss = await _connect(args, url, listen=False)
    pipeline = Pipeline(boss, transport_from_env(boss))
    try:
        if args.action == "redrive":
            await pipeline.start()
            moved = await pipeline.redrive(args.topic, limit=args.limit)
            console.print(f"published {moved} dead letter(s) of {args.topic!r} again")
        else:
            letters = await pipeline.store.dead_letters(args.topic, limit=args.limit)
            table = Table(title=f"dead letters of {args.topic!r} waiting for a redrive")
            for column in ("id", "message", "reason", "attempt", "dead at", "error"):
                table.add_column(column)
            for letter in letters:
                table.add_row(
                    str(letter.id),
                    letter.message_id,
                    letter.reason,
                    str(letter.attempt),
                    letter.dead_at.isoformat(timespec="seconds"),
                    letter.error[:120],
                )
            Console(width=max(120, Console().width)).print(table)
    finally:
        await pipeline.close()
        await boss.close()
    return 0


async def cmd_config(args: argparse.Namespace, url: str) -> int:
    from shoal.ingest.config import RuntimeConfig
    from shoal.ingest.store import IngestStore

    boss = await _connect(args, url, listen=False)
    config = RuntimeConfig(IngestStore(boss.db))
    try:
        if args.action == "set":
            if args.value is None:
                raise InvalidInput("value", "config set needs a KEY and a VALUE")
            try:
                value = json.loads(args.value)
            except ValueError:
                value = args.value  # a bare word: the string itself
            await config.set(args.key, value)
            console.print(f"{args.key} = {json.dumps(value)} (every process within 5 s)")
        elif args.action == "get":
            console.print(json.dumps(await config.get(args.key)))
        else:
            for key, value, at in await config.store.config_all():
                console.print(f"{key} = {json.dumps(value)}  [dim](set {at.isoformat()})[/dim]")
    finally:
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


COMMANDS = {
    "migrate": cmd_migrate,
    "worker": cmd_worker,
    "api": cmd_api,
    "status": cmd_status,
    "queue": cmd_queue,
    "topic": cmd_topic,
    "config": cmd_config,
    "demo": cmd_demo,
}


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="shoal", description="Postgres-native background work.")
    root.add_argument("--database-url", help="default: $DATABASE_URL, else embedded PostgreSQL")
    root.add_argument("--schema", default=os.environ.get("SHOAL_SCHEMA", "shoal"))
    root.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = root.add_subparsers(dest="command", required=True)
    sub.add_parser("migrate", help="create or upgrade the schema")
    worker = sub.add_parser("worker", help="run an App's handlers until SIGTERM/SIGINT")
    worker.add_argument("--app", required=True, help="module:attribute of a shoal.App")
    worker.add_argument("--grace", type=float, default=30.0, help="seconds to finish running jobs")
    worker.add_argument("--pool-size", type=int, default=10, help="database connections")
    api = sub.add_parser("api", help="serve the HTTP API and dashboard until SIGTERM/SIGINT")
    api.add_argument("--app", required=True, help="module:attribute of a shoal.App")
    api.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    api.add_argument("--port", type=int, default=8000)
    api.add_argument("--token", help="bearer token (prefer $SHOAL_API_TOKEN: arguments show in ps)")
    api.add_argument("--pool-size", type=int, default=10, help="database connections")
    api.add_argument("--max-body-bytes", type=int, help="request body cap (default 16 MiB)")
    api.add_argument(
        "--request-deadline", type=float, help="seconds to receive a request body (default 30)"
    )
    sub.add_parser("status", help="queue depths as a table")
    queue = sub.add_parser("queue", help="control a queue")
    queue.add_argument("action", choices=["pause", "resume", "redrive"])
    queue.add_argument("name")
    topic = sub.add_parser("topic", help="an ingest topic's dead letters")
    topic.add_argument("action", choices=["dead", "redrive"])
    topic.add_argument("topic")
    topic.add_argument("--limit", type=int, default=10_000)
    config = sub.add_parser("config", help="run-time switches, e.g. ingest.mode sync|async")
    config.add_argument("action", choices=["get", "set", "list"])
    config.add_argument("key", nargs="?", default="ingest.mode")
    config.add_argument("value", nargs="?")
    demo = sub.add_parser("demo", help="run the end-to-end demo")
    demo.add_argument("--items", type=int, default=300, help="items in the demo task")
    demo.add_argument("--port", type=int, default=8000, help="port of the dashboard")
    demo.add_argument(
        "--stay", action="store_true", help="keep serving the dashboard after the task closes"
    )
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s",
    )
    logging.getLogger("psycopg.pool").setLevel(logging.WARNING)
    if args.command == "demo" and not args.verbose:
        # The demo's own output tells the story; expected failures need not shout.
        logging.getLogger("shoal").setLevel(logging.ERROR)
    command = COMMANDS[args.command]
    if args.command == "api":
        api_token(args)  # refuse an open non-loopback bind before starting anything
    try:
        with database_url(args) as url:
            return asyncio.run(command(args, url))
    except ShoalError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
