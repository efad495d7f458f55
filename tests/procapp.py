"""The App that worker subprocesses of the real-process tests run.

    python -m shoal.cli --database-url URL worker --app tests.procapp:app --grace 5

(with the repository as the working directory, so ``tests.procapp`` imports).

Queues:

- ``proc_noop`` returns ``{"pid": <worker pid>}`` at once. The job's own
  ``output`` is its record: a test learns which process ran it without a
  write per job (20,000 of them would dwarf the queue's own work).
- ``proc_slow`` writes an ``exec_log`` row when it starts, sleeps
  ``data["sleep_s"]`` (``data["first_attempt_sleep_s"]`` on attempt 1, when
  given), then stamps the row's ``finished_at``. A process killed mid-job leaves
  a row with no finish. One at a time, so a test knows which job is running.
- ``proc_tick`` takes the ticks of the cron schedule ``proc_every_second``
  (``* * * * * *``), declared only when ``PROCAPP_SCHEDULE`` is set.

On start, each process creates the tables (once, under an advisory lock) and
adds itself to ``proc_started``, so a test can wait until its workers are up.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from shoal import Job, Shoal
from shoal.app import App
from shoal.db.pool import AsyncConn

PID = os.getpid()
SCHEDULE_NAME = "proc_every_second"
# Serialises the CREATE TABLEs of processes starting together: two concurrent
# CREATE TABLE IF NOT EXISTS can still collide on the catalog's unique index.
SETUP_LOCK_KEY = 7_254_001

SETUP_SQL = [
    """
    CREATE TABLE IF NOT EXISTS public.exec_log (
        job_id      bigint NOT NULL,
        attempt     int NOT NULL,
        pid         int NOT NULL,
        started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
        finished_at timestamptz
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS public.proc_started (
        pid        int NOT NULL,
        started_at timestamptz NOT NULL DEFAULT clock_timestamp()
    )
    """,
]

app = App()

# The worker process's client, set by the start hook, used by proc_slow to
# write exec_log through the process's own pool.
_boss: Shoal | None = None


@app.on_start
async def prepare(boss: Shoal) -> None:
    global _boss
    _boss = boss

    async def setup(conn: AsyncConn) -> None:
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (SETUP_LOCK_KEY,))
        for statement in SETUP_SQL:
            await conn.execute(statement)
        await conn.execute("INSERT INTO public.proc_started (pid) VALUES (%s)", (PID,))

    await boss.db.run(setup)


@app.handler("proc_noop", concurrency=20)
async def noop(job: Job) -> dict[str, Any]:
    return {"pid": PID}


@app.handler("proc_slow", concurrency=1)
async def slow(job: Job) -> dict[str, Any]:
    assert _boss is not None, "the start hook sets _boss before any handler runs"
    data = job.data
    sleep_s = data["sleep_s"]
    if job.attempt == 1 and "first_attempt_sleep_s" in data:
        sleep_s = data["first_attempt_sleep_s"]

    async def started(conn: AsyncConn) -> None:
        await conn.execute(
            "INSERT INTO public.exec_log (job_id, attempt, pid) VALUES (%s, %s, %s)",
            (job.id, job.attempt, PID),
        )

    async def finished(conn: AsyncConn) -> None:
        await conn.execute(
            "UPDATE public.exec_log SET finished_at = clock_timestamp() "
            "WHERE job_id = %s AND attempt = %s AND pid = %s",
            (job.id, job.attempt, PID),
        )

    await _boss.db.run(started)
    await asyncio.sleep(sleep_s)  # noqa: TID251 - simulated work in a worker process, to be killed
    await _boss.db.run(finished)
    return {"pid": PID}


@app.handler("proc_tick", concurrency=1)
async def tick(job: Job) -> None:
    return None


if os.environ.get("PROCAPP_SCHEDULE"):
    app.schedule(SCHEDULE_NAME, "* * * * * *", queue="proc_tick")
