"""A batch app for real-process tests: ``shoal worker --app tests.batchapp:app``.

Its handler records each run (a side effect standing in for an LLM call) in a
table of its own before sleeping, so a test can tell which items ran twice.
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from typing import Any

import psycopg

from shoal import App, Shoal
from shoal.batch.item import Item

app = App()
_url: list[str] = []


@app.on_start
async def create_side_effect_table(boss: Shoal) -> None:
    _url.append(boss.db.url)
    async with await psycopg.AsyncConnection.connect(boss.db.url, autocommit=True) as conn:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS side_effect ("
            " item_id bigint NOT NULL, attempt int NOT NULL, pid int NOT NULL,"
            " at timestamptz NOT NULL DEFAULT clock_timestamp())"
        )


@app.batch(
    "proc.batch",
    concurrency=8,
    retry_limit=3,
    retry_delay=timedelta(milliseconds=100),
    zombie_timeout=timedelta(seconds=2),
)
async def run_item(item: Item) -> dict[str, Any]:
    async with await psycopg.AsyncConnection.connect(_url[0], autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO side_effect (item_id, attempt, pid) VALUES (%s, %s, %s)",
            (item.id, item.attempt, os.getpid()),
        )
    data = item.data if isinstance(item.data, dict) else {}
    await asyncio.sleep(data.get("sleep_ms", 0) / 1000)  # noqa: TID251 - simulated work in a worker process
    return {"pid": os.getpid()}
