"""Versioned SQL migrations, applied under an advisory lock.

Each layer keeps the migrations that create its tables and database
functions beside its code: ``shoal/queue/migrations``, ``shoal/batch/migrations``
and ``shoal/ingest/migrations`` hold numbered files (``0001_queue.sql``) of ONE
version sequence 1..N, which this runner collects and applies in version order
(a batch migration may call a function a queue migration created before it).

Migrations are append-only: a file, once released, is never edited, renamed to
another version or removed. A database records each applied file's name and
SHA-256 digest, and this runner refuses a schema whose record differs from the
file of the same version (:class:`MigrationChanged`). A change to the schema is
a new file with the next version; a database function whose behaviour changes
gets a new versioned name (``claim_jobs_v2``) created beside the old one, which
a later migration drops once no released worker calls it (docs/upgrading.md).

The text names the schema as ``{schema}``, bound as an identifier. All pending
migrations run in one transaction holding a transaction-level advisory lock
keyed on the schema name, so two processes migrating at once both succeed: the
second waits, then finds nothing to do. Versions a database has that this code
does not know (it was migrated by a newer release) are left alone: workers of
the previous release keep starting during a rolling upgrade.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from importlib import resources

from psycopg import sql

from shoal.db.pool import AsyncConn, Database, check_schema_name
from shoal.errors import MigrationChanged

# Creating indexes on a large existing table can take a while.
_MIGRATION_DEADLINE = timedelta(minutes=10)
MIGRATION_FILE = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    text: str
    package: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


# shoal's own migrations, one package per layer; their versions interleave.
SHOAL_MIGRATIONS = (
    "shoal.queue.migrations",
    "shoal.batch.migrations",
    "shoal.ingest.migrations",
)


def load_migrations(package: str | Sequence[str] = SHOAL_MIGRATIONS) -> list[Migration]:
    """Every migration in ``package`` (or in each of several), in version order.

    shoal's own by default: the layers' packages, whose files together run
    1..N. Applications built on shoal keep their own tables the same way: a
    package of numbered ``NNNN_name.sql`` files, applied by :func:`migrate` to
    a schema of their own.
    """
    packages = (package,) if isinstance(package, str) else tuple(package)
    found: list[Migration] = []
    for name in packages:
        for entry in resources.files(name).iterdir():
            match = MIGRATION_FILE.fullmatch(entry.name)
            if match:
                text = entry.read_text(encoding="utf-8")
                found.append(Migration(int(match[1]), match[2], text, name))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        where = ", ".join(f"{m.label} ({m.package})" for m in found)
        raise RuntimeError(f"migration versions must run 1..N once each, found {where}")
    return found


def _changed(schema: str, migration: Migration, applied_name: str, applied_sum: str | None) -> str:
    if applied_sum is None:
        what = "was applied before shoal recorded checksums"
    else:
        what = f"has checksum {applied_sum[:12]}, this code's file {migration.checksum[:12]}"
    if applied_name != migration.name:
        what += f", and was applied under the name {applied_name!r}"
    return (
        f"schema {schema!r}: migration {migration.label} ({migration.package}) differs from the "
        f"one applied there: the applied one {what}. Released migrations are never edited, so "
        "this code and the code that migrated the schema disagree about a released file: run "
        "a build of shoal whose migration files match (an edited file, or a schema migrated "
        "by an unreleased build), and see docs/upgrading.md"
    )


async def migrate(
    db: Database,
    *,
    package: str | Sequence[str] = SHOAL_MIGRATIONS,
    schema: str | None = None,
) -> list[int]:
    """Bring ``schema`` (``db.schema`` by default) up to date with the migrations
    of ``package`` (shoal's own by default); return the versions applied now."""
    name = db.schema if schema is None else check_schema_name(schema)
    migrations = load_migrations(package)

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
            sql.SQL("SELECT version, name, checksum FROM {}.migration").format(schema)
        )
        done = {row[0]: (row[1], row[2]) for row in await cur.fetchall()}
        applied = []
        for migration in migrations:
            if migration.version in done:
                applied_name, applied_sum = done[migration.version]
                if applied_sum != migration.checksum:
                    raise MigrationChanged(_changed(name, migration, applied_name, applied_sum))
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
