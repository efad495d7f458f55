"""The batch task commands: ``shoal tasks``, ``shoal task``.

    shoal tasks [--kind K] [--status S] [--limit N] [--before ID]
    shoal task ID                     one task: status, progress, errors of failed items
    shoal task cancel|retry-failed ID act on one task

Each calls the same :class:`~shoal.batch.service.Batches` method as the
matching ``/v1/tasks`` route. They need none of the kinds' code: a task row
carries its item queue and job options, so a CLI without an App lists,
cancels and retries tasks of any kind. An unknown task id exits 2 naming it;
nothing changes.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from datetime import datetime

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from shoal.batch.service import Batches, TaskView
from shoal.batch.states import ItemStatus, TaskStatus
from shoal.errors import InvalidInput
from shoal.queue.client import Shoal

TASK_ACTIONS = ("show", "cancel", "retry-failed")
DEFAULT_TASKS = 50
# As GET /v1/tasks allows (shoal.api.tasks.MAX_LIST_LIMIT).
MAX_TASKS = 500
# Failed items `shoal task ID` shows; the rest are counted.
DEFAULT_ERRORS_SHOWN = 20
MAX_ERRORS_SHOWN = 1000
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def _when(at: datetime | None) -> str:
    return "-" if at is None else at.isoformat(timespec="seconds")


def _status(view: TaskView) -> str:
    outcome = "" if view.outcome is None else f" ({view.outcome.value})"
    return f"{view.status.value}{outcome}" + (" [yellow]paused[/yellow]" if view.paused else "")


def _progress(view: TaskView) -> str:
    p = view.progress
    return f"{p.finished}/{p.total} ({p.percent:g}%)"


def _batches(boss: Shoal) -> Batches:
    """The batch front door without any kind: what these commands do needs none."""
    return Batches(boss, {})


async def cmd_tasks(args: argparse.Namespace, boss: Shoal) -> int:
    status = None if args.status is None else TaskStatus(args.status)
    # One more than shown: whether there is a next page.
    views = await _batches(boss).tasks(
        status=status, kind=args.kind, limit=args.limit + 1, before=args.before
    )
    shown = views[: args.limit]
    table = Table(title="batch tasks (newest first)")
    for column in ("id", "kind", "status", "done", "error", "running", "pending", "created"):
        right = column in ("done", "error", "running", "pending")
        table.add_column(column, justify="right" if right else "left", no_wrap=column == "id")
    for view in shown:
        p = view.progress
        table.add_row(
            view.task_id,
            escape(view.kind),
            _status(view),
            _progress(view),
            f"[red]{p.error}[/red]" if p.error else "0",
            str(p.running),
            str(p.pending),
            _when(view.created_at),
        )
    Console(width=max(140, Console().width)).print(table)
    if len(views) > args.limit:
        err.print(f"[dim]more: --before {shown[-1].task_id}[/dim]")
    return 0


async def print_task(batches: Batches, task_id: str, *, errors_shown: int) -> None:
    view = await batches.get(task_id)
    p = view.progress
    lines = [
        f"[bold]task {view.task_id}[/bold]  kind {escape(view.kind)}  status {_status(view)}",
        f"items    {p.total}: {p.completed} completed, {p.error} error, {p.cancelled} cancelled, "
        f"{p.running} running, {p.pending} pending ({p.percent:g}% done)",
        f"queue    {escape(view.queue)}",
        f"created  {_when(view.created_at)}",
        f"closed   {_when(view.completed_at)}",
        f"deadline {_when(view.deadline_at)}",
    ]
    est = view.estimate
    if est is not None:
        lines.append(f"elapsed  {est.elapsed_s:.1f}s")
        if est.eta_s is not None:
            lines.append(f"eta      {est.eta_s:.1f}s")
    page = await batches.items(task_id, status=ItemStatus.ERROR, limit=errors_shown)
    if page.items:
        lines.append(f"[red]failed items ({p.error}):[/red]")
    for item in page.items:
        lines.append(
            f"[red]  {item.id} {escape(item.ref)} after {item.attempts} attempt(s): "
            f"{escape(item.error or '')}[/red]"
        )
    if page.next_cursor is not None:
        lines.append(f"[dim]  and {p.error - len(page.items)} more (--errors N shows more)[/dim]")
    for line in lines:
        out.print(line)


async def cmd_task(args: argparse.Namespace, boss: Shoal) -> int:
    batches = _batches(boss)
    if args.target in TASK_ACTIONS:
        if args.id is None:
            raise InvalidInput("ID", f"shoal task {args.target} needs a task id")
        action, task_id = args.target, args.id
    elif args.id is not None:
        raise InvalidInput("ACTION", f"{args.target!r} is not one of {', '.join(TASK_ACTIONS)}")
    else:
        action, task_id = "show", args.target
    if action == "cancel":
        view = await batches.cancel(task_id)
        err.print(f"task {view.task_id} cancelled: pending items will not start ({_status(view)})")
    elif action == "retry-failed":
        retried = await batches.retry_failed(task_id)
        view = await batches.get(task_id)
        err.print(f"task {view.task_id}: {retried} failed item(s) will run again ({_status(view)})")
    else:
        await print_task(batches, task_id, errors_shown=args.errors)
    return 0


def up_to(most: int) -> Callable[[str], int]:
    """An argparse type: a whole number from 1 to ``most`` (argparse names the option)."""

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if not 1 <= value <= most:
            raise argparse.ArgumentTypeError(
                f"must be a whole number from 1 to {most}, got {text!r}"
            )
        return value

    return convert


def add_commands(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Add ``tasks`` and ``task`` to shoal's parser."""
    tasks = command("tasks", "list batch tasks, newest first, with their progress")
    tasks.add_argument("--kind", help="only this batch kind (default: every kind)")
    tasks.add_argument(
        "--status",
        choices=[s.value for s in TaskStatus],
        help="only this status (default: every status)",
    )
    tasks.add_argument(
        "--limit",
        type=up_to(MAX_TASKS),
        default=DEFAULT_TASKS,
        help=f"tasks to show (at most {MAX_TASKS})",
    )
    tasks.add_argument(
        "--before",
        metavar="ID",
        help="continue a listing where it said 'more': tasks created before this one "
        "(default: none)",
    )
    task = command("task", "show a batch task, or cancel it or retry its failed items")
    task.add_argument("target", metavar="ID|ACTION", help=f"a task id, or {'|'.join(TASK_ACTIONS)}")
    task.add_argument(
        "id", nargs="?", metavar="ID", help="the task id after an action (default: none)"
    )
    task.add_argument(
        "--errors",
        type=up_to(MAX_ERRORS_SHOWN),
        default=DEFAULT_ERRORS_SHOWN,
        help=f"failed items to show (at most {MAX_ERRORS_SHOWN})",
    )


COMMANDS: dict[str, Callable[[argparse.Namespace, Shoal], Awaitable[int]]] = {
    "tasks": cmd_tasks,
    "task": cmd_task,
}

__all__ = ["COMMANDS", "add_commands"]
