"""``migrate`` beside the previous release's running workers succeeds every time.

docs/upgrading.md says the migration runs while workers run. The previous
release's workers (its own statements, tests/upgrade/e3c978a_queries, as in
tests/test_upgrade.py) keep sending, claiming and completing jobs and batch
items, and closing tasks, while ``migrate`` brings their database from that
release's schema (tests/upgrade/e3c978a.sql) to this one's. Their statements
lock the job, item and task tables in their own orders; the migrations lock
the same tables for DDL. Before a run took its tables up front, in one order
and under a short wait, 9 and 10 of 10 rounds deadlocked (the run rolled back,
or an old worker's statement was the deadlock's victim).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from shoal.db import Database, migrate
from shoal.db.migrate import load_migrations
from shoal.errors import InvalidInput, TransientError
from shoal.queue.options import JobOptions
from shoal.queue.rows import JobSettings

from .conftest import RUN_ID, create_database, drop_database, hold_like_pg_dump, with_dbname
from .test_embedded_and_cli import shoal_cli
from .test_upgrade import RELEASED, new_task, previous_release, restore

ROUNDS = 10
BATCH_WORKERS = 3
QUEUE_WORKERS = 2
ITEMS_PER_TASK = 20
CLAIM = 4
# What each old worker must still do after the migration, to show it kept working.
OPS_AFTER = 3
WAIT_S = 30.0


@pytest.fixture(scope="module")
def released_template(pg_server: str) -> Iterator[str]:
    """A database of the previous release (the upgrade fixture), to clone for each round."""
    name = f"shoal_released_{RUN_ID}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        restore(with_dbname(pg_server, name))
        yield name
    finally:
        drop_database(pg_server, name)


@dataclass
class OldWorkers:
    """The previous release's workers: each loop on a connection of its own.

    ``ops`` is written by each loop after every statement that did work and
    read by the test through ``progressed``; ``errors`` collects what any
    statement of theirs raised (an old worker would retry; the test wants none
    but the one :func:`is_rebuilt_row_type` describes).
    """

    url: str
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    ops: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    def __post_init__(self) -> None:
        self.queue_sql = previous_release("queue")
        self.batch_sql = previous_release("batch")

    async def progressed(self, at_least: dict[str, int]) -> None:
        """Return once every loop has done at least its number of operations."""
        async with asyncio.timeout(WAIT_S), self.changed:
            await self.changed.wait_for(
                lambda: all(self.ops.get(name, 0) >= n for name, n in at_least.items())
            )

    async def _did(self, name: str) -> None:
        async with self.changed:
            self.ops[name] = self.ops.get(name, 0) + 1
            self.changed.notify_all()

    async def _loop(self, name: str, step: Any) -> None:
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            while not self.stop.is_set():
                try:
                    await step(conn, name)
                except psycopg.Error as exc:
                    self.errors.append(f"{name}: {exc.sqlstate} {str(exc).strip()}")

    async def _run(
        self, conn: psycopg.AsyncConnection[Any], query: Any, **params: Any
    ) -> list[Any]:
        cur = await conn.execute(query, params)
        return await cur.fetchall() if cur.description else []

    async def batch_step(self, conn: psycopg.AsyncConnection[Any], name: str) -> None:
        """Create a task of items, claim and complete them a few at a time, close it."""
        queue = f"upgrade.load.{name}"
        ((task_id,),) = await self._run(
            conn, self.batch_sql["insert_task"], **{**new_task(queue), "now": None}
        )
        await self._run(
            conn,
            self.batch_sql["insert_items"],
            task_id=task_id,
            refs=[f"{name}-{n}" for n in range(ITEMS_PER_TASK)],
            data=[],
            now=None,
            **JobSettings.of(queue, JobOptions()).params(),
        )
        while not self.stop.is_set():
            rows = await self._run(
                conn, self.batch_sql["claim_items"], queue=queue, limit=CLAIM, now=None
            )
            if not rows:
                break
            await self._run(
                conn,
                self.batch_sql["complete_items"],
                ids=[r[15] for r in rows],
                attempts=[r[16] for r in rows],
                results=[],
                job_ids=[r[0] for r in rows],
                job_attempts=[r[4] for r in rows],
                now=None,
            )
            await self._did(name)
        await self._run(conn, self.batch_sql["close_tasks"], limit=10, now=None)

    async def queue_step(self, conn: psycopg.AsyncConnection[Any], name: str) -> None:
        """Send a few jobs, claim them and complete them."""
        queue = f"upgrade.load.{name}"
        params: dict[str, Any] = {
            key: [value] for key, value in JobSettings.of(queue, JobOptions()).params().items()
        }
        await self._run(
            conn,
            self.queue_sql["insert_jobs"],
            **params,
            option_set=[1] * CLAIM,
            data=[f'{{"n": {n}}}' for n in range(CLAIM)],
            singleton_key=[],
            now=None,
        )
        rows = await self._run(
            conn, self.queue_sql["claim_jobs"], queue=queue, limit=CLAIM, now=None
        )
        await self._run(
            conn,
            self.queue_sql["complete_jobs"],
            ids=[r[0] for r in rows],
            attempts=[r[4] for r in rows],
            outputs=[],
            now=None,
        )
        await self._did(name)

    def start(self) -> list[asyncio.Task[None]]:
        loops = [(f"batch{n}", self.batch_step) for n in range(BATCH_WORKERS)]
        loops += [(f"queue{n}", self.queue_step) for n in range(QUEUE_WORKERS)]
        self.ops = {name: 0 for name, _ in loops}
        return [asyncio.create_task(self._loop(name, step)) for name, step in loops]


def is_rebuilt_row_type(error: str) -> bool:
    """A claim that waited inside claim_jobs or take_jobs (or the batch claim_items
    built on them) while migration 4 rebuilt the job table, whose row type they
    return, and dropped and created them again.

    Such a statement fails once, when it wakes ("cache lookup failed for type",
    or "could not open relation with OID" for the dropped table a batch claim
    had planned against), and changes nothing; its worker's next claim calls
    the new functions. That is the released migration's doing, whichever way
    the run takes its locks.
    """
    row_type = "XX000 cache lookup failed for type" in error and (
        'SQL function "claim_jobs"' in error or 'SQL function "take_jobs"' in error
    )
    dropped_table = (
        "XX000 could not open relation with OID" in error and 'SQL function "claim_items"' in error
    )
    return row_type or dropped_table


async def migrate_beside_old_workers(pg_server: str, template: str) -> str | None:
    """One round: a database of the previous release, its workers busy, ``migrate``.

    Returns what went wrong, or None.
    """
    name = create_database(pg_server, template)
    url = with_dbname(pg_server, name)
    workers = OldWorkers(url)
    loops = workers.start()
    try:
        await workers.progressed({loop: 1 for loop in workers.ops})
        try:
            async with Database(url) as db:
                applied = await migrate(db)
        except Exception as exc:
            return f"migrate raised {type(exc).__name__}: {exc}"
        pending = [m.version for m in load_migrations() if m.version not in RELEASED]
        if applied != pending:
            return f"migrate applied {applied}, not {pending}"
        # The old workers keep working on the upgraded schema.
        await workers.progressed({loop: n + OPS_AFTER for loop, n in workers.ops.items()})
        failed = [error for error in workers.errors if not is_rebuilt_row_type(error)]
        if failed:
            return f"the old workers failed: {failed}"
        return None
    finally:
        workers.stop.set()
        await asyncio.gather(*loops)
        drop_database(pg_server, name)


async def test_migrate_beside_the_previous_releases_busy_workers_succeeds_every_time(
    pg_server: str, released_template: str
) -> None:
    outcomes = [
        await migrate_beside_old_workers(pg_server, released_template) for _ in range(ROUNDS)
    ]
    failed = [f"round {n}: {what}" for n, what in enumerate(outcomes) if what is not None]
    assert not failed, f"{len(failed)} of {ROUNDS} rounds failed:\n" + "\n".join(failed)


async def test_migrate_that_cannot_take_the_tables_gives_up_naming_who_holds_them(
    empty_db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A transaction left open on a table keeps every try from taking it: after
    its tries the run says so, names the holder, and has applied nothing."""
    restore(empty_db_url)
    async with (
        await psycopg.AsyncConnection.connect(empty_db_url) as holder,
        Database(empty_db_url) as db,
    ):
        await holder.execute("SELECT count(*) FROM shoal.item")  # ACCESS SHARE, kept
        with (
            caplog.at_level(logging.WARNING, logger="shoal.migrate"),
            pytest.raises(TransientError) as failure,
        ):
            await migrate(db, lock_wait=timedelta(milliseconds=50), tries=2)
        message = str(failure.value)
        assert "gave up after 2 tries" in message, message
        assert f"pid {holder.info.backend_pid} (idle in transaction" in message, message
        assert "holds AccessShareLock on shoal.item" in message, message
        retries = [r.getMessage() for r in caplog.records if r.name == "shoal.migrate"]
        assert len(retries) == 1 and "try 2 of 2" in retries[0], retries
        cur = await holder.execute("SELECT version FROM shoal.migration ORDER BY version")
        assert [v for (v,) in await cur.fetchall()] == RELEASED
        # Once the holder finishes, the same run goes through.
        await holder.rollback()
        assert await migrate(db, lock_wait=timedelta(milliseconds=50), tries=2) == [
            m.version for m in load_migrations() if m.version not in RELEASED
        ]


async def test_migrate_beside_a_dump_in_progress_gives_up_naming_it_instead_of_hanging(
    empty_db_url: str,
) -> None:
    """pg_dump holds every table, the migration record's too, until it ends.

    The record's ALTER TABLE used to wait for it with no limit, holding the
    schema's advisory lock: the run never returned, and every start of the
    new release queued behind it."""
    restore(empty_db_url)
    async with (
        await psycopg.AsyncConnection.connect(empty_db_url) as dump,
        Database(empty_db_url) as db,
    ):
        await hold_like_pg_dump(dump)
        with pytest.raises(TransientError) as failure:
            await asyncio.wait_for(
                migrate(db, lock_wait=timedelta(milliseconds=50), tries=2), timeout=60
            )
        message = str(failure.value)
        assert "gave up after 2 tries" in message, message
        assert f"pid {dump.info.backend_pid} (idle in transaction" in message, message
        cur = await dump.execute("SELECT version FROM shoal.migration ORDER BY version")
        assert [v for (v,) in await cur.fetchall()] == RELEASED
        await dump.rollback()  # the dump ends
        assert await migrate(db, lock_wait=timedelta(milliseconds=50), tries=2) == [
            m.version for m in load_migrations() if m.version not in RELEASED
        ]


async def test_shoal_migrate_that_gives_up_exits_2_saying_so_and_applies_nothing(
    empty_db_url: str,
) -> None:
    """The deploy step: ``shoal migrate`` with its own --lock-wait and --tries."""
    restore(empty_db_url)
    async with await psycopg.AsyncConnection.connect(empty_db_url) as holder:
        await holder.execute("SELECT count(*) FROM shoal.job")  # ACCESS SHARE, kept
        done = await asyncio.to_thread(
            shoal_cli,
            "migrate",
            "--lock-wait",
            "0.05",
            "--tries",
            "2",
            env={"DATABASE_URL": empty_db_url, "COLUMNS": "60"},
        )
        assert done.returncode == 2, done
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, done
        assert "migrate gave up after 2 tries" in errors[0], errors
        assert f"pid {holder.info.backend_pid} " in errors[0], errors
        cur = await holder.execute("SELECT version FROM shoal.migration ORDER BY version")
        assert [v for (v,) in await cur.fetchall()] == RELEASED


@pytest.mark.parametrize(
    ("field", "options"),
    [("tries", {"tries": 0}), ("lock_wait", {"lock_wait": timedelta(0)})],
)
async def test_migrate_refuses_a_lock_wait_or_tries_it_cannot_honour(
    db_url: str, field: str, options: dict[str, Any]
) -> None:
    async with Database(db_url) as db:
        with pytest.raises(InvalidInput) as refused:
            await migrate(db, **options)
    assert refused.value.field == field
