"""What the terminal shows: live progress bars while a task runs, then summary tables."""

from __future__ import annotations

from rich.table import Table

from shoal import TaskView
from shoal_extract.evaluate import Report
from shoal_extract.extractors.base import Usage
from shoal_extract.workbench import ResultsPage


def task_table(view: TaskView, usage: Usage, phantom_skips: int, elapsed_s: float) -> Table:
    table = Table(title=f"extraction task {view.task_id}")
    table.add_column("what")
    table.add_column("value", justify="right")
    params = view.params if isinstance(view.params, dict) else {}
    table.add_row(
        "template / extractor",
        f"{params.get('template')} v{params.get('template_version')} / {params.get('extractor')}",
    )
    table.add_row("status / outcome", f"{view.status} / {view.outcome}")
    table.add_row("documents", str(view.progress.total))
    table.add_row("items completed", str(view.progress.completed))
    table.add_row("items in error", str(view.progress.error))
    table.add_row("phantom deliveries skipped (all tasks)", str(phantom_skips))
    if usage.calls:
        table.add_row("model calls (every attempt)", str(usage.calls))
        table.add_row("tokens (prompt + completion)", f"{usage.tokens:,}")
        table.add_row("cost", f"${usage.cost_usd:.4f}")
        if view.progress.completed and phantom_skips:
            # Each skipped delivery would have been one more extraction of an item
            # that already had its result: about one item's worth of tokens.
            per_item = usage.tokens / view.progress.completed
            table.add_row(
                "tokens the phantom guard saved (estimate)", f"~{phantom_skips * per_item:,.0f}"
            )
    table.add_row("time", f"{elapsed_s:.1f} s")
    return table


def errors_table(page: ResultsPage) -> Table | None:
    failed = [line for line in page.lines if line.status == "error"]
    if not failed:
        return None
    table = Table(title="documents in error (permanent, with the parser's or model's message)")
    table.add_column("file")
    table.add_column("error", overflow="fold")
    for line in failed:
        table.add_row(line.file, line.error or "")
    return table


def accuracy_table(report: Report) -> Table:
    table = Table(title=f"accuracy against the key ({report.documents} documents matched)")
    table.add_column("field")
    table.add_column("right", justify="right")
    table.add_column("accuracy", justify="right")
    for score in report.fields:
        color = "green" if score.accuracy == 1 else ("yellow" if score.accuracy >= 0.8 else "red")
        table.add_row(
            score.name,
            f"{score.correct}/{score.total}",
            f"[{color}]{100 * score.accuracy:.1f}%[/{color}]",
        )
    return table


__all__ = ["accuracy_table", "errors_table", "task_table"]
