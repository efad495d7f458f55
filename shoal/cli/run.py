"""``shoal``: the command line. Environment variables are read here and nowhere deeper.

    shoal migrate                     create or upgrade the schema
    shoal worker --app module:attr    run an App's handlers, schedules and maintenance
    shoal api --app module:attr       serve the HTTP API and dashboard for an App's batch kinds
    shoal status                      queue depths, and who leads each duty
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
    shoal workflows list|show|start|cancel|retry  workflow runs; shoal workflows show ID
    shoal signal KEY [PAYLOAD_JSON]   send an event to the workflow run waiting for KEY
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
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from rich.markup import escape

# The modules of the subcommands are imported by the commands that use them, so
# `shoal --help` and `shoal migrate` load neither the HTTP API nor the ingest
# supervisor, and a missing extra is an error of the one command that needs it.
from shoal.cli.common import connect_existing, console, database_url, ingest_transport, load_app
from shoal.cli.parse import DEFAULT_LOG_FORMAT, apply_environment, parser
from shoal.cli.serve import api_token, cmd_api, cmd_demo, cmd_migrate, cmd_worker, metrics_class
from shoal.cli.status import cmd_config, cmd_queue, cmd_status, cmd_topic
from shoal.db.pool import check_schema_name
from shoal.errors import InvalidInput, ShoalError
from shoal.extras import require
from shoal.logs import configure as configure_logging

if TYPE_CHECKING:
    from shoal.queue.client import Shoal


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
    """A command of shoal.cli.console or shoal.cli.tasks, on a client of an existing schema."""

    async def run(args: argparse.Namespace, url: str) -> int:
        boss = await connect_existing(args, url)
        try:
            return await run_with(args, boss)
        finally:
            await boss.close()

    return run


def add_client_commands() -> None:
    from shoal.cli.console import COMMANDS as CONSOLE_COMMANDS
    from shoal.cli.tasks import COMMANDS as TASK_COMMANDS
    from shoal.cli.workflows import COMMANDS as WORKFLOW_COMMANDS

    for name, run_with in {**CONSOLE_COMMANDS, **TASK_COMMANDS, **WORKFLOW_COMMANDS}.items():
        COMMANDS[name] = _client_command(run_with)


add_client_commands()


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
