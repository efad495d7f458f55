"""The workbench's own tables, created and upgraded at start under an advisory lock.

shoal's migration runner reads only shoal's own migration files, so the
workbench keeps the same pattern for its schema (``shoal_extract`` by
default): numbered files in ``shoal_extract/migrations``, never edited once
released; all pending ones applied in one transaction holding a transaction
advisory lock keyed on the schema name, so processes starting together all
succeed (the later ones wait, then find nothing to do).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from shoal import Database

AsyncConn = psycopg.AsyncConnection[TupleRow]

DEFAULT_SCHEMA = "shoal_extract"
MIGRATION_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    text: str


def load_migrations() -> list[Migration]:
    """The workbench's migrations in version order (1..N without gaps)."""
    found = []
    for entry in resources.files("shoal_extract.migrations").iterdir():
        match = MIGRATION_FILE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations must run 1..N without gaps: {[m.version for m in found]}")
    return found


async def ensure_schema(db: Database, schema: str = DEFAULT_SCHEMA) -> list[int]:
    """Bring the workbench's ``schema`` up to date; the versions applied now. Idempotent."""
    migrations = load_migrations()
    ident = sql.Identifier(schema)

    async def apply(conn: AsyncConn) -> list[int]:
        # The lock first: CREATE SCHEMA IF NOT EXISTS itself races.
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended('shoal_extract.migrate:' || %s, 0))",
            (schema,),
        )
        await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
        await conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {}.migration ("
                " version int PRIMARY KEY,"
                " name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(ident)
        )
        cur = await conn.execute(sql.SQL("SELECT version FROM {}.migration").format(ident))
        done = {row[0] for row in await cur.fetchall()}
        applied = []
        for migration in migrations:
            if migration.version in done:
                continue
            await conn.execute(sql.SQL(migration.text).format(schema=ident))
            await conn.execute(
                sql.SQL("INSERT INTO {}.migration (version, name) VALUES (%s, %s)").format(ident),
                (migration.version, migration.name),
            )
            applied.append(migration.version)
        return applied

    return await db.run(apply)


__all__ = ["DEFAULT_SCHEMA", "AsyncConn", "ensure_schema", "load_migrations"]
