"""pytest fixtures for an application's tests: a fresh database per test, a client on a fake clock.

Turn them on in the application's ``conftest.py``::

    pytest_plugins = ["shoal.testing.pytest_plugin"]

They need pytest and pytest-asyncio (the async fixture is a
``pytest_asyncio.fixture``, so it works in its strict mode and its auto mode).
The server comes from ``DATABASE_URL``; its role must be allowed to create
databases. Without ``DATABASE_URL`` the fixtures fail the test, saying so:
a test of code built on shoal needs a real PostgreSQL.

- ``shoal_database_url``: the URL of a database of the test's own, with
  shoal's schema migrated, dropped after the test (even with connections
  left open). shoal's migrations run once per pytest process, into a
  template that each test's database is cloned from.
- ``shoal_clock``: a :class:`shoal.FakeClock` the test moves with
  ``advance``.
- ``shoal_client``: a :class:`shoal.Shoal` on that database and that clock,
  closed after the test (its workers stopped).

Not registered as a pytest entry point: installing shoal adds no fixture to
a project that did not ask for them.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
import pytest_asyncio
from psycopg import sql
from psycopg.conninfo import make_conninfo

from shoal.clock import FakeClock
from shoal.db import Database, migrate
from shoal.queue.client import Shoal

__all__ = [
    "shoal_client",
    "shoal_clock",
    "shoal_database_url",
    "shoal_server_url",
    "shoal_template_database",
]

# The environment variable the server's URL is read from, as the CLI reads it.
DATABASE_URL_VARIABLE = "DATABASE_URL"


def _with_dbname(url: str, dbname: str) -> str:
    return make_conninfo(url, dbname=dbname)


def _drop(server_url: str, name: str) -> None:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture(scope="session")
def shoal_server_url() -> str:
    """``DATABASE_URL``: the server the test databases are created on."""
    url = os.environ.get(DATABASE_URL_VARIABLE, "").strip()
    if not url:
        pytest.fail(
            f"shoal.testing.pytest_plugin: set {DATABASE_URL_VARIABLE} to a PostgreSQL server "
            "whose role may create databases (e.g. postgresql://postgres@127.0.0.1:5432/postgres)",
            pytrace=False,
        )
    return url


@pytest.fixture(scope="session")
def shoal_template_database(shoal_server_url: str) -> Iterator[str]:
    """The name of a database with shoal's schema migrated, cloned by every test's own."""
    name = f"shoal_template_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(shoal_server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:

        async def prepare() -> None:
            async with Database(_with_dbname(shoal_server_url, name), max_size=1) as db:
                await migrate(db)

        # A session fixture runs outside any event loop: one of its own, once.
        asyncio.run(prepare())
        yield name
    finally:
        _drop(shoal_server_url, name)


@pytest.fixture
def shoal_database_url(shoal_server_url: str, shoal_template_database: str) -> Iterator[str]:
    """A fresh database with shoal's schema migrated, dropped after the test."""
    name = f"shoal_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(shoal_server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(shoal_template_database)
            )
        )
    try:
        yield _with_dbname(shoal_server_url, name)
    finally:
        _drop(shoal_server_url, name)


@pytest.fixture
def shoal_clock() -> FakeClock:
    """A clock that moves only with ``shoal_clock.advance(...)``."""
    return FakeClock()


@pytest_asyncio.fixture
async def shoal_client(shoal_database_url: str, shoal_clock: FakeClock) -> AsyncIterator[Shoal]:
    """A client on the test's database whose time (in Python and in SQL) is ``shoal_clock``."""
    client = await Shoal.connect(shoal_database_url, clock=shoal_clock, run_migrations=False)
    try:
        yield client
    finally:
        await client.close()
