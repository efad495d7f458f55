"""The App of the PostgreSQL failover test (tests/test_pg_failover.py).

    python -m shoal.cli --database-url CONNINFO worker --app tests.failoverapp:app

``failover.item`` (a batch kind) and ``failover.job`` (a queue) each take a
few milliseconds of simulated work and return the pid that ran them. Retries
are many and quick, so an attempt that fails while the database fails over
is tried again rather than spent. The task's completion hook adds a row to
``public.failover_task_done`` (created by the test), once per run of the hook.
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from typing import Any

from shoal import App, Job, Shoal
from shoal.batch.item import Item
from shoal.batch.views import TaskView
from shoal.db.pool import AsyncConn

PID = os.getpid()
WORK_S = 0.01
RETRIES = 50
RETRY_DELAY = timedelta(milliseconds=200)
# A claim can commit on the standby while its answer is lost with the
# primary; its jobs are nobody's until their lease runs out, which for a
# queue is expire_in (15 minutes by default), for the batch kind its
# zombie_timeout. Both are short here, as they would be for work this short.
LEASE = timedelta(seconds=20)

app = App()
# Set by the start hook; read by the completion hook to write its row.
_boss: list[Shoal] = []


@app.on_start
async def keep_client(boss: Shoal) -> None:
    _boss.append(boss)


async def task_done(task: TaskView) -> None:
    async def record(conn: AsyncConn) -> None:
        await conn.execute(
            "INSERT INTO public.failover_task_done (task_id, pid) VALUES (%s, %s)",
            (task.task_id, PID),
        )

    await _boss[0].db.run(record)


@app.batch(
    "failover.item",
    concurrency=10,
    retry_limit=RETRIES,
    retry_delay=RETRY_DELAY,
    retry_backoff=False,
    zombie_timeout=timedelta(seconds=3),
    on_complete=task_done,
)
async def run_item(item: Item) -> dict[str, Any]:
    await asyncio.sleep(WORK_S)  # noqa: TID251 - simulated work in a worker process
    return {"pid": PID}


@app.handler(
    "failover.job",
    concurrency=10,
    retry_limit=RETRIES,
    retry_delay=RETRY_DELAY,
    expire_in=LEASE,
)
async def run_job(job: Job) -> dict[str, Any]:
    await asyncio.sleep(WORK_S)  # noqa: TID251 - simulated work in a worker process
    return {"pid": PID}
