"""A synchronous connection pool, for code without an event loop (scripts, Django, Flask).

The same connection settings as :class:`~shoal.db.pool.Database` and the
same translation of driver errors. Its deadline is the server's
``statement_timeout`` and the kernel's ``tcp_user_timeout`` (a blocking call
has no event loop to close its socket from outside).

Work runs on a cursor made here rather than the connection's own cursor
factory: a caller's connection may come from a framework that configures it
for itself (Django's makes client-side-binding cursors and loads ``jsonb``
as text), while shoal's statements need server-side binding and parsed JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import psycopg
import psycopg_pool
from psycopg.rows import TupleRow, tuple_row
from psycopg.types.json import JsonbLoader, JsonLoader

from shoal.db.pool import (
    DEFAULT_DEADLINE,
    DEFAULT_PREPARE_THRESHOLD,
    DEFAULT_SCHEMA,
    check_schema_name,
    connect_failure,
    connection_kwargs,
    translated,
)
from shoal.errors import ShoalError

T = TypeVar("T")
# A caller's connection: any row factory; shoal reads through cursors of its own.
SyncConn = psycopg.Connection[Any]
SyncCursor = psycopg.Cursor[TupleRow]
# A script or a web process sends from a few threads at a time.
DEFAULT_SYNC_POOL_SIZE = 4


def shoal_cursor(conn: SyncConn) -> SyncCursor:
    """A cursor on ``conn`` that binds on the server and returns tuples with parsed JSON."""
    cur = psycopg.Cursor(conn, row_factory=tuple_row)
    # The cursor's own copy of the connection's adapters: the caller's stay as they are.
    cur.adapters.register_loader("jsonb", JsonbLoader)
    cur.adapters.register_loader("json", JsonLoader)
    return cur


class SyncDatabase:
    """A pool of synchronous connections to one database and the schema shoal lives in.

    >>> db = SyncDatabase("postgresql://127.0.0.1/app").open()   # doctest: +SKIP
    """

    def __init__(
        self,
        url: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        min_size: int = 1,
        max_size: int = DEFAULT_SYNC_POOL_SIZE,
        deadline: timedelta = DEFAULT_DEADLINE,
        application_name: str = "shoal-sync",
        prepare_threshold: int | None = DEFAULT_PREPARE_THRESHOLD,
    ) -> None:
        self.url = url
        self.schema = check_schema_name(schema)
        self.deadline = deadline
        self._kwargs = connection_kwargs(deadline, application_name, prepare_threshold)
        self.pool: psycopg_pool.ConnectionPool[psycopg.Connection[TupleRow]] = (
            psycopg_pool.ConnectionPool(
                url,
                min_size=min_size,
                max_size=max_size,
                kwargs=self._kwargs,
                open=False,
                timeout=deadline.total_seconds(),
                name=f"shoal-sync:{schema}",
            )
        )

    def open(self) -> SyncDatabase:
        """Check that a connection can be made and the schema is migrated; start the pool.

        Raises :class:`~shoal.errors.CannotConnect` naming the cause when the first
        connection fails, and :class:`ShoalError` when the schema has no
        shoal tables yet (run ``shoal migrate``, or start a worker, first).
        """
        try:
            conn = psycopg.connect(self.url, **self._kwargs)
        except psycopg.Error as exc:
            raise connect_failure(exc, self.url) from exc
        with conn, translated():
            row = conn.execute(
                "SELECT to_regclass(format('%%I.queue_default', %s::text)) IS NOT NULL",
                (self.schema,),
            ).fetchone()
        if not row or not row[0]:
            raise ShoalError(
                f"schema {self.schema!r} holds no up-to-date shoal tables: run `shoal migrate` "
                "(a worker's start migrates too) before sending from a synchronous client"
            )
        with translated():
            self.pool.open(wait=False)
        return self

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> SyncDatabase:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def on(self, conn: SyncConn | None, work: Callable[[SyncCursor], T]) -> T:
        """``work`` on the caller's connection, inside its transaction, without committing;
        else on a pooled connection in a transaction of its own, committed on return."""
        with translated():
            if conn is not None:
                with shoal_cursor(conn) as cur:
                    return work(cur)
            with (
                self.pool.connection() as pooled,
                pooled.transaction(),
                shoal_cursor(pooled) as cur,
            ):
                return work(cur)
