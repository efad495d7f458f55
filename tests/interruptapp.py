"""An app for shutdown tests: ``shoal worker --app tests.interruptapp:app``.

Its batch item handler and its plain job handler each record a run in a table
of their own, then block on their first run (until the worker's shutdown cuts
them off) and return at once on any later run.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import psycopg

from shoal import App, Shoal
from shoal.batch.item import Item
from shoal.queue.job import Job

app = App()
_url: list[str] = []


@app.on_start
async def create_runs_table(boss: Shoal) -> None:
    _url.append(boss.db.url)
    async with await psycopg.AsyncConnection.connect(boss.db.url, autocommit=True) as conn:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS handler_run ("
            " what text NOT NULL, id bigint NOT NULL, attempt int NOT NULL, pid int NOT NULL)"
        )


async def record_run(what: str, id_: int, attempt: int) -> bool:
    """Record this run; True when it is the first one of ``id_``."""
    async with await psycopg.AsyncConnection.connect(_url[0], autocommit=True) as conn:
        cur = await conn.execute(
            "WITH earlier AS (SELECT count(*) AS n FROM handler_run WHERE what = %s AND id = %s), "
            "ins AS (INSERT INTO handler_run VALUES (%s, %s, %s, %s)) SELECT n FROM earlier",
            (what, id_, what, id_, attempt, os.getpid()),
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row[0]) == 0


@app.batch("interrupt.batch", concurrency=1, retry_limit=0)
async def run_item(item: Item) -> dict[str, Any]:
    if await record_run("item", item.id, item.attempt):
        await asyncio.Event().wait()  # never set: only the worker's shutdown ends a first run
    return {"pid": os.getpid()}


@app.handler("interrupt.plain", concurrency=1)
async def run_job(job: Job) -> dict[str, Any]:
    if await record_run("job", job.id, job.attempt):
        await asyncio.Event().wait()  # never set: only the worker's shutdown ends a first run
    return {"pid": os.getpid()}
