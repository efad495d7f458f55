"""The App of the worker-selection and shutdown process tests (tests/test_worker_duties.py).

- ``duty_light`` and ``duty_heavy`` return ``{"pid": <worker pid>}``: which
  process ran a job is on the job.
- ``duty_block`` records its start in ``public.duty_started`` and then waits
  until its process stops it.
- batch kind ``duty.items``: each item does the same.

A test chooses what each process runs with ``--queues`` and
``--exclude-queues``, and stops it with signals.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from shoal import Job, Shoal
from shoal.app import App
from shoal.batch.item import Item
from shoal.db.pool import AsyncConn

PID = os.getpid()
SETUP_LOCK_KEY = 7_254_002

app = App()
_boss: Shoal | None = None


@app.on_start
async def prepare(boss: Shoal) -> None:
    global _boss
    _boss = boss

    async def setup(conn: AsyncConn) -> None:
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (SETUP_LOCK_KEY,))
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS public.duty_started "
            "(what text NOT NULL, id bigint NOT NULL, pid int NOT NULL)"
        )

    await boss.db.run(setup)


async def _started(what: str, id_: int) -> None:
    assert _boss is not None, "the start hook runs before any handler"

    async def record(conn: AsyncConn) -> None:
        await conn.execute(
            "INSERT INTO public.duty_started (what, id, pid) VALUES (%s, %s, %s)", (what, id_, PID)
        )

    await _boss.db.run(record)


@app.handler("duty_light")
async def light(job: Job) -> dict[str, Any]:
    return {"pid": PID}


@app.handler("duty_heavy")
async def heavy(job: Job) -> dict[str, Any]:
    return {"pid": PID}


@app.handler("duty_block", concurrency=2)
async def block(job: Job) -> None:
    await _started("job", job.id)
    await asyncio.Event().wait()  # until the process's shutdown cancels it


@app.batch("duty.items", concurrency=2)
async def item(item: Item) -> None:
    await _started("item", item.id)
    await asyncio.Event().wait()
