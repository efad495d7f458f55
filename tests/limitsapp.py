"""The App that worker subprocesses of tests/test_limits_processes.py run.

    python -m shoal.cli --database-url URL worker --app tests.limitsapp:app

Every handler sleeps ``data["sleep_s"]`` (``data["first_attempt_sleep_s"]`` on
attempt 1, when given), so jobs overlap and the limits have something to
hold back. Each process runs more handlers than the limits allow in all:

- ``lim_global``: at most 3 active across every process (5 per process);
- ``lim_part``: at most 2 active per ``data["p"]`` (10 per process);
- ``lim_kill``: at most 2 active across every process, for a test that kills
  the process holding them.

On start, each process records itself as procapp's processes do.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from shoal import Job
from shoal.app import App
from tests.procapp import prepare

PID = os.getpid()

app = App()
app.on_start(prepare)


async def sleep_then_return(job: Job) -> dict[str, Any]:
    data = job.data
    sleep_s = data["sleep_s"]
    if job.attempt == 1 and "first_attempt_sleep_s" in data:
        sleep_s = data["first_attempt_sleep_s"]
    await asyncio.sleep(sleep_s)  # noqa: TID251 - simulated work, so that jobs overlap
    return {"pid": PID}


app.handler("lim_global", concurrency=5, global_concurrency=3)(sleep_then_return)
app.handler("lim_part", concurrency=10, global_concurrency=2, partition_by="p")(sleep_then_return)
app.handler("lim_kill", concurrency=5, global_concurrency=2)(sleep_then_return)
