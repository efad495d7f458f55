"""The console's commands: ``shoal jobs``, ``shoal job``, ``shoal schedule``.

    shoal jobs [--queue Q] [--state failed] [--limit N] [--search TEXT] [--internal]
    shoal job ID                      one job: payload, output, every error, timings
    shoal job retry|cancel|rm ID      act on one job
    shoal schedule list|pause|resume|rm [NAME] [--internal]
    shoal workers                     the worker processes and their heartbeats

Each calls the same :class:`~shoal.console.queues.QueueInspector` method as
the matching ``/v1`` route. An unknown queue, job or schedule exits 2 with a
message listing the known ones; nothing changes. The lists leave out
shoal's own queues and schedules (names starting ``shoal.``) unless given
``--internal``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from shoal.console.queues import DEFAULT_PAGE, MAX_PAGE, QueueInspector
from shoal.errors import InvalidInput
from shoal.queue.client import Shoal
from shoal.queue.registry import WorkerRegistry
from shoal.queue.rows import JobRecord
from shoal.queue.states import JobState

Connect = Callable[[argparse.Namespace, str], Awaitable[Shoal]]
JOB_ACTIONS = ("retry", "cancel", "rm")
SCHEDULE_ACTIONS = ("list", "pause", "resume", "rm")
out = Console()
err = Console(stderr=True)


def _when(at: datetime | None) -> str:
    return "-" if at is None else at.isoformat(timespec="seconds")


def _wide() -> Console:
    return Console(width=max(120, Console().width))


def job_id_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value < 2**63:
        raise InvalidInput("ID", f"a job id is a whole number >= 1, got {text!r:.80}")
    return value


async def cmd_jobs(args: argparse.Namespace, boss: Shoal) -> int:
    inspector = QueueInspector(boss)
    page = await inspector.jobs(
        queue=args.queue,
        state=args.state,
        limit=args.limit,
        q=args.search,
        cursor=args.cursor,
        internal=args.internal,
    )
    table = Table(title="jobs (failed first, newest first)")
    for column in ("id", "queue", "state", "attempt", "created", "finished", "error"):
        table.add_column(column, justify="right" if column in ("id", "attempt") else "left")
    for job in page.jobs:
        error = job.errors[-1].message if job.errors else ""
        state = f"[red]{job.state.value}[/red]" if job.state is JobState.FAILED else job.state.value
        table.add_row(
            str(job.id),
            escape(job.queue),
            state,
            f"{job.attempt}/{job.policy.retry_limit + 1}",
            _when(job.created_at),
            _when(job.finished_at),
            escape(error[:80]),
        )
    _wide().print(table)
    if page.next_cursor:
        err.print(f"[dim]more: --cursor {page.next_cursor}[/dim]")
    return 0


def print_job(job: JobRecord) -> None:
    lines = [
        f"[bold]job {job.id}[/bold]  queue {escape(job.queue)}  state {job.state.value}  "
        f"attempt {job.attempt}/{job.policy.retry_limit + 1}",
        f"created  {_when(job.created_at)}",
        f"started  {_when(job.started_at)}",
        f"finished {_when(job.finished_at)}",
    ]
    if job.started_at is not None:
        lines.append(f"wait     {(job.started_at - job.created_at).total_seconds():.3f}s")
        if job.finished_at is not None and job.finished_at >= job.started_at:
            lines.append(f"run      {(job.finished_at - job.started_at).total_seconds():.3f}s")
    if job.singleton_key is not None:
        lines.append(f"singleton key {escape(job.singleton_key)}")
    lines.append(f"data     {escape(json.dumps(job.data))}")
    lines.append(f"output   {escape(json.dumps(job.output))}")
    for e in job.errors:
        lines.append(
            f"[red]attempt {e.attempt} at {e.at}: {escape(e.type)}: {escape(e.message)}[/red]"
        )
        if e.traceback:
            lines.append(f"[dim]{escape(e.traceback.rstrip())}[/dim]")
    for line in lines:
        out.print(line, soft_wrap=True)


async def cmd_job(args: argparse.Namespace, boss: Shoal) -> int:
    inspector = QueueInspector(boss)
    if args.target in JOB_ACTIONS:
        if args.id is None:
            raise InvalidInput("ID", f"shoal job {args.target} needs a job id")
        job_id = job_id_arg(args.id)
        if args.target == "retry":
            job = await inspector.retry_job(job_id)
            err.print(f"job {job_id} will run again ({job.state.value})")
        elif args.target == "cancel":
            await inspector.cancel_job(job_id, by="cli")
            err.print(f"job {job_id} cancelled")
        else:
            await inspector.delete_job(job_id)
            err.print(f"job {job_id} deleted")
        return 0
    if args.id is not None:
        raise InvalidInput("ACTION", f"{args.target!r} is not one of {', '.join(JOB_ACTIONS)}")
    print_job(await inspector.job(job_id_arg(args.target)))
    return 0


async def cmd_schedule(args: argparse.Namespace, boss: Shoal) -> int:
    inspector = QueueInspector(boss)
    if args.action == "list":
        table = Table(title="schedules")
        for column in ("name", "cron", "tz", "queue", "next run", "last run", "last job", "owner"):
            table.add_column(column)
        for s in await inspector.schedules(internal=args.internal):
            last = "-" if s.last_job_id is None else f"{s.last_job_id} ({s.last_job_state})"
            table.add_row(
                escape(s.name),
                escape(s.cron),
                s.timezone,
                escape(s.queue),
                "[yellow]paused[/yellow]" if s.paused_at else _when(s.next_tick),
                _when(s.last_tick),
                last,
                escape(s.owner or "-"),
            )
        _wide().print(table)
        return 0
    if args.name is None:
        raise InvalidInput("NAME", f"shoal schedule {args.action} needs a schedule name")
    actions: dict[str, Callable[[str], Awaitable[Any]]] = {
        "pause": inspector.pause_schedule,
        "resume": inspector.resume_schedule,
        "rm": inspector.remove_schedule,
    }
    await actions[args.action](args.name)
    done = {"pause": "paused", "resume": "resumed", "rm": "removed"}[args.action]
    err.print(f"schedule {args.name!r} {done}")
    return 0


async def cmd_workers(args: argparse.Namespace, boss: Shoal) -> int:
    table = Table(title="worker processes")
    columns = ("host", "pid", "app", "queues", "started", "heartbeat", "running", "done", "rescued")
    for column in columns:
        table.add_column(
            column, justify="right" if column in ("pid", "running", "done", "rescued") else "left"
        )
    for w in await WorkerRegistry(boss).workers():
        queues = ", ".join(f"{q} ({n})" for q, n in sorted(w.queues.items()))
        beat = _when(w.heartbeat_at) + (" [red]gone[/red]" if w.gone else "")
        table.add_row(
            escape(w.host),
            str(w.pid),
            escape(w.app),
            escape(queues),
            _when(w.started_at),
            beat,
            str(w.running),
            str(w.done),
            # Jobs maintenance handed back because this process went silent.
            str(w.rescued) if w.rescued else "-",
        )
    _wide().print(table)
    return 0


def add_commands(command: Callable[[str, str], argparse.ArgumentParser], positive_int: Any) -> None:
    """Add ``jobs``, ``job`` and ``schedule`` to shoal's parser."""
    jobs = command("jobs", "list jobs, failed first, newest first")
    jobs.add_argument("--queue", help="only this queue (default: every queue)")
    jobs.add_argument(
        "--state",
        choices=[s.value for s in JobState],
        help="only this state (default: every state, failed first)",
    )
    jobs.add_argument(
        "--limit",
        type=positive_int,
        default=DEFAULT_PAGE,
        help=f"jobs to show (at most {MAX_PAGE})",
    )
    jobs.add_argument("--search", help="a job id or a singleton key (default: none)")
    jobs.add_argument("--cursor", help="continue a listing where it said 'more' (default: none)")
    add_internal_switch(jobs)
    job = command("job", "show a job, or retry, cancel or rm (delete) one")
    job.add_argument("target", metavar="ID|ACTION", help="a job id, or retry|cancel|rm")
    job.add_argument(
        "id", nargs="?", metavar="ID", help="the job id after an action (default: none)"
    )
    command("workers", "the worker processes that heartbeat, and those gone lately")
    schedule = command("schedule", "list, pause, resume or rm (remove) cron schedules")
    schedule.add_argument("action", choices=SCHEDULE_ACTIONS)
    schedule.add_argument(
        "name", nargs="?", help="the schedule (default: none; list takes none, the others one)"
    )
    add_internal_switch(schedule)


def add_internal_switch(command: argparse.ArgumentParser) -> None:
    """``--internal``: list shoal's own queues and schedules too."""
    command.add_argument(
        "--internal",
        action="store_true",
        help="show shoal's own queues and schedules too (names starting 'shoal.')",
    )


COMMANDS: dict[str, Callable[[argparse.Namespace, Shoal], Awaitable[int]]] = {
    "jobs": cmd_jobs,
    "job": cmd_job,
    "schedule": cmd_schedule,
    "workers": cmd_workers,
}

__all__ = ["COMMANDS", "add_commands"]
