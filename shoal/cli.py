"""``shoal``: the command line. Environment variables are read here and nowhere deeper.

    shoal migrate                     create or upgrade the schema
    shoal worker --app module:attr    run an App's handlers, schedules and maintenance
    shoal api --app module:attr       serve the HTTP API and dashboard for an App's batch kinds
    shoal status                      queue depths as a table
    shoal queue pause|resume NAME     stop or restart claiming from a queue, everywhere
    shoal queue redrive DLQ           send dead-lettered jobs back to their queues
    shoal jobs [--queue Q] [--state S] list jobs, failed first; shoal job ID shows one
    shoal job retry|cancel|rm ID      act on one job
    shoal schedule list|pause|resume|rm [NAME]
    shoal workers                     the worker processes and their heartbeats
    shoal topic dead|redrive TOPIC    an ingest topic's dead letters
    shoal config get|set|list [KEY]   run-time switches, with their defaults
    shoal tasks [--kind K] [--status S] list batch tasks; shoal task ID shows one
    shoal task cancel|retry-failed ID act on one batch task
    shoal demo                        the end-to-end demo

Every command but ``migrate``, ``worker``, ``api`` and ``demo`` creates
nothing: on a database without shoal's schema (or with migrations pending)
it says so and exits 2.

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
import math
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rich.console import Console
from rich.markup import escape
from rich.table import Table

import shoal

# The modules of the subcommands are imported by the commands that use them, so
# `shoal --help` and `shoal migrate` load neither the HTTP API nor the ingest
# supervisor, and a missing extra is an error of the one command that needs it.
from shoal.api.defaults import (
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_REQUEST_DEADLINE_S,
)
from shoal.api.hosts import ALLOWED_HOSTS_ENV, allowed_host_names
from shoal.db.migrate import DEFAULT_LOCK_TRIES, DEFAULT_LOCK_WAIT
from shoal.db.pool import DEFAULT_POOL_SIZE, DEFAULT_SCHEMA, check_schema_name
from shoal.db.writes import STALL_ERROR_AFTER
from shoal.errors import InvalidInput, MissingExtra, ShoalError
from shoal.extras import require
from shoal.logs import LOG_FORMATS
from shoal.logs import configure as configure_logging
from shoal.queue.registry import DEFAULT_RESCUE_AFTER, MIN_RESCUE_AFTER

if TYPE_CHECKING:
    from shoal.app import App
    from shoal.ingest.store import TopicState
    from shoal.ingest.supervisor import TransportFactory
    from shoal.metrics import WorkerMetrics
    from shoal.queue.client import Shoal
    from shoal.queue.rows import QueueStateCount

EMBEDDED_DATABASE = "shoal"
# Status lines and errors, never hard-wrapped: a piped or logged line stays one
# line whatever its length (a terminal still folds it for the eye).
console = Console(stderr=True, soft_wrap=True)


def announce(args: argparse.Namespace, text: str, *, dim: bool = False) -> None:
    """Tell the operator ``text``: a log record in JSON mode (every line stays JSON),
    else a line on the console."""
    if getattr(args, "log_format", DEFAULT_LOG_FORMAT) == "json":
        logging.getLogger("shoal.cli").info(text)
    else:
        console.print(f"[dim]{escape(text)}[/dim]" if dim else escape(text))


@contextmanager
def database_url(args: argparse.Namespace) -> Iterator[str]:
    """The URL to use; starts (and afterwards stops) the embedded server when none is given."""
    url = args.database_url or os.environ.get("DATABASE_URL")
    if url:
        yield url
        return
    from shoal.db.embedded import EmbeddedPostgres, default_data_dir

    require(
        "embedded",
        "an embedded PostgreSQL (used when neither --database-url nor DATABASE_URL is set)",
    )
    data_dir = Path(os.environ.get("SHOAL_DATA_DIR") or default_data_dir())
    server = EmbeddedPostgres(data_dir)
    if not server.is_running():
        announce(args, f"starting embedded PostgreSQL in {data_dir}", dim=True)
    server.start()
    try:
        yield server.ensure_database(EMBEDDED_DATABASE)
    finally:
        if server.started_here and server.stop_if_unused():
            announce(args, "embedded PostgreSQL stopped", dim=True)


TRANSPORT_ENV = "SHOAL_INGEST_TRANSPORT"


def ingest_transport() -> TransportFactory:
    """The ingest transport the environment names (``worker``, ``topic``; docs/cli.md).

    ``SHOAL_INGEST_TRANSPORT``: ``postgres`` (the default) or ``nats``, on
    ``SHOAL_NATS_URL`` with ``SHOAL_NATS_MONITOR_URL`` for its durability check
    (each a comma-separated list for a cluster) and ``SHOAL_NATS_REPLICAS``.
    """
    from shoal.ingest.supervisor import DEFAULT_NATS_URL, transport_factory

    kind = os.environ.get(TRANSPORT_ENV, "").strip() or "postgres"
    replicas_text = os.environ.get("SHOAL_NATS_REPLICAS", "").strip() or "1"
    try:
        replicas = int(replicas_text)
    except ValueError:
        replicas = 0
    if replicas < 1:
        raise InvalidInput(
            "SHOAL_NATS_REPLICAS", f"must be a whole number >= 1, got {replicas_text!r}"
        )
    try:
        return transport_factory(
            kind,
            nats_url=os.environ.get("SHOAL_NATS_URL", "").strip() or DEFAULT_NATS_URL,
            nats_monitor_url=os.environ.get("SHOAL_NATS_MONITOR_URL", "").strip() or None,
            nats_replicas=replicas,
        )
    except InvalidInput:
        raise InvalidInput(TRANSPORT_ENV, f"must be postgres or nats, got {kind!r}") from None


def load_app(spec: str) -> App:
    """The App that ``--app module:attribute`` names, imported from the working directory.

    A module or attribute that is not there is one line naming it; an error
    raised while the module itself runs (a missing dependency of its own) keeps
    its traceback, since it is a bug in that module, not in ``--app``.
    """
    from shoal.app import App

    field = f"--app {spec}"
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise InvalidInput(field, "expected the form module:attribute, e.g. myproject.tasks:app")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing != module_name and not module_name.startswith(f"{missing}."):
            raise  # the module was found and failed to import something of its own
        raise InvalidInput(field, f"no module named {missing!r}") from None
    app: object = module
    owner = f"module {module_name!r}"
    for name in attr.split("."):
        if not hasattr(app, name):
            raise InvalidInput(field, f"{owner} has no attribute {name!r}")
        app = getattr(app, name)
        owner = f"{type(app).__name__} {name!r}"
    if not isinstance(app, App):
        raise InvalidInput(field, f"is not a shoal.App (it is of type {type(app).__name__})")
    if app.name is None:
        app.name = spec  # the owner of the schedules it declares
    return app


PREPARE_ENV = "SHOAL_PREPARE_THRESHOLD"


def prepare_threshold() -> int | None:
    """``SHOAL_PREPARE_THRESHOLD``: ``off`` (behind PgBouncer in transaction mode before
    1.21, docs/deploying.md) or how many runs of a statement prepare it (psycopg's 5)."""
    from shoal.db.pool import DEFAULT_PREPARE_THRESHOLD

    text = os.environ.get(PREPARE_ENV, "").strip()
    if not text:
        return DEFAULT_PREPARE_THRESHOLD
    if text.lower() == "off":
        return None
    if not text.isdigit():
        raise InvalidInput(PREPARE_ENV, f"must be 'off' or a whole number >= 0, got {text!r}")
    return int(text)


async def _connect(args: argparse.Namespace, url: str, **kwargs: object) -> Shoal:
    """A client on the schema, migrated first (``worker`` and ``api``: docs/cli.md)."""
    from shoal.queue.client import Shoal

    kwargs.setdefault("prepare_threshold", prepare_threshold())
    return await Shoal.connect(url, schema=args.schema, **kwargs)  # type: ignore[arg-type]  # kwargs are Shoal.connect's own


async def _connect_existing(args: argparse.Namespace, url: str) -> Shoal:
    """A client on a schema that is there and up to date; creates nothing.

    Every command but ``migrate``, ``worker``, ``api`` and ``demo``: pointed at
    the wrong database, it says so (``no shoal schema in mydb (run shoal
    migrate)``) instead of creating shoal's tables there.
    """
    from shoal.db.migrate import require_migrated

    boss = await _connect(args, url, listen=False, run_migrations=False)
    try:
        await require_migrated(boss.db)
    except BaseException:
        await boss.close()
        raise
    return boss


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
        boss = await _connect(
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
    import uvicorn

    from shoal.api import create_api
    from shoal.api.console import LazyTransport
    from shoal.api.server import api_config

    token = api_token(args)
    app = load_app(args.app)
    boss = await _connect(args, url, max_size=args.pool_size, listen=False)
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
            # JSON lines: uvicorn's loggers then go through the root's JSON handler.
            **({"log_config": None} if args.log_format == "json" else {}),
            lifespan="off",
            server_header=False,
            header_timeout_s=(
                DEFAULT_HEADER_TIMEOUT_S if args.header_timeout is None else args.header_timeout
            ),
        )
    )
    announce(
        args,
        f"shoal API and console on http://{args.host}:{args.port}/"
        + (" (bearer token required)" if token else "")
        + (" read-only" if args.read_only else ""),
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
        await transport.close()
        await boss.close()
    return 0


async def cmd_status(args: argparse.Namespace, url: str) -> int:
    from shoal.ingest.store import IngestStore

    boss = await _connect_existing(args, url)
    try:
        while True:
            rows = await boss.stats()
            paused = set(await boss.paused_queues())
            topics = await IngestStore(boss.db).topic_states()
            if args.watch:
                Console().clear()
            print_status(args, rows, paused, topics)
            if not args.watch:
                return 0
            await asyncio.sleep(args.watch)  # until Ctrl-C
    finally:
        await boss.close()


def print_status(
    args: argparse.Namespace,
    rows: list[QueueStateCount],
    paused: set[str],
    topics: list[TopicState],
) -> None:
    from shoal.queue.states import JobState

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
    from shoal.queue.inspect import QueueInspector

    boss = await _connect_existing(args, url)
    try:
        # An unknown name is refused (listing the known ones), never created.
        inspector = QueueInspector(boss)
        await inspector.require_queue(args.name, "NAME")
        if args.action == "pause":
            await inspector.pause_queue(args.name)
            console.print(f"queue {args.name!r} paused in every process")
        elif args.action == "resume":
            await inspector.resume_queue(args.name)
            console.print(f"queue {args.name!r} resumed")
        else:
            moved = await boss.redrive(args.name)
            console.print(f"redrove {len(moved)} job(s) from {args.name!r}")
    finally:
        await boss.close()
    return 0


async def cmd_topic(args: argparse.Namespace, url: str) -> int:
    from shoal.ingest.inspect import TopicInspector
    from shoal.ingest.pipeline import Pipeline

    transport = ingest_transport()
    boss = await _connect_existing(args, url)
    try:
        # An unknown topic is refused (listing the known ones), as `queue` does:
        # an empty table or "published 0" would read as "nothing dead there".
        await TopicInspector(boss).require_topic(args.topic, "TOPIC")
    except BaseException:
        await boss.close()
        raise
    pipeline = Pipeline(boss, transport(boss))
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
    from shoal.ingest.config import RuntimeConfig, check_key_exists
    from shoal.ingest.store import IngestStore

    boss = await _connect_existing(args, url)
    config = RuntimeConfig(IngestStore(boss.db))
    try:
        if args.action == "set":
            if args.value is None:
                raise InvalidInput("value", "config set needs a KEY and a VALUE")
            if not args.new:
                stored = [key for key, _, _ in await config.store.config_all()]
                check_key_exists(args.key, stored)
            try:
                value = json.loads(args.value)
            except ValueError:
                value = args.value  # a bare word: the string itself
            await config.set(args.key, value)
            console.print(f"{args.key} = {json.dumps(value)} (every process within 5 s)")
        elif args.action == "get":
            # What processes use: the stored value, else the default (stdout, for scripts).
            print(json.dumps((await config.entry(args.key)).value))
        else:
            out = Console(soft_wrap=True)
            for entry in await config.entries():
                source = "default" if entry.set_at is None else f"set {entry.set_at.isoformat()}"
                out.print(f"{escape(entry.key)} = {escape(json.dumps(entry.value))}  ({source})")
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


COMMANDS: dict[str, Callable[[argparse.Namespace, str], Coroutine[Any, Any, int]]] = {
    "migrate": cmd_migrate,
    "worker": cmd_worker,
    "api": cmd_api,
    "status": cmd_status,
    "queue": cmd_queue,
    "topic": cmd_topic,
    "config": cmd_config,
    "demo": cmd_demo,
}


def _client_command(
    run_with: Callable[[argparse.Namespace, Shoal], Awaitable[int]],
) -> Callable[[argparse.Namespace, str], Coroutine[Any, Any, int]]:
    """A command of shoal.cli_console or shoal.cli_tasks, on a client of an existing schema."""

    async def run(args: argparse.Namespace, url: str) -> int:
        boss = await _connect_existing(args, url)
        try:
            return await run_with(args, boss)
        finally:
            await boss.close()

    return run


def _add_client_commands() -> None:
    from shoal.cli_console import COMMANDS as CONSOLE_COMMANDS
    from shoal.cli_tasks import COMMANDS as TASK_COMMANDS

    for name, run_with in {**CONSOLE_COMMANDS, **TASK_COMMANDS}.items():
        COMMANDS[name] = _client_command(run_with)


_add_client_commands()


N = TypeVar("N", int, float)


def _argument(
    text: str, convert: Callable[[str], N], accept: Callable[[N], bool], wanted: str
) -> N:
    """``text`` converted, or argparse's error saying what was ``wanted``."""
    try:
        value = convert(text)
    except ValueError:
        value = None
    if value is None or not accept(value):
        raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    """An argparse type: a number of seconds > 0 (argparse names the option on error)."""
    return _argument(text, float, lambda s: 0 < s < math.inf, "a number of seconds > 0")


def seconds_or_zero(text: str) -> float:
    """An argparse type: a number of seconds >= 0."""
    return _argument(text, float, lambda s: 0 <= s < math.inf, "a number of seconds >= 0")


def rescue_seconds(text: str) -> float:
    """An argparse type: ``--rescue-after``, seconds of at least MIN_RESCUE_AFTER."""
    least = MIN_RESCUE_AFTER.total_seconds()
    return _argument(
        text, float, lambda s: least <= s < math.inf, f"a number of seconds >= {least:g}"
    )


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    return _argument(text, int, lambda n: n >= 1, "a whole number >= 1")


def name_list(text: str) -> list[str]:
    """``a,b, c`` as ``["a", "b", "c"]``; at least one name."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"must name at least one queue, got {text!r}")
    return names


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 (any free one) to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port 0-65535, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port 0-65535, got {text!r}")
    return port


def host_names(text: str) -> list[str]:
    """An argparse type: comma-separated host names, each bare (no scheme, no port)."""
    try:
        return sorted(allowed_host_names(n for n in text.split(",") if n.strip()))
    except InvalidInput as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("allowed_hosts: ")) from None


def host_name_option(text: str) -> str:
    """An argparse type: one bare host name (``--allowed-host``)."""
    names = host_names(text)
    if len(names) != 1:
        raise argparse.ArgumentTypeError(f"must be one host name, got {text!r}")
    return names[0]


def log_format(text: str) -> str:
    """An argparse type: text or json."""
    name = text.strip().lower()
    if name not in LOG_FORMATS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(LOG_FORMATS)}, got {text!r}")
    return name


def log_level(text: str) -> str:
    """An argparse type: a logging level name."""
    name = text.strip().upper()
    if name not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(LOG_LEVELS)}, got {text!r}")
    return name


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DEFAULT_GRACE_S = 30.0
DEFAULT_RESCUE_AFTER_S = DEFAULT_RESCUE_AFTER.total_seconds()
DEFAULT_PORT = 8000
DEFAULT_HOST = "127.0.0.1"
DEFAULT_LOG_LEVEL = "INFO"
DEFAULT_LOG_FORMAT = "text"
DEFAULT_METRICS_HOST = "127.0.0.1"
DEFAULT_WRITE_STALL_AFTER_S = STALL_ERROR_AFTER.total_seconds()

# The settings a deployment sets through its environment: (the option's dest,
# the commands that have it, the variable, its argparse type, the default).
# Precedence: the flag, else the variable, else the default. The options'
# parser default is None, so a flag given is told apart from one left out.
ENV_SETTINGS: list[tuple[str, tuple[str, ...], str, Callable[[str], object], object]] = [
    ("schema", (), "SHOAL_SCHEMA", str, DEFAULT_SCHEMA),
    ("log_level", (), "SHOAL_LOG_LEVEL", log_level, DEFAULT_LOG_LEVEL),
    ("pool_size", ("worker",), "SHOAL_POOL_SIZE", positive_int, None),
    ("pool_size", ("api",), "SHOAL_POOL_SIZE", positive_int, DEFAULT_POOL_SIZE),
    ("grace", ("worker",), "SHOAL_GRACE", seconds_or_zero, DEFAULT_GRACE_S),
    ("queues", ("worker",), "SHOAL_QUEUES", name_list, None),
    ("exclude_queues", ("worker",), "SHOAL_EXCLUDE_QUEUES", name_list, None),
    ("rescue_after", ("worker",), "SHOAL_RESCUE_AFTER", rescue_seconds, DEFAULT_RESCUE_AFTER_S),
    ("host", ("api",), "SHOAL_HOST", str, DEFAULT_HOST),
    ("port", ("api",), "SHOAL_PORT", port_number, DEFAULT_PORT),
    ("allowed_hosts", ("api",), ALLOWED_HOSTS_ENV, host_names, []),
    ("log_format", ("worker", "api"), "SHOAL_LOG_FORMAT", log_format, DEFAULT_LOG_FORMAT),
    ("metrics_port", ("worker",), "SHOAL_METRICS_PORT", port_number, None),
    ("metrics_host", ("worker",), "SHOAL_METRICS_HOST", str, DEFAULT_METRICS_HOST),
    (
        "write_stall_after",
        ("worker",),
        "SHOAL_WRITE_STALL_AFTER",
        positive_seconds,
        DEFAULT_WRITE_STALL_AFTER_S,
    ),
]


def apply_environment(args: argparse.Namespace) -> None:
    """Fill the options left out from their environment variables, else their defaults.

    A variable whose value does not parse is InvalidInput naming the variable.
    """
    for dest, commands, variable, convert, default in ENV_SETTINGS:
        if commands and args.command not in commands:
            continue
        if getattr(args, dest, None) is not None:
            continue  # the flag wins
        text = os.environ.get(variable, "")
        if not text.strip():
            setattr(args, dest, default)
            continue
        try:
            setattr(args, dest, convert(text))
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise InvalidInput(variable, str(exc)) from None


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default; a help that states its own is kept."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help_text = action.help or ""
        if "default" in help_text or action.default in (None, argparse.SUPPRESS):
            return help_text
        if action.nargs == 0 and action.default is False:  # a switch (store_true)
            return f"{help_text} (default: off)"
        return super()._get_help_string(action)


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="shoal",
        description="Postgres-native background work.",
        formatter_class=HelpFormatter,
        epilog="Environment variables: DATABASE_URL, SHOAL_DATA_DIR, SHOAL_SCHEMA, "
        "SHOAL_LOG_LEVEL, SHOAL_LOG_FORMAT, SHOAL_POOL_SIZE, SHOAL_GRACE, SHOAL_HOST, "
        "SHOAL_PORT, SHOAL_RESCUE_AFTER, SHOAL_API_TOKEN, SHOAL_METRICS_PORT, SHOAL_METRICS_HOST, "
        "SHOAL_WRITE_STALL_AFTER, "
        "SHOAL_INGEST_TRANSPORT, SHOAL_NATS_URL, SHOAL_NATS_MONITOR_URL, SHOAL_NATS_REPLICAS, "
        "SHOAL_PREPARE_THRESHOLD (a flag wins over its variable).",
    )
    root.add_argument(
        "--database-url",
        help="default: $DATABASE_URL, else an embedded PostgreSQL in $SHOAL_DATA_DIR "
        "(default: under the user's data directory)",
    )
    root.add_argument(
        "--schema",
        help=f"the schema shoal's tables live in (env SHOAL_SCHEMA; default: {DEFAULT_SCHEMA})",
    )
    root.add_argument(
        "--log-level",
        type=log_level,
        help=f"{', '.join(LOG_LEVELS)} (env SHOAL_LOG_LEVEL; default: {DEFAULT_LOG_LEVEL})",
    )
    root.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    root.add_argument(
        "--version",
        action="version",
        version=f"shoal {shoal.__version__}",
        help="print shoal's version and exit",
    )
    sub = root.add_subparsers(dest="command", required=True)

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text, formatter_class=HelpFormatter)

    migrate = command("migrate", "create or upgrade the schema")
    migrate.add_argument(
        "--lock-wait",
        type=positive_seconds,
        metavar="SECONDS",
        default=DEFAULT_LOCK_WAIT.total_seconds(),
        help="seconds each try may wait to take the schema's tables from running workers, "
        "at most half the server's deadlock_timeout (default: %(default)g)",
    )
    migrate.add_argument(
        "--tries",
        type=positive_int,
        metavar="N",
        default=DEFAULT_LOCK_TRIES,
        help="tries before giving up when workers keep the tables (default: %(default)s)",
    )
    worker = command("worker", "run an App's handlers until SIGTERM/SIGINT")
    worker.add_argument("--app", required=True, help="module:attribute of a shoal.App")
    worker.add_argument(
        "--queues",
        type=name_list,
        help="run only these of the app's queues, batch kinds and topics, comma-separated "
        "(env SHOAL_QUEUES; default: all)",
    )
    worker.add_argument(
        "--exclude-queues",
        type=name_list,
        help="run all of the app's queues, batch kinds and topics but these, comma-separated "
        "(env SHOAL_EXCLUDE_QUEUES; default: none)",
    )
    for duty, what in (
        ("maintenance", "lease expiry, archiving and the history sampler"),
        ("scheduler", "cron ticks of the schedules"),
        ("aggregator", "the batch aggregator's passes"),
    ):
        worker.add_argument(
            f"--no-{duty}",
            action="store_true",
            help=f"leave {what} to other processes (default: every process takes a share)",
        )
    worker.add_argument(
        "--grace",
        type=seconds_or_zero,
        help="seconds running jobs get to finish on SIGTERM/SIGINT "
        f"(env SHOAL_GRACE; default: {DEFAULT_GRACE_S:g})",
    )
    worker.add_argument(
        "--rescue-after",
        type=rescue_seconds,
        help="seconds this process may go without a registry heartbeat before maintenance "
        "hands back the jobs it holds, when it died or froze "
        f"(env SHOAL_RESCUE_AFTER; default: {DEFAULT_RESCUE_AFTER_S:g})",
    )
    worker.add_argument(
        "--pool-size",
        type=positive_int,
        help=f"database connections (env SHOAL_POOL_SIZE; default: {DEFAULT_POOL_SIZE}, or more "
        "to fit the app's ingest consumers and sinks beside a reserve of a quarter of the pool)",
    )
    worker.add_argument(
        "--metrics-port",
        type=port_number,
        help="serve Prometheus metrics of this process on http://HOST:PORT/metrics "
        "(env SHOAL_METRICS_PORT; needs shoal[metrics]; default: not served)",
    )
    worker.add_argument(
        "--metrics-host",
        help=f"address the metrics server binds (env SHOAL_METRICS_HOST; "
        f"default: {DEFAULT_METRICS_HOST})",
    )
    worker.add_argument(
        "--write-stall-after",
        type=positive_seconds,
        help="log one ERROR once the database's commits have stalled this many seconds "
        "(a synchronous standby down, a full disk) (env SHOAL_WRITE_STALL_AFTER; "
        f"default: {DEFAULT_WRITE_STALL_AFTER_S:g})",
    )
    api = command("api", "serve the HTTP API and dashboard until SIGTERM/SIGINT")
    api.add_argument("--app", required=True, help="module:attribute of a shoal.App")
    api.add_argument(
        "--host",
        help=f"bind address (env SHOAL_HOST; default: {DEFAULT_HOST}, loopback only; "
        "any other needs a token)",
    )
    api.add_argument(
        "--port", type=port_number, help=f"port (env SHOAL_PORT; default: {DEFAULT_PORT})"
    )
    api.add_argument(
        "--allowed-host",
        dest="allowed_hosts",
        action="append",
        type=host_name_option,
        metavar="NAME",
        help="a further name the API answers to, beside loopback names and the address "
        "a request arrives on (repeat for more; env SHOAL_API_ALLOWED_HOSTS, "
        "comma-separated; default: none): requests whose Host is any other name are "
        "refused 421, which stops DNS rebinding",
    )
    api.add_argument(
        "--token",
        help="bearer token every request must carry (prefer env SHOAL_API_TOKEN: arguments "
        "show in ps; default: none, allowed only on a loopback bind)",
    )
    api.add_argument(
        "--pool-size",
        type=positive_int,
        help=f"database connections (env SHOAL_POOL_SIZE; default: {DEFAULT_POOL_SIZE})",
    )
    api.add_argument(
        "--max-body-bytes",
        type=positive_int,
        help=f"request body cap in bytes (default: {DEFAULT_MAX_BODY_BYTES})",
    )
    api.add_argument(
        "--request-deadline",
        type=positive_seconds,
        help=f"seconds to receive a request body (default: {DEFAULT_REQUEST_DEADLINE_S:g})",
    )
    api.add_argument(
        "--header-timeout",
        type=positive_seconds,
        help="seconds to receive each request's head, headers included; past it the client "
        f"gets 408 and the connection closes (default: {DEFAULT_HEADER_TIMEOUT_S:g})",
    )
    for long_running in (worker, api):
        long_running.add_argument(
            "--log-format",
            type=log_format,
            help="text, or json: one JSON object per line "
            f"(env SHOAL_LOG_FORMAT; default: {DEFAULT_LOG_FORMAT})",
        )
    api.add_argument(
        "--read-only",
        action="store_true",
        help="refuse every request that would change something (403): a console to look, "
        "not to touch",
    )
    status = command("status", "queue depths as a table")
    status.add_argument(
        "--watch",
        type=positive_seconds,
        nargs="?",
        const=2.0,
        help="redraw every this many seconds (2 when given alone) until Ctrl-C "
        "(default: print once)",
    )
    queue = command("queue", "control a queue")
    queue.add_argument("action", choices=["pause", "resume", "redrive"])
    queue.add_argument("name", help="the queue (for redrive: the dead-letter queue)")
    topic = command("topic", "an ingest topic's dead letters")
    topic.add_argument("action", choices=["dead", "redrive"])
    topic.add_argument("topic")
    topic.add_argument(
        "--limit", type=positive_int, default=10_000, help="dead letters to list or redrive"
    )
    config = command("config", "run-time switches, e.g. ingest.mode sync|async")
    config.add_argument("action", choices=["get", "set", "list"])
    config.add_argument("key", nargs="?", default="ingest.mode", help="the switch")
    config.add_argument(
        "value",
        nargs="?",
        help="for set: a JSON value or a bare word (default: none; set needs one)",
    )
    config.add_argument(
        "--new",
        action="store_true",
        help="for set: create a key that is not stored yet (an unknown key is refused "
        "as a likely typo)",
    )
    from shoal.cli_console import add_commands as add_console_commands
    from shoal.cli_tasks import add_commands as add_task_commands

    add_console_commands(command, positive_int)
    add_task_commands(command)
    demo = command("demo", "run the end-to-end demo")
    demo.add_argument("--items", type=positive_int, default=300, help="items in the demo task")
    demo.add_argument(
        "--port", type=port_number, default=DEFAULT_PORT, help="port of the dashboard"
    )
    demo.add_argument(
        "--stay", action="store_true", help="keep serving the dashboard after the task closes"
    )
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    level_given = args.log_level is not None or bool(os.environ.get("SHOAL_LOG_LEVEL", "").strip())
    try:
        apply_environment(args)
    except InvalidInput as exc:
        console.print("[red]error:[/red]", escape(str(exc)), soft_wrap=True)
        return 2
    configure_logging(
        logging.DEBUG if args.verbose else args.log_level,
        getattr(args, "log_format", DEFAULT_LOG_FORMAT),
    )
    logging.getLogger("psycopg.pool").setLevel(logging.WARNING)
    if args.command == "demo" and not (args.verbose or level_given):
        # The demo's own output tells the story; expected failures need not shout.
        logging.getLogger("shoal").setLevel(logging.ERROR)
    command = COMMANDS[args.command]
    try:
        # Refused before anything starts (an embedded server, a pool).
        check_schema_name(args.schema)
        if args.command in ("api", "demo"):
            require("api", f"shoal {args.command}")  # its HTTP server
        if args.command == "api":
            api_token(args)  # refuse an open non-loopback bind before starting anything
        if args.command in ("worker", "api"):
            app = load_app(args.app)  # a bad --app before starting anything (imports are cached)
        if args.command == "worker" and args.metrics_port is not None:
            metrics_class()  # a missing extra, too
        if args.command in ("worker", "topic"):
            ingest_transport()  # a bad SHOAL_INGEST_TRANSPORT too
        if args.command == "worker":
            app.select(args.queues, args.exclude_queues or ())  # names it does not declare
        with database_url(args) as url:
            return asyncio.run(command(args, url))
    except ShoalError as exc:
        # One line whatever the terminal's width, and the message's own
        # brackets (a quoted name, say) are text, not markup.
        console.print("[red]error:[/red]", escape(str(exc)), soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        return 130


# What an application's own command line builds on (the reference apps' do):
# the database URL with the embedded fallback, the API token, the transport.
__all__ = ["api_token", "database_url", "ingest_transport", "main"]

if __name__ == "__main__":
    sys.exit(main())
