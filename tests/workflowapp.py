"""The App of tests/test_workflow_processes.py: workflows whose steps leave a trace.

    python -m shoal.cli --database-url URL worker --app tests.workflowapp:app

Every step adds a row to ``wf_effect`` (run, step, pid). A process started
with ``WORKFLOWAPP_BLOCK_AT=<step>`` stops inside that step and waits there
until the test kills it: ``two`` after its row is written, ``three`` (a step in
the checkpoint's transaction) after writing its row in that transaction and
a marker row outside it, so the test knows the step was under way.
"""

from __future__ import annotations

import asyncio
import os
from datetime import datetime
from typing import Any

from shoal import App, Shoal
from shoal.db.pool import AsyncConn
from shoal.workflow import Workflow

PID = os.getpid()
BLOCK_AT = os.environ.get("WORKFLOWAPP_BLOCK_AT", "")
SETUP_LOCK_KEY = 7_254_036

app = App()
_boss: list[Shoal] = []


@app.on_start
async def prepare(boss: Shoal) -> None:
    _boss.append(boss)

    async def setup(conn: AsyncConn) -> None:
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (SETUP_LOCK_KEY,))
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS public.wf_effect ("
            " run text NOT NULL, step text NOT NULL, pid int NOT NULL,"
            " at timestamptz NOT NULL DEFAULT clock_timestamp())"
        )

    await boss.db.run(setup)


async def effect(run: str, step: str) -> int:
    async def record(conn: AsyncConn) -> None:
        await conn.execute(
            "INSERT INTO public.wf_effect (run, step, pid) VALUES (%s, %s, %s)", (run, step, PID)
        )

    await _boss[0].db.run(record)
    if step == BLOCK_AT:
        await asyncio.Event().wait()  # held until the test kills this process
    return PID


async def effect_in_transaction(conn: AsyncConn, run: str, step: str) -> int:
    await conn.execute(
        "INSERT INTO public.wf_effect (run, step, pid) VALUES (%s, %s, %s)", (run, step, PID)
    )
    if step == BLOCK_AT:
        await effect(run, f"{step} under way")  # committed apart, to be seen
        await asyncio.Event().wait()
    return PID


@app.workflow("crashy")
async def crashy(wf: Workflow, data: None) -> list[int]:
    one = await wf.step(effect, wf.id, "one")
    two = await wf.step(effect, wf.id, "two")
    three = await wf.step(effect_in_transaction, wf.id, "three", transaction=True)
    return [one, two, three]


@app.workflow("sleeper", concurrency=50)
async def sleeper(wf: Workflow, data: dict[str, Any]) -> str:
    await wf.step(effect, wf.id, "before")
    await wf.sleep_until(datetime.fromisoformat(data["until"]))
    await wf.step(effect, wf.id, "after")
    return "woke"
