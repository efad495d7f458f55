"""Versioned SQL migrations, applied under an advisory lock.

Each layer keeps the migrations that create its tables and database
functions beside its code: ``shoal/queue/migrations``, ``shoal/batch/migrations``,
``shoal/ingest/migrations`` and ``shoal/workflow/migrations`` hold numbered
files (``0001_queue.sql``) of ONE version sequence 1..N, which this runner
collects and applies in version order (a batch migration may call a function
a queue migration created before it).

Migrations are append-only: a file, once released, is never edited, renamed to
another version or removed. A database records each applied file's name and
SHA-256 digest, and this runner refuses a schema whose record differs from the
file of the same version (:class:`MigrationChanged`). A change to the schema is
a new file with the next version; a database function whose behaviour changes
gets a new versioned name (``claim_jobs_v5``) created beside the old one, which
a later migration drops once no released worker calls it (docs/upgrading.md).

The text names the schema as ``{schema}``, bound as an identifier. All pending
migrations run in one transaction holding a transaction-level advisory lock
keyed on the schema name, so two processes migrating at once both succeed: the
second waits, then finds nothing to do. A run with nothing to apply (every
process start but the first after an upgrade) only reads the record of
applied migrations, taking neither that lock nor more than ACCESS SHARE.
Versions a database has that this code does not know (it was migrated by a
newer release) are left alone: workers of the previous release keep starting
during a rolling upgrade.

Running workers lock the same tables the migrations alter, each statement in
its own order (a batch claim takes the job table, then the item table; the
migrations alter the item table, then index the job table). A run that took
its locks statement by statement could hold one table while waiting for
another that a worker held while waiting for the first: a deadlock, in which
PostgreSQL aborts one side, the run or the worker. So a run with migrations to
apply first takes every table of the schema in ACCESS EXCLUSIVE mode, in one
statement, in the order the migrations created them (:func:`lock_order`),
under a total wait of ``lock_wait``; after that its DDL waits for nothing a
worker holds. When the tables are not all taken in time
(or a deadlock is reported anyway), the transaction rolls back whole and the
run tries again after a pause, up to ``tries`` times, then gives up with a
:class:`~shoal.errors.TransientError` naming the table and the tries. The
short wait matters twice: a waiting ACCESS EXCLUSIVE request queues every
later statement on its table, so the workers stall for no longer than it; and
it ends before PostgreSQL's deadlock check would pick a victim among the
workers (see :data:`DEFAULT_LOCK_WAIT`).
"""

from __future__ import annotations

import hashlib
import logging
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from importlib import resources

from psycopg import errors as pg_errors
from psycopg import sql

from shoal.clock import SYSTEM_CLOCK
from shoal.db.pool import DEFAULT_SCHEMA, AsyncConn, Database, check_schema_name
from shoal.db.releases import check_released
from shoal.errors import InvalidInput, MigrationChanged, ShoalError, TransientError

log = logging.getLogger("shoal.migrate")

# Creating indexes on a large existing table can take a while.
_MIGRATION_DEADLINE = timedelta(minutes=10)
# How long one try may wait, in all, to take the schema's tables. Half of
# PostgreSQL's default deadlock_timeout (1 s), and never more than half of the
# server's own: a worker that waits for a table this run holds, while this run
# waits for one the worker holds, checks for a deadlock only deadlock_timeout
# after it began waiting, and by then this run has given up and let it go. So
# the worker is never the one aborted. Beside the busy workers of
# tests/test_upgrade_beside_workers.py (2 cores, 20 runs) the tries that took
# the tables did so in 1-32 ms; 16 of 36 tries did not (a worker held a later
# table while waiting for an earlier one, which no wait ends). With 200 ms,
# 40 of 60 tries failed: a shorter wait also gives up on mere slowness.
DEFAULT_LOCK_WAIT = timedelta(milliseconds=500)
# Tries before a run gives up, and the pause before each next one (doubling
# from the first to the longest, jittered so that two migrators and the
# workers' rhythm do not meet again in step). 20 tries wait about 30 s in all.
DEFAULT_LOCK_TRIES = 20
_RETRY_PAUSE_FIRST = timedelta(milliseconds=50)
_RETRY_PAUSE_MAX = timedelta(seconds=2)
# No try starts this long after the run began, whatever ``tries`` allows.
_RETRY_DEADLINE = timedelta(minutes=2)
# How long the read-only check of a start waits for the record table: longer
# only while a migration holds it, and then the full run waits its turn.
_PEEK_LOCK_WAIT = "100ms"
# How many of the transactions holding the tables a run that gives up names.
_HOLDERS_SHOWN = 3
# Lock timeouts and deadlocks: another transaction held what a try needed.
_LOCK_CONFLICTS = (pg_errors.LockNotAvailable, pg_errors.DeadlockDetected)
MIGRATION_FILE = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")
CREATE_TABLE = re.compile(r"CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?\{schema\}\.(\w+)", re.I)


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
    "shoal.workflow.migrations",
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
    if packages == SHOAL_MIGRATIONS:
        check_released(found)
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


class _TablesBusy(Exception):
    """A try could not take what it needed in time; raised ``from`` the driver's error.

    Internal to this module: the transaction rolls back on it, and :func:`migrate`
    tries again or gives up with a :class:`TransientError`.
    """

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


@dataclass(frozen=True, slots=True)
class SchemaState:
    """What a database holds of a schema's migrations, read without changing anything."""

    database: str
    schema: str
    # The versions its migration table records; None when it has no such table.
    applied: frozenset[int] | None

    def pending(self, migrations: Sequence[Migration]) -> list[Migration]:
        """Those of ``migrations`` not applied yet (all of them without a migration table)."""
        return [m for m in migrations if self.applied is None or m.version not in self.applied]


async def schema_state(db: Database, *, schema: str | None = None) -> SchemaState:
    """The migrations applied to ``schema`` (``db.schema`` by default); creates nothing."""
    name = db.schema if schema is None else check_schema_name(schema)

    async def read(conn: AsyncConn) -> SchemaState:
        cur = await conn.execute(
            "SELECT current_database(), to_regclass(format('%%I.migration', %s::text)) IS NOT NULL",
            (name,),
        )
        row = await cur.fetchone()
        assert row is not None
        database, has_table = str(row[0]), bool(row[1])
        if not has_table:
            return SchemaState(database, name, None)
        cur = await conn.execute(
            sql.SQL("SELECT version FROM {}.migration").format(sql.Identifier(name))
        )
        return SchemaState(database, name, frozenset(r[0] for r in await cur.fetchall()))

    return await db.run(read)


async def require_migrated(
    db: Database, *, package: str | Sequence[str] = SHOAL_MIGRATIONS
) -> SchemaState:
    """``db``'s schema when every migration of ``package`` is applied there; else
    :class:`ShoalError` saying which are missing and to run ``shoal migrate``.

    For the commands that only read or act on what is there (``shoal status``,
    ``shoal jobs``...): they never create a schema, and a schema behind the
    code would fail them at some statement of a newer table or function.
    """
    state = await schema_state(db)
    pending = state.pending(load_migrations(package))
    if not pending:
        return state
    named = "" if state.schema == DEFAULT_SCHEMA else f" {state.schema!r}"
    if not state.applied:
        raise ShoalError(f"no shoal schema{named} in {state.database} (run shoal migrate)")
    labels = ", ".join(m.label for m in pending)
    raise ShoalError(
        f"shoal schema{named} in {state.database} lacks migrations {labels} of this "
        "release (run shoal migrate)"
    )


async def migrate(
    db: Database,
    *,
    package: str | Sequence[str] = SHOAL_MIGRATIONS,
    schema: str | None = None,
    lock_wait: timedelta = DEFAULT_LOCK_WAIT,
    tries: int = DEFAULT_LOCK_TRIES,
) -> list[int]:
    """Bring ``schema`` (``db.schema`` by default) up to date with the migrations
    of ``package`` (shoal's own by default); return the versions applied now.

    All or nothing: the pending migrations commit together or not at all.
    Idempotent, and safe beside another ``migrate`` (it waits, then finds
    nothing to do) and beside running workers: it takes the schema's tables
    within ``lock_wait`` or rolls back and tries again, ``tries`` times in all
    (see the module's docstring), logging each retry at WARNING.

    >>> applied = await migrate(db)  # doctest: +SKIP
    """
    name = db.schema if schema is None else check_schema_name(schema)
    if not lock_wait > timedelta(0):
        raise InvalidInput("lock_wait", f"must be a positive duration, got {lock_wait!r}")
    if isinstance(tries, bool) or not isinstance(tries, int) or tries < 1:
        raise InvalidInput("tries", f"must be a whole number of at least 1, got {tries!r}")
    migrations = load_migrations(package)
    if await _up_to_date(db, name, migrations):
        return []
    started = SYSTEM_CLOCK.monotonic()
    for attempt in range(1, tries + 1):
        try:
            return await db.run(
                lambda conn: _apply(conn, name, migrations, lock_wait),
                deadline=max(db.deadline, _MIGRATION_DEADLINE),
            )
        except _TablesBusy as busy:
            cause = _first_line(busy.__cause__)
            elapsed_s = SYSTEM_CLOCK.monotonic() - started
            if attempt == tries or elapsed_s >= _RETRY_DEADLINE.total_seconds():
                holders = await db.run(lambda conn: _holders(conn, name))
                raise TransientError(
                    f"schema {name!r}: migrate gave up after {attempt} tries in "
                    f"{elapsed_s:.1f} s: it could not take {busy.what} ({cause}); "
                    f"{holders}. Nothing was applied: run it again once they finish "
                    "(docs/upgrading.md)"
                ) from busy.__cause__
            pause_s = _retry_pause_s(attempt)
            log.warning(
                "schema %r: migrate could not take %s (%s); rolled back, try %d of %d in %.2f s",
                name,
                busy.what,
                cause,
                attempt + 1,
                tries,
                pause_s,
            )
            await SYSTEM_CLOCK.sleep(pause_s)
    raise AssertionError("unreachable")  # pragma: no cover


async def _holders(conn: AsyncConn, name: str) -> str:
    """Which other transactions hold the tables of schema ``name`` (the oldest first)."""
    cur = await conn.execute(
        "SELECT DISTINCT ON (a.pid) a.pid, coalesce(a.state, '?'), a.xact_start,"
        " n.nspname || '.' || c.relname, l.mode"
        " FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
        " JOIN pg_class c ON c.oid = l.relation JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE l.granted AND l.pid <> pg_backend_pid() AND n.nspname = %s"
        " AND c.relkind IN ('r', 'p')"
        " ORDER BY a.pid, c.relname",
        (name,),
    )
    rows = sorted(await cur.fetchall(), key=lambda row: (row[2] is None, row[2]))
    if not rows:
        return "no other transaction holds them now"
    held = "; ".join(
        f"pid {pid} ({state}, in a transaction since {since:%Y-%m-%d %H:%M:%S%z}) holds "
        f"{mode} on {table}"
        for pid, state, since, table, mode in rows[:_HOLDERS_SHOWN]
    )
    more = f"; and {len(rows) - _HOLDERS_SHOWN} more" if len(rows) > _HOLDERS_SHOWN else ""
    return f"other transactions hold them: {held}{more}"


def _first_line(exc: BaseException | None) -> str:
    return str(exc).strip().splitlines()[0] if exc is not None and str(exc).strip() else "?"


def _retry_pause_s(attempt: int) -> float:
    """The pause after failed try ``attempt`` (1, 2, ...): doubling, capped, jittered."""
    first = _RETRY_PAUSE_FIRST.total_seconds()
    longest = _RETRY_PAUSE_MAX.total_seconds()
    return min(longest, first * 2.0 ** (attempt - 1)) * random.uniform(0.5, 1.0)


async def _up_to_date(db: Database, name: str, migrations: list[Migration]) -> bool:
    """Whether schema ``name`` records every one of ``migrations`` applied, by reading alone.

    The common case of every process start: nothing to apply. Read without
    the advisory lock and without the DDL that makes sure the record table
    exists, which takes that table in ACCESS EXCLUSIVE mode. A start then
    waits for no other start, and not for a transaction that only reads the
    schema's tables: pg_dump holds ACCESS SHARE on every table it dumps for
    the whole dump. A record that differs from its file raises
    :class:`MigrationChanged` here as it does in a full run.

    False when anything is missing (a new schema, a record table of an older
    release, a pending migration), or when the read could not be made at
    once (a migration under way holds the table): the full run decides.
    """

    async def read(conn: AsyncConn) -> dict[int, tuple[str, str | None]] | None:
        await conn.execute("SELECT set_config('lock_timeout', %s, true)", (_PEEK_LOCK_WAIT,))
        return await _recorded(conn, name) if await _records_digests(conn, name) else None

    try:
        done = await db.run(read)
    except TransientError:
        return False
    return done is not None and not _pending(name, migrations, done)


async def _records_digests(conn: AsyncConn, name: str) -> bool:
    """Whether schema ``name`` has a migration record table with its digest column."""
    cur = await conn.execute(
        "SELECT EXISTS (SELECT FROM pg_attribute"
        " WHERE attrelid = to_regclass(%s) AND attname = 'checksum' AND NOT attisdropped)",
        (sql.Identifier(name, "migration").as_string(conn),),
    )
    row = await cur.fetchone()
    return row is not None and bool(row[0])


async def _recorded(conn: AsyncConn, name: str) -> dict[int, tuple[str, str | None]]:
    """Schema ``name``'s record of applied migrations: version -> (name, digest)."""
    cur = await conn.execute(
        sql.SQL("SELECT version, name, checksum FROM {}.migration").format(sql.Identifier(name))
    )
    return {version: (applied, digest) for version, applied, digest in await cur.fetchall()}


def _wait_ms(lock_wait: timedelta) -> int:
    return max(1, int(lock_wait.total_seconds() * 1000))


def _pending(
    name: str, migrations: list[Migration], done: dict[int, tuple[str, str | None]]
) -> list[Migration]:
    """Those of ``migrations`` not in ``done`` (version: name, digest); raises on a changed one."""
    pending = []
    for migration in migrations:
        if migration.version in done:
            applied_name, applied_sum = done[migration.version]
            if applied_sum != migration.checksum:
                raise MigrationChanged(_changed(name, migration, applied_name, applied_sum))
        else:
            pending.append(migration)
    return pending


async def _apply(
    conn: AsyncConn, name: str, migrations: list[Migration], lock_wait: timedelta
) -> list[int]:
    """One try, in the caller's transaction: the versions applied."""
    schema = sql.Identifier(name)
    # Index builds on a big table may take longer than a statement may. The
    # advisory lock is waited for without a lock_timeout (whatever the role's
    # setting): another migrate holds it for its whole run.
    await conn.execute(
        "SELECT set_config('statement_timeout', '0', true), set_config('lock_timeout', '0', true)"
    )
    # The lock comes first: CREATE SCHEMA IF NOT EXISTS itself races
    # (two creators can both pass the existence check).
    await conn.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('shoal.migrate:' || %s, 0))",
        (name,),
    )
    await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(schema))
    # A digest of each applied file: code running against a schema built
    # from other text fails here, loudly, instead of at its first query.
    # (IF NOT EXISTS takes no lock on a table that exists.)
    await conn.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.migration ("
            " version int PRIMARY KEY,"
            " name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now(),"
            " checksum text)"
        ).format(schema)
    )
    if not await _records_digests(conn, name):
        # The record of a release before digests. ALTER TABLE takes it in
        # ACCESS EXCLUSIVE mode even when there is nothing to add, so only
        # then, and waiting no longer than for the other tables: a dump in
        # progress holds every table.
        await conn.execute(
            "SELECT set_config('lock_timeout', %s, true)", (f"{_wait_ms(lock_wait)}ms",)
        )
        try:
            await conn.execute(
                sql.SQL("ALTER TABLE {}.migration ADD COLUMN checksum text").format(schema)
            )
        except _LOCK_CONFLICTS as exc:
            raise _TablesBusy(f"the migration record table of {name!r}") from exc
        await conn.execute("SELECT set_config('lock_timeout', '0', true)")
    pending = _pending(name, migrations, await _recorded(conn, name))
    if not pending:
        return []
    wait_ms = await _lock_tables(conn, name, lock_order(migrations), lock_wait)
    # Past the tables, a statement waits no longer than they did: nothing it
    # waits for queues the workers behind it for long.
    await conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{wait_ms}ms",))
    for migration in pending:
        try:
            await conn.execute(sql.SQL(migration.text).format(schema=schema))
        except _LOCK_CONFLICTS as exc:
            raise _TablesBusy(f"the locks of migration {migration.label}") from exc
        await conn.execute(
            sql.SQL(
                "INSERT INTO {}.migration (version, name, checksum) VALUES (%s, %s, %s)"
            ).format(schema),
            (migration.version, migration.name, migration.checksum),
        )
    return [m.version for m in pending]


def lock_order(migrations: Sequence[Migration]) -> list[str]:
    """The tables ``migrations`` create, in the order they first create them.

    The order a run takes the schema's tables in: the order the layers build on
    one another, which is the order the workers take them. A batch claim takes
    the job table and only then the item and task tables, a completion the job
    table and then the item table; a run that took the item table first and
    then waited for the job table would wait for a claim that waits for it.
    A table created again under its name (0010's job_archive) keeps its place.
    """
    order: dict[str, None] = {}
    for migration in migrations:
        order.update(dict.fromkeys(CREATE_TABLE.findall(migration.text)))
    return list(order)


async def _lock_tables(conn: AsyncConn, name: str, order: list[str], lock_wait: timedelta) -> int:
    """Take every table of schema ``name`` in ACCESS EXCLUSIVE mode, those of
    ``order`` first and in its order, then any other in name order, in one
    statement that may wait ``lock_wait`` in all (at most half the server's
    deadlock_timeout); return that wait in milliseconds. Raises
    :class:`_TablesBusy` when it passes.

    One statement, so that no round trip lengthens the time it holds the first
    tables while it asks for the next: a worker that takes them in another
    order has that much less time to start waiting on it.
    """
    cur = await conn.execute(
        "SELECT c.relname, (SELECT setting::int FROM pg_settings WHERE name = 'deadlock_timeout')"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " LEFT JOIN unnest(%s::text[]) WITH ORDINALITY AS o(relname, rank)"
        " ON o.relname = c.relname"
        " WHERE n.nspname = %s AND c.relkind IN ('r', 'p') AND c.relname <> 'migration'"
        ' ORDER BY o.rank NULLS LAST, c.relname COLLATE "C"',
        (order, name),
    )
    rows = await cur.fetchall()
    wait_ms = _wait_ms(lock_wait)
    if not rows:
        return wait_ms
    wait_ms = max(1, min(wait_ms, int(rows[0][1]) // 2))
    # lock_timeout bounds each table's wait, statement_timeout all of them.
    await conn.execute(
        "SELECT set_config('lock_timeout', %s, true), set_config('statement_timeout', %s, true)",
        (f"{wait_ms}ms", f"{wait_ms}ms"),
    )
    tables = sql.SQL(", ").join(sql.Identifier(name, table) for table, _ in rows)
    try:
        await conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(tables))
    except (*_LOCK_CONFLICTS, pg_errors.QueryCanceled) as exc:
        raise _TablesBusy(f"the {len(rows)} tables of {name!r} within {wait_ms} ms") from exc
    await conn.execute("SET LOCAL statement_timeout = 0")
    return wait_ms
