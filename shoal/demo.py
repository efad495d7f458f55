"""The end-to-end demo (``shoal demo``) and the demo app ``shoal.demo:app``.

The app declares the batch kind ``demo.sleep``: each item sleeps
``data["sleep_ms"]`` and may fail, as its data says: ``"fail": "transient"``
fails the first ``fail_times`` attempts and then succeeds (retried with
backoff), ``"fail": "permanent"`` fails for good. Tests and the HTTP contract
use it; ``shoal worker --app shoal.demo:app`` and ``shoal api --app
shoal.demo:app`` run it against any database.

``shoal demo`` runs everything in one process against the embedded
PostgreSQL (or ``DATABASE_URL``): worker, aggregator and the HTTP API with
its dashboard; creates a task of a few hundred items, shows live progress
bars, and prints the dashboard URL and the final counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
from datetime import timedelta
from typing import Any

from rich.console import Console
from rich.table import Table

from shoal.app import App
from shoal.batch.item import Item
from shoal.batch.service import Batches
from shoal.batch.views import TaskView
from shoal.batch.watch import watch_task
from shoal.errors import PermanentError
from shoal.queue.client import Shoal

DEMO_KIND = "demo.sleep"
DEMO_API_PORT = 8000

app = App()
completed_hooks: list[TaskView] = []


class FlakyGateway(Exception):
    """Stands in for a timeout from a remote service: worth retrying."""


async def on_demo_complete(task: TaskView) -> None:
    completed_hooks.append(task)


@app.batch(
    DEMO_KIND,
    concurrency=20,
    retry_limit=3,
    retry_delay=timedelta(milliseconds=200),
    zombie_timeout=timedelta(seconds=30),
    on_complete=on_demo_complete,
)
async def sleep_item(item: Item) -> dict[str, Any]:
    """Sleeps ``sleep_ms``; fails as ``fail`` / ``fail_times`` ask."""
    data = item.data if isinstance(item.data, dict) else {}
    await asyncio.sleep(int(data.get("sleep_ms", 0)) / 1000)
    if data.get("fail") == "permanent":
        raise PermanentError(f"{item.ref}: unreadable input")
    if data.get("fail") == "transient" and item.attempt <= int(data.get("fail_times", 1)):
        raise FlakyGateway(f"{item.ref}: gateway timeout on attempt {item.attempt}")
    return {"ref": item.ref, "attempt": item.attempt}


def demo_items(count: int, rng: random.Random) -> list[dict[str, Any]]:
    items = []
    for i in range(count):
        data: dict[str, Any] = {"sleep_ms": rng.randint(20, 250)}
        roll = rng.random()
        if roll < 0.04:
            data["fail"] = "permanent"
        elif roll < 0.16:
            data.update(fail="transient", fail_times=rng.randint(1, 2))
        items.append({"ref": f"paper-{i:04}", "data": data})
    return items


async def _serve_api(boss: Shoal, batches: Batches, port: int, console: Console) -> str | None:
    """Serve the API and dashboard on 127.0.0.1; None when it cannot start."""
    try:
        import uvicorn

        from shoal.api import create_api
        from shoal.api.server import api_config
    except ImportError as exc:  # pragma: no cover - the api extra is missing
        console.print(f"[yellow]dashboard unavailable: {exc}[/yellow]")
        return None
    config = api_config(
        create_api(boss, batches, token=None), host="127.0.0.1", port=port, log_level="warning"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(), name="shoal-demo-api")
    for _ in range(100):
        if server.started or task.done():
            break
        await asyncio.sleep(0.05)
    if not server.started:
        console.print(f"[yellow]dashboard unavailable: port {port} is taken[/yellow]")
        return None
    _servers.append((server, task))
    return f"http://127.0.0.1:{port}/tasks"


_servers: list[tuple[Any, asyncio.Task[None]]] = []


async def _until_interrupted() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def run_demo(
    url: str,
    *,
    schema: str,
    items: int,
    console: Console,
    port: int = DEMO_API_PORT,
    stay: bool = False,
) -> int:
    boss = await Shoal.connect(url, schema=schema, max_size=20)
    batches = app.batches(boss)
    stop = asyncio.Event()
    runner = asyncio.create_task(app.run(boss, stop=stop, grace=timedelta(seconds=10)))
    try:
        dashboard = await _serve_api(boss, batches, port, console)
        created = await batches.create(DEMO_KIND, demo_items(items, random.Random(7)))
        console.print(
            f"task [bold]{created.task_id}[/bold]: {items} items created with their jobs "
            "in one transaction"
        )
        if dashboard:
            console.print(f"dashboard: [link={dashboard}]{dashboard}[/link] (live while this runs)")
        view = await watch_task(batches, created.task_id, console)
        table = Table(title=f"task {view.task_id}")
        table.add_column("what")
        table.add_column("value", justify="right")
        table.add_row("status / outcome", f"{view.status} / {view.outcome}")
        table.add_row("items completed", str(view.progress.completed))
        table.add_row("items in error (permanent or out of retries)", str(view.progress.error))
        table.add_row("phantom deliveries skipped", str(await batches.phantom_skips()))
        if view.completed_at and view.created_at:
            table.add_row(
                "created -> closed", f"{(view.completed_at - view.created_at).total_seconds():.1f}s"
            )
        console.print(table)
        errors = (await batches.items(view.task_id, status="error", limit=1)).items
        if errors:
            console.print(f"an item in error: {errors[0].ref}: [red]{errors[0].error}[/red]")
        if dashboard:
            console.print(f"dashboard: {dashboard}")
            if stay:
                console.print("serving the dashboard until Ctrl-C")
                await _until_interrupted()
        return 0
    finally:
        stop.set()
        await runner
        for server, task in _servers:
            server.should_exit = True
            with contextlib.suppress(Exception):
                await task
        _servers.clear()
        await boss.close()
