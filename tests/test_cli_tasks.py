"""``shoal tasks`` and ``shoal task``: batch tasks from the command line, without an App.

There was no command for batch tasks (issue 35, item 9). The commands call
the same ``Batches`` methods as ``/v1/tasks`` and need none of the kinds'
code: each task row carries its item queue and job options.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest

from shoal import PermanentError, Shoal
from shoal.app import App
from shoal.batch.item import Item
from shoal.batch.service import Batches, TaskView
from shoal.batch.states import TaskStatus
from tests.cli_helpers import shoal
from tests.cli_helpers import with_boss as run_with_boss

from .conftest import wait_for

KIND = "cli.check"
OTHER_KIND = "cli.other"
APP = App(name="cli-tasks")


@APP.batch(KIND, retry_limit=0, retry_delay=timedelta(milliseconds=50))
async def check(item: Item) -> None:
    data = item.data if isinstance(item.data, dict) else {}
    if data.get("fail"):
        raise PermanentError(f"{item.ref}: unreadable")


@APP.batch(OTHER_KIND)
async def other(item: Item) -> None:
    return None


def with_boss(db_url: str, body: Callable[[Shoal], Awaitable[Any]]) -> Any:
    # Workers run here: a bigger pool, and LISTEN for their wake-ups.
    return run_with_boss(db_url, body, max_size=4, listen=True)


def view_of(db_url: str, task_id: str) -> TaskView:
    return with_boss(db_url, lambda boss: Batches(boss, {}).get(task_id))  # type: ignore[no-any-return]


async def closed_task_with_errors(boss: Shoal) -> str:
    """A task of KIND run to its close by APP's worker: two items ok, two in error."""
    stop = asyncio.Event()
    run = asyncio.create_task(APP.run(boss, stop=stop, grace=timedelta(seconds=2)))
    batches = APP.batches(boss)
    try:
        items: list[str | dict[str, Any]] = ["ok-1", "ok-2"]
        items += [{"ref": f"bad-{n}", "data": {"fail": True}} for n in (1, 2)]
        created = await batches.create(KIND, items)

        async def closed() -> bool:
            return (await batches.get(created.task_id)).status is not TaskStatus.PROCESSING

        await wait_for(closed)
        return created.task_id
    finally:
        stop.set()
        await run


def test_task_shows_progress_and_the_errors_of_failed_items(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    task_id = with_boss(db_url, closed_task_with_errors)
    assert shoal(db_url, "task", task_id) == 0
    shown = capsys.readouterr().out
    assert f"task {task_id}" in shown and f"kind {KIND}" in shown
    assert "status completed (completed_with_errors)" in shown
    assert "4: 2 completed, 2 error, 0 cancelled, 0 running, 0 pending (100% done)" in shown
    assert "failed items (2):" in shown
    assert re.search(r"bad-1 after 1 attempt\(s\): .*bad-1: unreadable", shown), shown
    assert re.search(r"bad-2 after 1 attempt\(s\): .*bad-2: unreadable", shown), shown
    # Fewer shown than failed: the rest are counted.
    assert shoal(db_url, "task", task_id, "--errors", "1") == 0
    assert "and 1 more" in capsys.readouterr().out


def test_task_retry_failed_puts_the_failed_items_back_without_the_kinds_code(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    task_id = with_boss(db_url, closed_task_with_errors)
    assert shoal(db_url, "task", "retry-failed", task_id) == 0
    assert "2 failed item(s) will run again" in capsys.readouterr().err
    view = view_of(db_url, task_id)
    assert view.status is TaskStatus.PROCESSING
    assert (view.progress.pending, view.progress.error, view.progress.completed) == (2, 0, 2)

    async def jobs_waiting(boss: Shoal) -> int:
        rows = await boss.stats()
        return sum(r.count for r in rows if r.queue == f"batch.{KIND}" and r.state == "created")

    assert with_boss(db_url, jobs_waiting) == 2  # the reopened items' jobs, on the kind's queue


def test_task_cancel_stops_a_task_and_a_closed_one_is_refused(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async def create(boss: Shoal) -> str:
        # No worker runs: the items wait.
        return (await APP.batches(boss).create(OTHER_KIND, ["a", "b", "c"])).task_id

    task_id = with_boss(db_url, create)
    assert shoal(db_url, "task", "cancel", task_id) == 0
    assert f"task {task_id} cancelled" in capsys.readouterr().err
    assert view_of(db_url, task_id).progress.cancelled == 3

    closed_id = with_boss(db_url, closed_task_with_errors)
    assert shoal(db_url, "task", "cancel", closed_id) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: task {closed_id} is already completed; nothing to cancel"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["task", "1b4e28ba-2fa1-11d2-883f-0016cb7c7b1b"],
        ["task", "cancel", "1b4e28ba-2fa1-11d2-883f-0016cb7c7b1b"],
        ["task", "retry-failed", "1b4e28ba-2fa1-11d2-883f-0016cb7c7b1b"],
        ["task", "not-a-task"],
    ],
    ids=" ".join,
)
def test_an_unknown_task_id_exits_2_naming_it(
    db_url: str, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert shoal(db_url, *argv) == 2
    assert capsys.readouterr().err.strip() == f"error: task {argv[-1]!r} does not exist"


def test_tasks_lists_newest_first_by_kind_and_status_in_pages(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async def create(boss: Shoal) -> list[str]:
        batches = APP.batches(boss)
        first = await batches.create(OTHER_KIND, ["a"])
        second = await batches.create(OTHER_KIND, ["b"])
        return [first.task_id, second.task_id]

    closed_id = with_boss(db_url, closed_task_with_errors)
    first, second = with_boss(db_url, create)

    def listed(*argv: str) -> tuple[list[str], str]:
        assert shoal(db_url, "tasks", *argv) == 0
        captured = capsys.readouterr()
        return re.findall(r"[0-9a-f]{8}-[0-9a-f-]{27}", captured.out), captured.err

    assert listed() == ([second, first, closed_id], "")
    assert listed("--kind", KIND)[0] == [closed_id]
    assert listed("--status", "processing")[0] == [second, first]
    page, more = listed("--kind", OTHER_KIND, "--limit", "1")
    assert page == [second] and more.strip() == f"more: --before {second}"
    assert listed("--kind", OTHER_KIND, "--limit", "1", "--before", second) == ([first], "")
    assert shoal(db_url, "tasks", "--kind", "nosuch.kind") == 0
    assert re.findall(r"[0-9a-f]{8}-", capsys.readouterr().out) == []
