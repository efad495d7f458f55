"""The end-to-end demo: ``shoal demo``.

Runs a worker in this process against a real database, sends a few hundred
jobs whose simulated handler sleeps, fails transiently (retried with backoff)
or fails for good (dead-lettered), runs a 6-field cron schedule, and shows
live progress until every job has ended, then the final counts.
"""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from shoal.app import App
from shoal.errors import PermanentError
from shoal.queue.client import Shoal
from shoal.queue.job import Job
from shoal.queue.states import JobState

DEMO_QUEUE = "demo_sleep"
DEAD_LETTER_QUEUE = "demo_sleep_dead"
TICK_QUEUE = "demo_tick"

app = App()
ticks: list[str] = []


class FlakyGateway(Exception):
    """Stands in for a timeout from a remote service: worth retrying."""


@app.handler(DEMO_QUEUE, concurrency=20)
async def sleep_job(job: Job) -> dict[str, Any]:
    """Sleeps ``sleep_ms``; fails the first ``fail_times`` attempts as asked."""
    data = job.data
    await asyncio.sleep(data.get("sleep_ms", 0) / 1000)
    if data.get("fail") == "permanent":
        raise PermanentError(f"item {data['item']}: unreadable input")
    if data.get("fail") == "transient" and job.attempt <= data.get("fail_times", 1):
        raise FlakyGateway(f"item {data['item']}: gateway timeout on attempt {job.attempt}")
    return {"item": data["item"], "attempt": job.attempt}


@app.handler(TICK_QUEUE, concurrency=1)
async def tick(job: Job) -> None:
    ticks.append(job.started_at.isoformat())


app.schedule("demo_every_2s", "*/2 * * * * *", queue=TICK_QUEUE)


def demo_jobs(count: int, rng: random.Random) -> list[dict[str, Any]]:
    jobs = []
    for i in range(count):
        data: dict[str, Any] = {"item": i, "sleep_ms": rng.randint(5, 80)}
        roll = rng.random()
        if roll < 0.03:
            data["fail"] = "permanent"
        elif roll < 0.15:
            data.update(fail="transient", fail_times=rng.randint(1, 2))
        jobs.append(
            {
                "queue": DEMO_QUEUE,
                "data": data,
                "retry_limit": 3,
                "retry_backoff": True,
                "retry_delay": 0.2,
                "dead_letter": DEAD_LETTER_QUEUE,
                # An execution timeout from the moment a job starts, not a queue-wait timeout.
                "expire_in": timedelta(minutes=5),
                "singleton_key": f"demo-item-{i}",
            }
        )
    return jobs


async def run_demo(url: str, *, schema: str, jobs: int, console: Console) -> int:
    boss = await Shoal.connect(url, schema=schema)
    stop = asyncio.Event()
    runner = asyncio.create_task(app.run(boss, stop=stop, grace=timedelta(seconds=10)))
    try:
        ids = await boss.insert(demo_jobs(jobs, random.Random(7)))
        sent = [job_id for job_id in ids if job_id is not None]
        console.print(
            f"sent {len(sent)} jobs to [bold]{DEMO_QUEUE}[/bold] in one insert "
            f"({len(ids) - len(sent)} skipped: their singleton key is still running)"
        )
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            bar = progress.add_task(DEMO_QUEUE, total=jobs, detail="")
            while True:
                counts = await _counts(boss, DEMO_QUEUE)
                finished = sum(counts.get(s, 0) for s in (JobState.COMPLETED, JobState.FAILED))
                detail = (
                    f"active {counts.get(JobState.ACTIVE, 0)}  "
                    f"retrying {counts.get(JobState.RETRY, 0)}  "
                    f"failed {counts.get(JobState.FAILED, 0)}"
                )
                progress.update(bar, completed=finished, detail=detail)
                if finished >= jobs:
                    break
                await asyncio.sleep(0.2)
        counts = await _counts(boss, DEMO_QUEUE)
        dead = await boss.jobs(DEAD_LETTER_QUEUE, limit=1000)
        table = Table(title="demo result")
        table.add_column("what")
        table.add_column("count", justify="right")
        table.add_row("completed", str(counts.get(JobState.COMPLETED, 0)))
        table.add_row(
            "failed (kept with every attempt's error)", str(counts.get(JobState.FAILED, 0))
        )
        table.add_row(f"dead-lettered to {DEAD_LETTER_QUEUE}", str(len(dead)))
        table.add_row("cron ticks run (every 2 s)", str(len(ticks)))
        console.print(table)
        failed = await boss.jobs(DEMO_QUEUE, state=JobState.FAILED, limit=1)
        if failed:
            error = failed[0].errors[-1]
            console.print(f"a failed job's last error: [red]{error.type}: {error.message}[/red]")
        console.print("inspect with: shoal status")
        return 0
    finally:
        stop.set()
        await runner
        await boss.unschedule("demo_every_2s")
        await boss.close()


async def _counts(boss: Shoal, queue: str) -> dict[JobState, int]:
    return {row.state: row.count for row in await boss.stats() if row.queue == queue}
