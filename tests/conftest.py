"""Test fixtures: a real PostgreSQL, and a fresh migrated database per test.

The server is ``DATABASE_URL`` when set (CI points it at the machine's
PostgreSQL), else an embedded server started for this run. A template
database is migrated once per run; each test gets its own clone of it.
Tests that restart, freeze or kill a server use ``throwaway_pg``: a cluster
of their own, never the shared one.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import queue
import shutil
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from shoal import FakeClock, Shoal
from shoal.db import Database, EmbeddedPostgres, migrate
from shoal.db.embedded import free_port
from tests.install_helpers import Release, build_release, clean_venv

__all__ = ["free_port", "wait_for", "with_dbname"]

RUN_ID = uuid.uuid4().hex[:8]
_counter = itertools.count()


def with_dbname(url: str, dbname: str) -> str:
    return make_conninfo(url, dbname=dbname)


@pytest.fixture(scope="session")
def pg_root() -> Iterator[Path]:
    """Where this run's PostgreSQL clusters keep their data, removed at the end.

    Not under pytest's own temporary tree: every pytest session that starts on
    the machine (another suite, or a test that runs pytest) resets
    ``/tmp/pytest-of-<user>`` to mode 0700, and a cluster whose server runs as
    another user (``shoal_postgres`` when the tests run as root) then loses its
    data directory mid-run and shuts down.
    """
    root = Path(tempfile.mkdtemp(prefix=f"shoal-tests-{RUN_ID}-"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_dir(pg_root: Path) -> Path:
    """A folder of this test's own for PostgreSQL data directories (see ``pg_root``)."""
    return Path(tempfile.mkdtemp(dir=pg_root))


@pytest.fixture(scope="session")
def pg_server(pg_root: Path) -> Iterator[str]:
    """A URL of the server tests may create databases on."""
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url
        return
    server = EmbeddedPostgres(pg_root / "shared" / "data", fsync=False)
    server.start()
    try:
        yield server.url()
    finally:
        server.stop("immediate")


@pytest.fixture(scope="session")
def template_db(pg_server: str) -> Iterator[str]:
    name = f"shoal_tpl_{RUN_ID}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    async def prepare() -> None:
        async with Database(with_dbname(pg_server, name)) as db:
            await migrate(db)

    asyncio.run(prepare())
    try:
        yield name
    finally:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def create_database(pg_server: str, template: str) -> str:
    name = f"shoal_t_{RUN_ID}_{next(_counter)}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        _create(conn, name, template)
    return name


def drop_database(pg_server: str, name: str) -> None:
    with psycopg.connect(pg_server, autocommit=True) as conn:
        _drop(conn, name)


def _create(conn: psycopg.Connection, name: str, template: str) -> None:
    conn.execute(
        sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(template)
        )
    )


def _drop(conn: psycopg.Connection, name: str) -> None:
    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


class DatabaseSupply:
    """Clones of the template made ahead of the tests, and dropped behind them, on a thread.

    Cloning the template and dropping a clone each take 0.05-0.2 s of the
    server's time (more on a loaded machine), about a third of a short
    test. A thread keeps ``ahead`` clones ready and drops the used ones while
    the tests run, so a test waits for neither unless the thread is behind.
    """

    def __init__(self, server: str, template: str, ahead: int = 2) -> None:
        self.server = server
        self.template = template
        self.ahead = ahead
        self._ready: queue.Queue[str] = queue.Queue()
        self._used: list[str] = []
        self._wake = threading.Condition()
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="test-database-supply", daemon=True)
        self._thread.start()

    def take(self) -> str:
        """A fresh clone of the template, migrated, nobody else's."""
        while True:
            try:
                name = self._ready.get(timeout=1.0)
            except queue.Empty:
                if not self._thread.is_alive():
                    raise RuntimeError(
                        f"the test database supply stopped: {self._error!r}"
                    ) from None
                continue
            with self._wake:
                self._wake.notify()
            return name

    def give_back(self, name: str) -> None:
        """Drop ``name`` (any test database) on the thread."""
        with self._wake:
            self._used.append(name)
            self._wake.notify()

    def close(self) -> None:
        """Stop the thread, then drop what it made and was given back."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout=120)
        left = list(self._used)
        while not self._ready.empty():
            left.append(self._ready.get_nowait())
        with psycopg.connect(self.server, autocommit=True) as conn:
            for name in left:
                _drop(conn, name)

    def _next(self) -> tuple[str, str] | None:
        with self._wake:
            while True:
                if self._closed:
                    return None
                # A waiting test first: make a clone when too few are ready.
                if self._ready.qsize() < self.ahead:
                    return ("create", f"shoal_t_{RUN_ID}_{next(_counter)}")
                if self._used:
                    return ("drop", self._used.pop(0))
                self._wake.wait()

    def _run(self) -> None:
        conn: psycopg.Connection | None = None
        failures = 0
        try:
            while (step := self._next()) is not None:
                action, name = step
                try:
                    if conn is None or conn.closed:
                        conn = psycopg.connect(self.server, autocommit=True)
                    if action == "create":
                        _create(conn, name, self.template)
                        self._ready.put(name)
                    else:
                        _drop(conn, name)
                    failures = 0
                except psycopg.OperationalError:
                    # A test that ends every session of the server's can end
                    # this one too: connect again, and give up after a while.
                    failures += 1
                    if failures > 50:
                        raise
                    if action == "drop":
                        self.give_back(name)
                    conn = None
                    threading.Event().wait(0.1)  # a pause before connecting again
        except BaseException as exc:
            self._error = exc
        finally:
            if conn is not None:
                conn.close()


@pytest.fixture(scope="session")
def database_supply(pg_server: str, template_db: str) -> Iterator[DatabaseSupply]:
    supply = DatabaseSupply(pg_server, template_db)
    try:
        yield supply
    finally:
        supply.close()


@pytest.fixture
def db_url(pg_server: str, database_supply: DatabaseSupply) -> Iterator[str]:
    """A fresh database with shoal's schema migrated, dropped after the test."""
    name = database_supply.take()
    try:
        yield with_dbname(pg_server, name)
    finally:
        database_supply.give_back(name)


@pytest.fixture
def empty_db_url(pg_server: str, database_supply: DatabaseSupply) -> Iterator[str]:
    """A fresh database with nothing in it."""
    name = f"shoal_e_{RUN_ID}_{next(_counter)}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield with_dbname(pg_server, name)
    finally:
        database_supply.give_back(name)


@pytest.fixture
async def boss(db_url: str) -> AsyncIterator[Shoal]:
    """A client on a fresh database, on real time."""
    db = await Database(db_url, max_size=10).open()
    client = Shoal(db)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def observer(db_url: str) -> AsyncIterator[Shoal]:
    """A client of the test's own, to set up and inspect while workers run.

    Its connections are named ``shoal-test``, so they never count as a
    worker's ('shoal') and it does not LISTEN.
    """
    db = await Database(db_url, max_size=4, application_name="shoal-test").open()
    client = Shoal(db, listen=False)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def fake_boss(db_url: str, clock: FakeClock) -> AsyncIterator[Shoal]:
    """A client whose time (in Python and in SQL) moves only with ``clock.advance``."""
    db = await Database(db_url, max_size=10).open()
    client = Shoal(db, clock=clock)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
def throwaway_pg(pg_dir: Path) -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL cluster of this test's own, to restart, freeze or kill."""
    server = EmbeddedPostgres(pg_dir / "pg", fsync=False)
    server.start()
    try:
        yield server
    finally:
        server.thaw()
        server.stop("immediate")


async def wait_for(predicate: object, timeout_s: float = 30.0, interval_s: float = 0.02) -> None:
    """Await until ``predicate()`` (sync or async) is true, or fail after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        result = predicate()  # type: ignore[operator]
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        await asyncio.sleep(interval_s)  # noqa: TID251 - polls a condition; timeout_s bounds failure


async def advancing(
    clock: FakeClock,
    done: Callable[[], Awaitable[bool] | bool],
    step: timedelta = timedelta(seconds=1),
) -> None:
    """Move ``clock`` ``step`` at a time until ``done()``.

    For a loop whose sleep counts from the clock as it finds it when the
    sleep starts: one advance could land before the sleep begins, and the
    sleep would then never end. In steps, the clock passes the sleep's end
    whenever it began. Database calls the loop makes run in real time, so the
    clock moves while they run (the wait per step only yields to them;
    nothing depends on its length).
    """

    async def check() -> bool:
        clock.advance(step)
        result = done()
        return bool(await result) if isinstance(result, Awaitable) else bool(result)

    await wait_for(check, timeout_s=120, interval_s=0.05)


T = TypeVar("T")


async def until_done(
    clock: FakeClock, task: asyncio.Future[T], step: timedelta = timedelta(seconds=1)
) -> T:
    """``task``'s result, moving ``clock`` ``step`` at a time until it has one."""
    await advancing(clock, task.done, step)
    return task.result()


async def hold_like_pg_dump(conn: psycopg.AsyncConnection[Any], schema: str = "shoal") -> None:
    """Take every table of ``schema`` in ACCESS SHARE mode on ``conn``, in its transaction.

    What pg_dump does for the whole of a dump: a dump in progress, for a test.
    """
    cur = await conn.execute(
        "SELECT string_agg(format('%%I.%%I', schemaname, tablename), ', ')"
        " FROM pg_tables WHERE schemaname = %s",
        (schema,),
    )
    row = await cur.fetchone()
    assert row is not None and f"{schema}.migration" in row[0], row
    await conn.execute(f"LOCK TABLE {row[0]} IN ACCESS SHARE MODE")


from shoal.testing import NatsServer  # noqa: E402 - appended with the NATS fixture below


@pytest.fixture(params=["postgres", "nats"])
def transport_kind(request: pytest.FixtureRequest) -> str:
    """Each ingest transport in turn, for a test that must hold on both."""
    return str(request.param)


@pytest.fixture
def nats(transport_kind: str, tmp_path: Path) -> Iterator[NatsServer | None]:
    """A nats-server of the test's own when ``transport_kind`` is nats, else None."""
    if transport_kind != "nats":
        yield None
        return
    server = NatsServer(tmp_path / "nats").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server 2.15 of this test's own (JetStream, ``sync_interval: always``), to kill."""
    server = NatsServer(tmp_path / "nats").start()
    try:
        yield server
    finally:
        server.stop()


# -- the release: built once, installed once in a clean virtualenv ----------
# No skip without a package index: CI reaches it, and a release that cannot
# be installed is a failure (tests/install_helpers.py).


@pytest.fixture(scope="session")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    """This checkout's sdist and wheel, built by ``python -m build``."""
    return build_release(tmp_path_factory.mktemp("release"))


@pytest.fixture(scope="session")
def core_venv(release: Release, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean virtualenv with the wheel installed, without extras: ``pip install shoal``."""
    return clean_venv(tmp_path_factory.mktemp("core") / "venv", release.wheel)


# -- browser tests: a loud line at the end when they did not run -------------

# test_dashboard's `browser` fixture starts every skip reason with this; the
# reason goes on to say what is missing and how to install it.
BROWSER_SKIP = "browser test skipped: "


# Tests that need a program from a Debian package (promtool, tesseract) skip
# with this prefix when it is missing, and the run ends with one line naming
# them. CI installs the packages and sets REQUIRE_PROGRAMS, which turns such a
# skip into a failure: there, a missing program is a broken set-up.
PROGRAM_SKIP = "program missing: "
REQUIRE_PROGRAMS = "SHOAL_REQUIRE_SYSTEM_PACKAGES"


def require_program(program: str, package: str) -> str:
    """The path of ``program``; else skip (fail under REQUIRE_PROGRAMS) naming its package."""
    path = shutil.which(program)
    if path is None:
        reason = f"{program} is missing: install it with `apt-get install -y {package}`"
        if os.environ.get(REQUIRE_PROGRAMS):
            pytest.fail(f"{reason} ({REQUIRE_PROGRAMS} is set)")
        pytest.skip(PROGRAM_SKIP + reason)
    return path


def _skip_reasons(terminalreporter: pytest.TerminalReporter, prefix: str) -> list[str]:
    return [
        str(report.longrepr[2]).partition(prefix)[2]
        for report in terminalreporter.stats.get("skipped", [])
        if isinstance(report.longrepr, tuple) and prefix in str(report.longrepr[2])
    ]


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> Iterator[None]:
    """Say in one line each, after every other summary, which tests did not run and why.

    A skip is easy to miss among hundreds of passes, and a missing Chromium
    hides every check of the console and the workbench page. Outermost
    wrapper: the lines come after the short summary, just above the result.
    """
    yield
    reasons = _skip_reasons(terminalreporter, BROWSER_SKIP)
    if reasons:
        terminalreporter.write_line(
            f"BROWSER TESTS SKIPPED ({len(reasons)}): {reasons[0]} (README: Browser tests)",
            red=True,
            bold=True,
        )
    programs = _skip_reasons(terminalreporter, PROGRAM_SKIP)
    if programs:
        terminalreporter.write_line(
            f"TESTS SKIPPED FOR MISSING PROGRAMS ({len(programs)}): "
            + "; ".join(sorted(set(programs)))
            + " (README: Set-up)",
            red=True,
            bold=True,
        )
