"""The experiment starves only the app's pool: its own set-up runs under normal deadlines.

A run's app pool gets the experiment's deliberately short deadline. Creating
the domain schema and the fleet is the experiment's bookkeeping; on a busy
machine that DDL can take longer than the starved deadline, and the run must
not fail for it.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace

import psycopg

from shoal import SystemClock
from shoal_polling.experiment import ExperimentSettings, open_pools, set_up
from tests.conftest import wait_for

STARVED = replace(ExperimentSettings(), pool_size=2, deadline_s=0.2, transport_pool=1)
SCHEMA_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('shoal_polling', 0))"


async def _waited_on_the_lock_for(db_url: str, seconds: float) -> bool:
    """Whether a session has waited on an advisory lock for ``seconds``, by the server's clock."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event = 'advisory' AND now() - query_start > make_interval(secs => %s)",
            (seconds,),
        )
        row = await cur.fetchone()
        return row is not None and row[0] > 0


async def test_set_up_outlasts_a_schema_lock_held_past_the_app_pools_deadline(db_url: str) -> None:
    async with contextlib.AsyncExitStack() as stack:
        pools = await open_pools(stack, db_url, STARVED)
        assert pools.app.db.deadline.total_seconds() == STARVED.deadline_s
        async with (
            await psycopg.AsyncConnection.connect(db_url) as holder,
            holder.transaction(),
        ):
            # Another process creating the schema holds its lock: set-up waits.
            await holder.execute(SCHEMA_LOCK)
            today = SystemClock().now().date()
            setting_up = asyncio.create_task(set_up(pools.control.db, STARVED, today=today))
            # Wall clock on purpose: the starved deadline is a real socket timer.
            # Held until set-up has waited well past it (or has failed).
            await wait_for(
                lambda: (
                    setting_up.done() or _waited_on_the_lock_for(db_url, 3 * STARVED.deadline_s)
                ),
                timeout_s=30,
            )
            assert not setting_up.done(), setting_up.exception()
        await setting_up

        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            cur = await conn.execute("SELECT count(*) FROM shoal_polling.card")
            assert await cur.fetchone() == (STARVED.accounts * STARVED.cards_per_account,)
