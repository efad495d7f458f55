"""What every command of ``shoal`` shares: the database URL (with the embedded fallback), the
connection to an existing schema, the ``--app`` and the ingest transport of the environment,
and the error console.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

# The modules of the subcommands are imported by the commands that use them, so
# `shoal --help` and `shoal migrate` load neither the HTTP API nor the ingest
# supervisor, and a missing extra is an error of the one command that needs it.
from shoal.cli.parse import DEFAULT_LOG_FORMAT
from shoal.errors import InvalidInput
from shoal.extras import require

if TYPE_CHECKING:
    from shoal.app import App
    from shoal.ingest.supervisor import TransportFactory
    from shoal.queue.client import Shoal


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


async def connect(args: argparse.Namespace, url: str, **kwargs: object) -> Shoal:
    """A client on the schema, migrated first (``worker`` and ``api``: docs/cli.md)."""
    from shoal.queue.client import Shoal

    kwargs.setdefault("prepare_threshold", prepare_threshold())
    return await Shoal.connect(url, schema=args.schema, **kwargs)  # type: ignore[arg-type]  # kwargs are Shoal.connect's own


async def connect_existing(args: argparse.Namespace, url: str) -> Shoal:
    """A client on a schema that is there and up to date; creates nothing.

    Every command but ``migrate``, ``worker``, ``api`` and ``demo``: pointed at
    the wrong database, it says so (``no shoal schema in mydb (run shoal
    migrate)``) instead of creating shoal's tables there.
    """
    from shoal.db.migrate import require_migrated

    boss = await connect(args, url, listen=False, run_migrations=False)
    try:
        await require_migrated(boss.db)
    except BaseException:
        await boss.close()
        raise
    return boss
