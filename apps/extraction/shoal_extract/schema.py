"""The workbench's own tables, created and upgraded at start.

The workbench keeps them the way shoal keeps its own: numbered files in
``shoal_extract/migrations``, never edited once released, applied by shoal's
migration runner to a schema of their own (``shoal_extract`` by default) in
one transaction under an advisory lock keyed on the schema name, so processes
starting together all succeed (the later ones wait, then find nothing to do).
"""

from __future__ import annotations

import psycopg
from psycopg.rows import TupleRow

from shoal import Database, migrate

AsyncConn = psycopg.AsyncConnection[TupleRow]

DEFAULT_SCHEMA = "shoal_extract"
MIGRATIONS = "shoal_extract.migrations"


async def ensure_schema(db: Database, schema: str = DEFAULT_SCHEMA) -> list[int]:
    """Bring the workbench's ``schema`` up to date; the versions applied now. Idempotent."""
    return await migrate(db, package=MIGRATIONS, schema=schema)


__all__ = ["DEFAULT_SCHEMA", "AsyncConn", "ensure_schema"]
