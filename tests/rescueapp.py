"""The App of tests/test_rescue_processes.py: jobs and batch items that block.

    python -m shoal.cli --database-url URL worker --app tests.rescueapp:app

Each run of a job of ``rescue.jobs`` or of an item of ``rescue.items`` adds a
row to ``rescue_run`` (kind, id, attempt, pid) before anything else. In a
process started with ``RESCUEAPP_BLOCK=1`` the handler then waits forever (the
test SIGKILLs it); elsewhere it returns ``{"pid": <pid>}`` at once.
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from typing import Any

from shoal import App, Job, Shoal
from shoal.batch.item import Item
from shoal.db.pool import AsyncConn

PID = os.getpid()
BLOCK = os.environ.get("RESCUEAPP_BLOCK") == "1"
# Short, as the workers' rescue_after in the test (6 s): the task row keeps the
# zombie timeout of the process that creates it (the test's), so it is fixed
# here rather than read from the environment.
ZOMBIE_TIMEOUT = timedelta(seconds=6)
JOB_QUEUE = "rescue.jobs"
KIND = "rescue.items"
# Serialises the CREATE TABLE of processes starting together.
SETUP_LOCK_KEY = 7_254_035

app = App()
# The worker process's client, set by the start hook.
_boss: list[Shoal] = []


@app.on_start
async def prepare(boss: Shoal) -> None:
    _boss.append(boss)

    async def setup(conn: AsyncConn) -> None:
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (SETUP_LOCK_KEY,))
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS public.rescue_run ("
            " kind text NOT NULL, id bigint NOT NULL, attempt int NOT NULL, pid int NOT NULL,"
            " at timestamptz NOT NULL DEFAULT clock_timestamp())"
        )

    await boss.db.run(setup)


async def ran(kind: str, run_id: int, attempt: int) -> dict[str, Any]:
    async def record(conn: AsyncConn) -> None:
        await conn.execute(
            "INSERT INTO public.rescue_run (kind, id, attempt, pid) VALUES (%s, %s, %s, %s)",
            (kind, run_id, attempt, PID),
        )

    await _boss[0].db.run(record)
    if BLOCK:
        await asyncio.Event().wait()  # held until the test kills this process
    return {"pid": PID}


@app.handler(JOB_QUEUE, concurrency=10)
async def run_job(job: Job) -> dict[str, Any]:
    return await ran("job", job.id, job.attempt)


@app.batch(
    KIND, concurrency=10, retry_delay=timedelta(milliseconds=100), zombie_timeout=ZOMBIE_TIMEOUT
)
async def run_item(item: Item) -> dict[str, Any]:
    return await ran("item", item.id, item.attempt)
