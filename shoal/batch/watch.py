"""Live progress bars for one task in a terminal, until the task closes."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from shoal.batch.service import Batches
    from shoal.batch.views import TaskView

POLL_S = 0.2


async def watch_task(
    batches: Batches, task_id: str, console: Console, *, poll_s: float = POLL_S
) -> TaskView:
    """Bars for finished, completed, error and running items; returns the closed task.

    >>> await watch_task(Batches(boss), task_id, rich.console.Console())  # doctest: +SKIP
    """
    # rich is imported here: `import shoal` need not pay for a terminal's widgets.
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    view = await batches.get(task_id)
    with Progress(
        TextColumn("[bold]{task.description:>10}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        bars = {
            name: progress.add_task(name, total=view.progress.total)
            for name in ("finished", "completed", "error", "running")
        }
        while True:
            p = view.progress
            for name, value in (
                ("finished", p.finished),
                ("completed", p.completed),
                ("error", p.error),
                ("running", p.running),
            ):
                progress.update(bars[name], completed=value)
            if view.status != "processing":
                return view
            await asyncio.sleep(poll_s)
            view = await batches.get(task_id)
