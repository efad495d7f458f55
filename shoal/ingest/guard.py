"""The out-of-order guard: an observation older than the last one applied changes nothing.

Messages are delivered at least once and in no particular order (a retry
waits on the delay ladder while a newer observation of the same card goes
through). Status-like state must therefore only move forward in observation
time. Call :func:`newer_than_applied` inside the apply transaction: it locks
the entity's row, and the caller updates state (and the applied time) only
when it returns True. The sync path calls the same function, so both paths
accept and refuse the same observations.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from psycopg import sql

from shoal.db.pool import AsyncConn
from shoal.errors import NotFound

log = logging.getLogger("shoal.ingest.guard")


def _identifier(name: str) -> sql.Identifier:
    return sql.Identifier(*name.split("."))


async def newer_than_applied(
    conn: AsyncConn,
    *,
    table: str,
    key_column: str,
    key: Any,
    applied_column: str,
    observed_at: datetime,
    what: str = "observation",
) -> bool:
    """Lock ``table``'s row ``key_column = key``; True if ``observed_at`` is newer than its
    ``applied_column`` (or that is NULL). False, logged at DEBUG, when it is not.

    Raises :class:`NotFound` when the row does not exist (a business error:
    acknowledged, not retried).
    """
    query = sql.SQL("SELECT {applied} FROM {table} WHERE {key} = %s FOR UPDATE").format(
        applied=_identifier(applied_column),
        table=_identifier(table),
        key=_identifier(key_column),
    )
    cur = await conn.execute(query, (key,))
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"{table}: no row with {key_column} = {key!r}")
    applied: datetime | None = row[0]
    if applied is not None and observed_at <= applied:
        # DEBUG: out-of-order observations are routine, one line per message would flood.
        log.debug(
            "%s for %s=%r observed at %s is not newer than the applied %s; ignored",
            what,
            key_column,
            key,
            observed_at.isoformat(),
            applied.isoformat(),
        )
        return False
    return True
