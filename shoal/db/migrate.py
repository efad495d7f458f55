"""Versioned SQL migrations, applied under an advisory lock.

Migrations are the numbered files in ``shoal/db/migrations`` (``0001_queue.sql``),
never edited once released. Their text names the schema as ``{schema}``, bound
as an identifier. All pending migrations run in one transaction holding a
transaction-level advisory lock keyed on the schema name, so two processes
migrating at once both succeed: the second waits, then finds nothing to do.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import timedelta
from importlib import resources

from psycopg import sql

from shoal.db.pool import AsyncConn, Database
from shoal.errors import ShoalError

# Creating indexes on a large existing table can take a while.
_MIGRATION_DEADLINE = timedelta(minutes=10)
MIGRATION_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    text: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


class MigrationChanged(ShoalError):
    """A migration's text differs from the one applied: the schema is not what the code expects."""


SHOAL_MIGRATIONS = "shoal.db.migrations"


def load_migrations(package: str = SHOAL_MIGRATIONS) -> list[Migration]:
    """Every migration in ``package`` (shoal's own by default), in version order.

    Applications built on shoal keep their own tables the same way: a package
    of numbered ``NNNN_name.sql`` files, applied by :func:`migrate` to a
    schema of their own.
    """
    found = []
    for entry in resources.files(package).iterdir():
        match = MIGRATION_FILE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migration versions must run 1..N without gaps, found {versions}")
    return found


async def migrate(
    db: Database, *, package: str = SHOAL_MIGRATIONS, schema: str | None = None
) -> list[int]:
    """Bring ``schema`` (``db.schema`` by default) up to date with ``package``'s
    migrations; return the versions applied now."""
    migrations = load_migrations(package)
    name = schema or db.schema

    async def apply(conn: AsyncConn) -> list[int]:
        schema = sql.Identifier(name)
        # Index builds on a big table may take longer than a statement may.
        await conn.execute("SET LOCAL statement_timeout = 0")
        # The lock comes first: CREATE SCHEMA IF NOT EXISTS itself races
        # (two creators can both pass the existence check).
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended('shoal.migrate:' || %s, 0))",
            (name,),
        )
        await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(schema))
        await conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {}.migration ("
                " version int PRIMARY KEY,"
                " name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(schema)
        )
        # A digest of each applied file: code running against a schema built
        # from other text fails here, loudly, instead of at its first query.
        await conn.execute(
            sql.SQL("ALTER TABLE {}.migration ADD COLUMN IF NOT EXISTS checksum text").format(
                schema
            )
        )
        cur = await conn.execute(
            sql.SQL("SELECT version, checksum FROM {}.migration").format(schema)
        )
        done = {row[0]: row[1] for row in await cur.fetchall()}
        applied = []
        for migration in migrations:
            if migration.version in done:
                if done[migration.version] != migration.checksum:
                    raise MigrationChanged(
                        f"schema {name!r}: migration {migration.version:04d}_{migration.name} "
                        "differs from the one applied there (or was applied before shoal "
                        "recorded checksums); this code needs a schema built from its own "
                        f"migrations: drop it (DROP SCHEMA {name} CASCADE) and migrate again"
                    )
                continue
            await conn.execute(sql.SQL(migration.text).format(schema=schema))
            await conn.execute(
                sql.SQL(
                    "INSERT INTO {}.migration (version, name, checksum) VALUES (%s, %s, %s)"
                ).format(schema),
                (migration.version, migration.name, migration.checksum),
            )
            applied.append(migration.version)
        return applied

    return await db.run(apply, deadline=max(db.deadline, _MIGRATION_DEADLINE))
