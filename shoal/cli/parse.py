"""The command line's grammar: its options, their types, the environment they read, and
``--help``. Environment variables are read here and nowhere deeper.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

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
from shoal.db.pool import DEFAULT_POOL_SIZE, DEFAULT_SCHEMA
from shoal.db.writes import STALL_ERROR_AFTER
from shoal.errors import InvalidInput
from shoal.logs import LOG_FORMATS
from shoal.queue.registry import DEFAULT_RESCUE_AFTER, MIN_RESCUE_AFTER

if TYPE_CHECKING:
    pass


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
            help=f"leave {what} to other processes (default: every process contends for it, "
            "and the one that leads it runs it)",
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
        "--access-log",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="log each request, one INFO line (the console's polls at DEBUG, shown with -v)",
    )
    api.add_argument(
        "--read-only",
        action="store_true",
        help="refuse every request that would change something (403): a console to look, "
        "not to touch",
    )
    status = command("status", "queue depths, and who leads each duty, as tables")
    status.add_argument(
        "--watch",
        type=positive_seconds,
        nargs="?",
        const=2.0,
        help="redraw every this many seconds (2 when given alone) until Ctrl-C "
        "(default: print once)",
    )
    from shoal.cli.console import add_internal_switch

    add_internal_switch(status)
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
    from shoal.cli.console import add_commands as add_console_commands
    from shoal.cli.tasks import add_commands as add_task_commands
    from shoal.cli.tasks import up_to
    from shoal.cli.workflows import add_commands as add_workflow_commands

    add_console_commands(command, positive_int)
    add_task_commands(command)
    add_workflow_commands(command, up_to)
    demo = command("demo", "run the end-to-end demo")
    demo.add_argument("--items", type=positive_int, default=300, help="items in the demo task")
    demo.add_argument(
        "--port", type=port_number, default=DEFAULT_PORT, help="port of the dashboard"
    )
    demo.add_argument(
        "--stay", action="store_true", help="keep serving the dashboard after the task closes"
    )
    return root
