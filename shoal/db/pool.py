"""The connection pool, and the deadline every database call runs under.

A TCP peer that silently stops forwarding leaves a query waiting long past any
keepalive. So each call made through :meth:`Database.run` carries a deadline of
shoal's own: when it passes, the connection's socket is closed at once (the
connection is discarded, never handed back to the pool), the call is abandoned
and :class:`~shoal.errors.DeadlineExceeded` is raised for the caller's retry
policy to handle. Closing before cancelling matters: psycopg answers a bare
cancellation by sending a cancel request and waiting for the server, which is
exactly what a dead peer never gives.

Driver errors are translated here too: lost connections, deadlines, lock and
statement timeouts, serialization failures and deadlocks become
:class:`~shoal.errors.TransientError`, raised ``from`` the original.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from datetime import timedelta
from typing import Any, Generic, TypeVar

import psycopg
import psycopg_pool
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow

from shoal.db.usage import CallTimes
from shoal.errors import CannotConnect, Conflict, DeadlineExceeded, InvalidInput, TransientError

log = logging.getLogger("shoal.db")

T = TypeVar("T")
AsyncConn = psycopg.AsyncConnection[TupleRow]

DEFAULT_SCHEMA = "shoal"
# The schema's notification channel is "<schema>_jobs", and PostgreSQL names
# hold 63 bytes: pg_notify refuses a longer channel ("channel name too long").
MAX_SCHEMA_NAME = 63 - len("_jobs")
# Only characters that are inert wherever shoal's SQL names the schema. The
# first migration (released, so never edited) names its sequence inside a
# string literal (nextval('{schema}.job_id_seq')), where a quote ends the
# literal; function bodies are $$-quoted, where "$$" ends the body.
SCHEMA_NAME = re.compile(rf"[A-Za-z0-9_\-]{{1,{MAX_SCHEMA_NAME}}}")
DEFAULT_POOL_SIZE = 10
# Long enough for a claim of a few hundred rows on a busy server, short enough
# that a frozen peer is noticed well inside a job's lease.
DEFAULT_DEADLINE = timedelta(seconds=30)
# Passed to libpq: how long the kernel may hold unacknowledged data before it
# drops the connection, and how soon keepalives start.
TCP_USER_TIMEOUT_MS = 30_000
KEEPALIVES_IDLE_S = 10
# psycopg's own default: a statement run this many times on one connection is
# prepared on the server. None prepares nothing, which PgBouncer in
# transaction mode needs before 1.21 (a prepared statement lives on one server
# connection, and the next transaction may get another): docs/deploying.md.
DEFAULT_PREPARE_THRESHOLD: int | None = 5
RECONNECT_TIMEOUT_S = 3600.0

TRANSIENT_SQLSTATES = {
    "40001",  # serialization_failure
    "40P01",  # deadlock_detected
    "55P03",  # lock_not_available
    "57014",  # query_canceled (statement_timeout)
    "57P01",  # admin_shutdown (pg_terminate_backend, restart)
    "57P02",  # crash_shutdown
    "57P03",  # cannot_connect_now
    "53300",  # too_many_connections
}


# What libpq says when a server refuses a connection for now but may take the
# next one (it is starting up or shutting down, or its slots are full): the
# first connection tries again within the connect timeout. Any other refusal
# (no such database, role or password refused, host unreachable) ends it at once.
CONNECT_LATER = (
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "too many clients already",
    "remaining connection slots are reserved",
    # target_session_attrs=read-write (or primary) found only a standby: in a
    # failover, the one about to be promoted.
    "session is read-only",
    "server is in hot standby mode",
)
CONNECT_RETRY_PAUSE_S = 0.5


def redacted_url(url: str) -> str:
    """``url`` as ``postgresql://user@host:port/dbname``: what it points at, never a password."""
    try:
        info = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "an unparsable database URL"
    user = info.get("user")
    # A multi-host string lists hosts and ports comma-separated, pairwise (one
    # port may serve all): written back as libpq's host1:port1,host2:port2.
    hosts = str(info.get("host") or info.get("hostaddr") or "localhost").split(",")
    ports = str(info.get("port") or "5432").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    where = ",".join(
        f"{host or 'localhost'}:{port or '5432'}" for host, port in zip(hosts, ports, strict=False)
    )
    return f"postgresql://{f'{user}@' if user else ''}{where}/{info.get('dbname') or ''}"


def connect_failure(exc: psycopg.Error, url: str) -> CannotConnect:
    """One line naming why a connection to ``url`` failed, and where it was going."""
    text = str(exc).strip()
    text = text.removeprefix("connection failed:").strip()
    # libpq's server refusal reads 'connection to server at ... failed: FATAL:  <cause>'.
    _, fatal, cause = text.partition("FATAL:")
    cause = " ".join((cause if fatal else text).split())
    return CannotConnect(f"{cause} ({redacted_url(url)})")


def translate(exc: BaseException) -> BaseException:
    """The shoal error a driver error stands for (the same object when none fits)."""
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return TransientError(f"no database connection free in time: {exc}")
    if isinstance(exc, pg_errors.UniqueViolation):
        return Conflict(str(exc).strip())
    if isinstance(exc, psycopg.Error):
        sqlstate = getattr(exc, "sqlstate", None)
        if (
            isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
            or sqlstate in TRANSIENT_SQLSTATES
        ):
            return TransientError(f"{type(exc).__name__}: {str(exc).strip()}")
    return exc


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Re-raise driver errors as their shoal class, ``from`` the original."""
    try:
        yield
    except psycopg.Error as exc:
        mapped = translate(exc)
        if mapped is exc:
            raise
        raise mapped from exc


def check_schema_name(name: object) -> str:
    """``name`` if shoal can keep its tables in a schema of that name, else InvalidInput.

    >>> check_schema_name("shoal_v2")
    'shoal_v2'
    """
    if not isinstance(name, str) or not SCHEMA_NAME.fullmatch(name):
        raise InvalidInput(
            "schema",
            f"{name!r} cannot be used: a schema name is 1-{MAX_SCHEMA_NAME} of "
            "A-Z a-z 0-9 _ - (shoal's SQL names it inside string literals and "
            "function bodies, and its notification channel <schema>_jobs must fit "
            "PostgreSQL's 63-byte names)",
        )
    return name


# The server stops a statement at this share of the client's deadline.
STATEMENT_TIMEOUT_SHARE = 0.9


def statement_timeout_for(deadline: timedelta) -> timedelta:
    """The server-side statement timeout that goes with a client ``deadline``."""
    return deadline * STATEMENT_TIMEOUT_SHARE


def connection_kwargs(
    deadline: timedelta,
    application_name: str,
    prepare_threshold: int | None = DEFAULT_PREPARE_THRESHOLD,
) -> dict[str, Any]:
    """The settings of every connection shoal opens, async or sync."""
    return {
        "autocommit": True,
        "prepare_threshold": prepare_threshold,
        "application_name": application_name,
        "tcp_user_timeout": TCP_USER_TIMEOUT_MS,
        "keepalives": 1,
        "keepalives_idle": KEEPALIVES_IDLE_S,
        "connect_timeout": max(2, int(deadline.total_seconds())),
        # Plans from the parameters at hand, never a generic plan whose
        # estimates (unknown array sizes, stale statistics) can turn a
        # batch write quadratic. And the server stops a statement a little
        # before our deadline, so a slow call fails cleanly on a reusable
        # connection, and an abandoned one does not keep running.
        "options": (
            "-c plan_cache_mode=force_custom_plan "
            f"-c statement_timeout={int(statement_timeout_for(deadline).total_seconds() * 1000)}"
        ),
    }


class Database:
    """A pool of connections to one database, and the schema shoal lives in.

    ``run`` is the only way shoal's stores touch the database: it checks out a
    connection, runs the given coroutine function inside a transaction, and
    enforces the deadline. ``prepare_threshold`` is psycopg's: None prepares
    no statement on the server, for PgBouncer in transaction mode before 1.21.

    >>> db = Database("postgresql://127.0.0.1/test")   # doctest: +SKIP
    >>> await db.open()                                 # doctest: +SKIP
    >>> await db.run(lambda conn: conn.execute("select 1"))  # doctest: +SKIP
    """

    def __init__(
        self,
        url: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        min_size: int = 1,
        max_size: int = DEFAULT_POOL_SIZE,
        deadline: timedelta = DEFAULT_DEADLINE,
        application_name: str = "shoal",
        prepare_threshold: int | None = DEFAULT_PREPARE_THRESHOLD,
    ) -> None:
        self.url = url
        self.schema = check_schema_name(schema)
        self.deadline = deadline
        self.max_size = max_size
        # Attach a CallTimes to time every call's wait for a connection.
        self.call_times: CallTimes | None = None
        self._kwargs = connection_kwargs(deadline, application_name, prepare_threshold)
        self.pool: psycopg_pool.AsyncConnectionPool[AsyncConn] = psycopg_pool.AsyncConnectionPool(
            url,
            min_size=min_size,
            max_size=max_size,
            kwargs=self._kwargs,
            open=False,
            timeout=deadline.total_seconds(),
            # How long the pool keeps refilling min_size after losing its
            # connections; requests still open new ones after that.
            reconnect_timeout=RECONNECT_TIMEOUT_S,
            name=f"shoal:{schema}",
        )

    async def open(self, *, check: bool = True) -> Database:
        """Check that a connection can be made, then start the pool.

        Raises :class:`CannotConnect` within the connect timeout when the first
        connection fails (no such database, credentials refused, host
        unreachable): a pool would only keep retrying in the background while
        every call waits its timeout. Once open, the pool reconnects by itself
        after a lost connection. ``check=False`` starts the pool without that
        first connection, for a process that must start while its database is
        away (an API reporting not-ready); its calls wait for a connection.
        """
        if check:
            conn = await self._first_connection()
            await conn.close()
        with translated():
            await self.pool.open(wait=False)
        return self

    async def close(self) -> None:
        await self.pool.close()

    async def _first_connection(self) -> AsyncConn:
        timeout_s = float(self._kwargs["connect_timeout"])
        loop = asyncio.get_running_loop()
        give_up = loop.time() + timeout_s
        while True:
            try:
                async with asyncio.timeout(timeout_s):  # not wait_for: see connect
                    return await psycopg.AsyncConnection.connect(self.url, **self._kwargs)
            except TimeoutError:
                raise CannotConnect(
                    f"no answer within the connect timeout of {timeout_s:g}s "
                    f"({redacted_url(self.url)})"
                ) from None
            except psycopg.Error as exc:
                if not any(text in str(exc) for text in CONNECT_LATER) or loop.time() >= give_up:
                    raise connect_failure(exc, self.url) from exc
            await asyncio.sleep(CONNECT_RETRY_PAUSE_S)

    async def __aenter__(self) -> Database:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def application_name(self) -> str:
        return str(self._kwargs["application_name"])

    async def connect(self, *, application_name: str | None = None) -> AsyncConn:
        """A connection of its own, outside the pool (LISTEN, advisory locks).

        ``application_name`` names it apart from the pool's in
        ``pg_stat_activity`` (default: the pool's name).
        """
        kwargs = self._kwargs
        if application_name is not None:
            kwargs = {**kwargs, "application_name": application_name}
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a
        # cancellation that arrives as the connect completes and returns the
        # connection, so a cancelled LISTEN task (Notifier.stop) went on
        # listening and its stop waited forever.
        with translated():
            async with asyncio.timeout(self.deadline.total_seconds()):
                return await psycopg.AsyncConnection.connect(self.url, **kwargs)

    async def run(
        self,
        work: Callable[[AsyncConn], Awaitable[T]],
        *,
        deadline: timedelta | None = None,
        transaction: bool = True,
    ) -> T:
        """Run ``work(conn)`` on a pooled connection, in a transaction, under a deadline."""
        seconds = (deadline or self.deadline).total_seconds()
        with translated():
            async with self._checkout() as conn:
                with abandon_after(conn, seconds):
                    if not transaction:
                        return await work(conn)
                    async with conn.transaction():
                        return await work(conn)
        raise AssertionError("unreachable")  # pragma: no cover

    async def on(
        self,
        conn: AsyncConn | None,
        work: Callable[[AsyncConn], Awaitable[T]],
        *,
        transaction: bool = True,
    ) -> T:
        """``work`` on the caller's connection (its transaction), else as :meth:`run`."""
        if conn is None:
            return await self.run(work, transaction=transaction)
        with translated():
            return await work(conn)

    async def fetch(
        self, query: sql.Composed, params: Mapping[str, Any], conn: AsyncConn | None = None
    ) -> list[TupleRow]:
        """One statement's rows (none for a statement without a result).

        One statement is its own transaction: no BEGIN/COMMIT round trips.
        """

        async def run(c: AsyncConn) -> list[TupleRow]:
            cur = await c.execute(query, params)
            return await cur.fetchall() if cur.description else []

        return await self.on(conn, run, transaction=False)

    @contextlib.asynccontextmanager
    async def connection(self, *, deadline: timedelta | None = None) -> AsyncIterator[AsyncConn]:
        """A pooled connection for several calls, all under one deadline."""
        seconds = (deadline or self.deadline).total_seconds()
        with translated():
            async with self._checkout() as conn:
                with abandon_after(conn, seconds):
                    yield conn

    @contextlib.asynccontextmanager
    async def _checkout(self) -> AsyncIterator[AsyncConn]:
        """A connection from the pool, timed into :attr:`call_times` when attached."""
        times = self.call_times
        if times is None:
            async with self.pool.connection() as conn:
                yield conn
            return
        asked = time.monotonic()
        got: float | None = None
        try:
            async with self.pool.connection() as conn:
                got = time.monotonic()
                yield conn
        finally:
            done = time.monotonic()
            times.record(wait_s=(got or done) - asked, total_s=done - asked)


class Pending(Generic[T]):
    """A statement already executed, with the conversion of its rows.

    Lets a store hand out "send" functions whose results are read (and
    converted) by the caller, one shape for single and batched writes.
    """

    __slots__ = ("_convert", "_cursor")

    def __init__(
        self,
        cursor: psycopg.AsyncCursor[TupleRow] | None,
        convert: Callable[[list[TupleRow]], T],
    ) -> None:
        self._cursor = cursor
        self._convert = convert

    async def result(self) -> T:
        if self._cursor is None:
            return self._convert([])
        with translated():
            rows = await self._cursor.fetchall() if self._cursor.description else []
        return self._convert(rows)


@contextlib.contextmanager
def abandon_after(conn: AsyncConn, seconds: float) -> Iterator[None]:
    """Close ``conn`` and cancel the current task if the block outlives ``seconds``.

    Raises :class:`DeadlineExceeded` in place of the cancellation it caused;
    a cancellation from anyone else passes through untouched.
    """
    task = asyncio.current_task()
    assert task is not None, "abandon_after needs a running task"
    fired = False

    def expire() -> None:
        nonlocal fired
        fired = True
        # Close the socket first: the cancelled driver then skips its own
        # server-side cancel request, which a dead peer would never answer.
        conn.pgconn.finish()
        task.cancel()

    handle = asyncio.get_running_loop().call_later(seconds, expire)
    try:
        yield
    except asyncio.CancelledError:
        if fired and task.uncancel() == 0:
            raise DeadlineExceeded(f"database call abandoned after {seconds:g}s") from None
        # Cancelled by someone else mid-call: the connection may hold results
        # (or a pipeline) nobody will read. Discard it rather than hand a
        # confused connection to the next user of the pool.
        conn.pgconn.finish()
        raise
    except BaseException as exc:
        if fired:
            # The closed socket surfaced as a driver error before the cancel landed.
            task.uncancel()
            raise DeadlineExceeded(f"database call abandoned after {seconds:g}s") from exc
        raise
    finally:
        handle.cancel()
