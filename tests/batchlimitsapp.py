"""The App that worker subprocesses of tests/test_batch_limits.py run.

    python -m shoal.cli --database-url URL worker --app tests.batchlimitsapp:app

Two batch kinds:

- ``lim.items``: 5 handlers per process, at most 2 items running across every
  process (``global_concurrency=2``);
- ``lim.shared``: 2 handlers per process, at most 3 items running across
  every process: one process alone can never reach 3, so reaching it shows
  two processes counted against one limit.

Each handler counts itself in its kind's row of ``public.batch_lim_running``
when it starts and out before it returns, and the row keeps the most counted
in at once: a count taken inside the handlers, so it can only be lower than
the runs really overlapping, never higher. Each item sleeps
``data["sleep_ms"]`` so that runs overlap.

On start, each process records itself as procapp's processes do.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from shoal import App, Shoal
from shoal.batch.item import Item
from shoal.db.pool import AsyncConn
from tests.procapp import prepare

PID = os.getpid()

app = App()
app.on_start(prepare)
_boss: list[Shoal] = []


@app.on_start
async def create_counter(boss: Shoal) -> None:
    _boss.append(boss)

    async def setup(conn: AsyncConn) -> None:
        await conn.execute("SELECT pg_advisory_xact_lock(35035)")
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS public.batch_lim_running ("
            " kind text PRIMARY KEY, running int NOT NULL, peak int NOT NULL, runs int NOT NULL)"
        )
        await conn.execute(
            "INSERT INTO public.batch_lim_running VALUES ('lim.items', 0, 0, 0),"
            " ('lim.shared', 0, 0, 0) ON CONFLICT DO NOTHING"
        )

    await boss.db.run(setup)


async def count(kind: str, change: int) -> None:
    async def write(conn: AsyncConn) -> None:
        await conn.execute(
            "UPDATE public.batch_lim_running SET running = running + %s,"
            " peak = greatest(peak, running + %s), runs = runs + greatest(%s, 0) WHERE kind = %s",
            (change, change, change, kind),
        )

    await _boss[0].db.run(write)


async def run_item(item: Item) -> dict[str, Any]:
    await count(item.kind, +1)
    try:
        await asyncio.sleep(item.data["sleep_ms"] / 1000)  # noqa: TID251 - simulated work, so that runs overlap
    finally:
        await count(item.kind, -1)
    return {"pid": PID}


app.batch("lim.items", concurrency=5, global_concurrency=2)(run_item)
app.batch("lim.shared", concurrency=2, global_concurrency=3)(run_item)
