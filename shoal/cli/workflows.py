"""The workflow commands: ``shoal workflows``, ``shoal signal``.

    shoal workflows list [--name N] [--status S] [--limit N] [--before CURSOR] [--json]
    shoal workflows show ID [--json]      a run: input, result or error, each step
    shoal workflows start NAME [INPUT_JSON] [--id ID] --app module:attr
    shoal workflows cancel|retry ID       act on one run
    shoal signal KEY [PAYLOAD_JSON]       send an event to the run waiting for KEY

Each calls the same :class:`~shoal.workflow.service.Workflows` method as the
matching ``/v1/workflows`` route. Only ``start`` needs the workflow's code
(``--app``); the others read and act on the runs' rows, so they work without
it (``--app`` still gives ``retry`` the workflow's own job options). An
unknown run id exits 2 naming it; nothing changes.
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

from shoal.cli.common import load_app
from shoal.errors import Conflict, InvalidInput
from shoal.queue.client import Shoal
from shoal.workflow.service import MAX_PAGE, RunView, Workflows, decode_cursor, encode_cursor
from shoal.workflow.states import RunStatus, StepStatus
from shoal.workflow.store import RunRow

DEFAULT_RUNS = 50
STATUS_STYLE = {
    RunStatus.COMPLETED: "green",
    RunStatus.FAILED: "red",
    RunStatus.CANCELLED: "yellow",
}
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def _when(at: datetime | None) -> str:
    return "-" if at is None else at.isoformat(timespec="seconds")


def _status(run: RunRow) -> str:
    style = STATUS_STYLE.get(run.status)
    return run.status.value if style is None else f"[{style}]{run.status.value}[/{style}]"


def _json_arg(text: str | None, field: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(field, f"is not JSON ({exc.msg} at character {exc.pos})") from None


def _workflows(args: argparse.Namespace, boss: Shoal) -> Workflows:
    """The app's workflows with ``--app``; else the runs alone (enough for all but start)."""
    app_spec = getattr(args, "app", None)
    if app_spec is None:
        return Workflows(boss, {})
    return load_app(app_spec).workflows(boss)


def _print_json(value: Any) -> None:
    # print, not rich: the text must stay JSON (no markup, no wrapping).
    print(json.dumps(value, indent=2, ensure_ascii=False))


async def cmd_list(args: argparse.Namespace, boss: Shoal) -> int:
    before = None
    if args.before is not None:
        before = decode_cursor(args.before, field="--before")
    runs = await _workflows(args, boss).list(
        name=args.name, status=args.status, before=before, limit=args.limit + 1
    )
    shown = runs[: args.limit]
    more = len(runs) > args.limit
    if args.json:
        _print_json(
            {
                "runs": [r.as_dict() for r in shown],
                "next_cursor": encode_cursor(shown[-1]) if more else None,
            }
        )
        return 0
    table = Table(title="workflow runs (newest first)")
    for column in ("id", "name", "status", "created", "finished", "waits for"):
        table.add_column(column, no_wrap=column == "id")
    for run in shown:
        table.add_row(
            escape(run.id),
            escape(run.name),
            _status(run),
            _when(run.created_at),
            _when(run.finished_at),
            escape(run.wait_key or ""),
        )
    Console(width=max(140, Console().width)).print(table)
    if more:
        err.print(f"[dim]more: --before {encode_cursor(shown[-1])}[/dim]")
    return 0


def print_run(view: RunView) -> None:
    run = view.run
    lines = [
        f"[bold]run {escape(run.id)}[/bold]  workflow {escape(run.name)}  status {_status(run)}",
        f"created  {_when(run.created_at)}",
        f"finished {_when(run.finished_at)}",
        f"input    {escape(json.dumps(run.input, ensure_ascii=False))}",
    ]
    if run.wait_key is not None:
        lines.append(f"waits for {escape(run.wait_key)}")
    if run.status is RunStatus.COMPLETED:
        lines.append(f"result   {escape(json.dumps(run.result, ensure_ascii=False))}")
    if run.error:
        lines.append(f"[red]error    {escape(run.error.strip().splitlines()[-1])}[/red]")
    lines.append(f"steps    {len(view.steps)}:")
    for step in view.steps:
        until = f" until {step.until}" if step.until else ""
        attempts = f" after {step.attempts} attempt(s)" if step.attempts > 1 else ""
        line = (
            f"  {step.seq:>3} {step.kind.value:<5} {escape(step.name)}: "
            f"{step.status.value}{attempts}{until}  "
            f"{_when(step.started_at)} -> {_when(step.finished_at)}"
        )
        lines.append(f"[red]{line}[/red]" if step.status is StepStatus.FAILED else line)
        if step.error:
            for text in step.error.rstrip().splitlines():
                lines.append(f"[dim]        {escape(text)}[/dim]")
    for line in lines:
        out.print(line)


async def cmd_workflows(args: argparse.Namespace, boss: Shoal) -> int:
    action = args.action
    if action == "list":
        return await cmd_list(args, boss)
    workflows = _workflows(args, boss)
    if action == "start":
        if args.app is None:
            raise InvalidInput("--app", "shoal workflows start needs the app that declares it")
        data = _json_arg(args.input, "INPUT_JSON")
        started = await workflows.start(args.name, data, id=args.id)
        if started.created:
            err.print(f"run {escape(started.id)} of {escape(args.name)} started")
        else:
            err.print(f"run {escape(started.id)} exists: nothing started")
        print(started.id)
        return 0
    if action == "cancel":
        if not await workflows.cancel(args.id, by="cli"):
            view = await workflows.get(args.id)
            raise Conflict(f"run {args.id!r} is {view.status.value}: it has finished already")
        err.print(f"run {escape(args.id)} cancelled")
        return 0
    if action == "retry":
        if not await workflows.retry(args.id):
            view = await workflows.get(args.id)
            raise Conflict(
                f"run {args.id!r} is {view.status.value}: only a failed or cancelled run "
                "can be retried"
            )
        err.print(f"run {escape(args.id)} will run again from the step that failed")
        return 0
    view = await workflows.get(args.id)
    if args.json:
        _print_json({**view.run.as_dict(), "steps": [s.as_dict() for s in view.steps]})
    else:
        print_run(view)
    return 0


async def cmd_signal(args: argparse.Namespace, boss: Shoal) -> int:
    payload = _json_arg(args.payload, "PAYLOAD_JSON")
    event = await Workflows(boss, {}).signal(args.key, payload)
    err.print(f"event {event} sent to {escape(args.key)}")
    return 0


def add_commands(
    command: Callable[[str, str], argparse.ArgumentParser],
    up_to: Callable[[int], Callable[[str], int]],
) -> None:
    """Add ``workflows`` and ``signal`` to shoal's parser."""
    workflows = command("workflows", "list, show, start, cancel and retry workflow runs")
    actions = workflows.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, help_text: str) -> argparse.ArgumentParser:
        parser = actions.add_parser(name, help=help_text, formatter_class=workflows.formatter_class)
        parser.add_argument(
            "--app",
            help="module:attribute of the shoal.App declaring the workflows "
            "(needed by start; default: none)",
        )
        return parser

    listing = action("list", "runs, newest first")
    listing.add_argument("--name", help="only runs of this workflow (default: every one)")
    listing.add_argument(
        "--status",
        choices=[s.value for s in RunStatus],
        help="only runs of this status (default: every status)",
    )
    listing.add_argument(
        "--limit", type=up_to(MAX_PAGE), default=DEFAULT_RUNS, help=f"at most {MAX_PAGE}"
    )
    listing.add_argument(
        "--before",
        metavar="CURSOR",
        help="continue a listing where it said 'more' (default: from the newest)",
    )
    listing.add_argument(
        "--json", action="store_true", help="print JSON, as GET /v1/workflows/runs"
    )
    show = action("show", "a run: input, result or error, and each step")
    show.add_argument("id", metavar="ID")
    show.add_argument("--json", action="store_true", help="print JSON, as the API's run")
    start = action("start", "start a run (idempotent with --id)")
    start.add_argument("name", metavar="NAME", help="the workflow")
    start.add_argument("input", metavar="INPUT_JSON", nargs="?", help="its input (default: null)")
    start.add_argument(
        "--id", help="the run's id: a second start with it starts nothing (default: a new UUID)"
    )
    for name, text in (
        ("cancel", "cancel a run: its running step, its sleep or wait, its batch task"),
        ("retry", "run a failed or cancelled run again from the step that failed"),
    ):
        act = action(name, text)
        act.add_argument("id", metavar="ID")
    signal = command("signal", "send an event to the workflow run waiting for KEY")
    signal.add_argument("key", metavar="KEY")
    signal.add_argument(
        "payload", metavar="PAYLOAD_JSON", nargs="?", help="what wait_for returns (default: null)"
    )


COMMANDS: dict[str, Callable[[argparse.Namespace, Shoal], Awaitable[int]]] = {
    "workflows": cmd_workflows,
    "signal": cmd_signal,
}

__all__ = ["COMMANDS", "add_commands", "print_run"]
