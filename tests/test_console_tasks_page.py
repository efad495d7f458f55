"""The tasks page in a real headless Chromium: elapsed time and time left ("—"
when unknown), "paused" for a task whose queue is paused, the kind filter, item
search by ref, and each failed item's runs numbered across retry-failed with
their times.

Same set-up as tests/test_dashboard.py (a real uvicorn server with a token, the
App's workers in this event loop, Debian's chromium). With
``SHOAL_WRITE_SCREENSHOTS=1`` it writes docs/images/console-tasks.png.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from shoal import PermanentError, Shoal
from shoal.api import create_api
from shoal.app import App
from shoal.batch.item import Item

from .conftest import wait_for
from .test_console_page import shot
from .test_dashboard import UI_TIMEOUT_MS, browser, serving

__all__ = ["browser"]

TOKEN = "tasks-token"
RENDER = "reports.render"
EXTRACT = "pdf.extract"  # its queue is paused before its task is created

TASKS_APP = App(name="tests.tasks:app")
HOLD = {"event": asyncio.Event()}
# Items of the running task that have started: the first RUN_THROUGH return,
# the rest wait on HOLD. Counted as they start, not chosen by index: which of
# a task's items the workers take first is theirs to choose (a worker that
# claimed high turns of an earlier task may take a new task's later items
# before its first ones).
RUN_THROUGH = 16
STARTED = {"count": 0}


@TASKS_APP.batch(RENDER, concurrency=4, retry_limit=0)
async def render(item: Item) -> dict[str, Any]:
    data = item.data if isinstance(item.data, dict) else {}
    if data.get("fail"):
        raise PermanentError(f"{item.ref}: font 'Garamond' not embedded")
    if data.get("hold"):
        STARTED["count"] += 1
        if STARTED["count"] > RUN_THROUGH:
            await HOLD["event"].wait()  # keeps its task processing, with some items done
    return {"pages": 3}


@TASKS_APP.batch(EXTRACT, concurrency=2)
async def extract(item: Item) -> None:  # pragma: no cover - its queue stays paused
    return None


@pytest.fixture
async def tasks_page(boss: Shoal) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    HOLD["event"] = asyncio.Event()
    STARTED["count"] = 0
    api = create_api(boss, TASKS_APP.batches(boss), token=TOKEN)
    stop = asyncio.Event()
    workers = asyncio.create_task(
        TASKS_APP.run(boss, stop=stop, grace=timedelta(seconds=0.5), maintenance=False)
    )
    try:
        async with (
            serving(api) as base,
            httpx.AsyncClient(
                base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}
            ) as client,
        ):
            yield base, client
    finally:
        HOLD["event"].set()
        stop.set()
        await workers


async def create(client: httpx.AsyncClient, kind: str, items: list[Any]) -> str:
    response = await client.post("/v1/tasks", json={"kind": kind, "items": items})
    assert response.status_code == 202, response.text
    return str(response.json()["task_id"])


async def test_tasks_page_shows_time_left_paused_filters_search_and_run_history(
    browser: Any, tasks_page: tuple[str, httpx.AsyncClient], boss: Shoal, tmp_path: Path
) -> None:
    from playwright.async_api import expect

    base, client = tasks_page

    # A task with failed items, retried once (they fail again): two runs each.
    failing = {3, 7}
    done_id = await create(
        client,
        RENDER,
        [{"ref": f"invoice-{i:02}", "data": {"fail": i in failing}} for i in range(12)],
    )

    async def closed(task_id: str, errors: int) -> bool:
        view = (await client.get(f"/v1/tasks/{task_id}")).json()
        items = (await client.get(f"/v1/tasks/{task_id}/items?status=error")).json()["items"]
        return view["status"] == "completed" and all(len(i["errors"]) == errors for i in items)

    await wait_for(lambda: closed(done_id, 1), timeout_s=20)
    assert (await client.post(f"/v1/tasks/{done_id}/retry-failed")).json()["retried"] == 2
    await wait_for(lambda: closed(done_id, 2), timeout_s=20)

    # A task still running: 16 of its items done, the others held or waiting.
    running_id = await create(
        client, RENDER, [{"ref": f"report-{i:02}", "data": {"hold": True}} for i in range(24)]
    )

    async def sixteen_done() -> bool:
        view = (await client.get(f"/v1/tasks/{running_id}")).json()
        return bool(view["progress"]["completed"] == RUN_THROUGH)

    await wait_for(sixteen_done, timeout_s=20)

    # A task whose queue is paused: nothing of it starts.
    await boss.pause_queue(TASKS_APP.kinds[EXTRACT].queue)
    paused_id = await create(client, EXTRACT, [f"paper-{i}" for i in range(5)])

    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    try:
        await page.goto(base + "/tasks")
        await page.fill("#token", TOKEN)
        await page.click("#auth button[type=submit]")

        paused = page.locator(f'section.task[data-task-id="{paused_id}"]')
        await expect(paused.locator(".top .badge")).to_have_text("paused", timeout=UI_TIMEOUT_MS)
        await expect(paused.locator("[data-eta]")).to_have_text("left —")
        await expect(paused.locator("[data-elapsed]")).to_contain_text("elapsed ")

        running = page.locator(f'section.task[data-task-id="{running_id}"]')
        await expect(running.locator(".top .badge")).to_have_text("processing")
        await expect(running.locator("[data-eta]")).to_contain_text("left ~")
        await expect(running.locator("[data-rate]")).to_contain_text("items/s")

        done = page.locator(f'section.task[data-task-id="{done_id}"]')
        await expect(done.locator(".top .badge")).to_have_text("completed with errors")
        await expect(done.locator("[data-elapsed]")).to_contain_text("took ")
        await expect(done.locator("[data-eta]")).to_have_text("")

        # Each failed item's runs: numbered 1 and 2 (not 1 and 1), each with its times.
        await done.locator("details.failed summary").click()
        history = done.locator('details.failed tr[data-item-ref="invoice-03"] li')
        await expect(history).to_have_count(2, timeout=UI_TIMEOUT_MS)
        await expect(history.nth(0)).to_contain_text("attempt 1 ·")
        await expect(history.nth(1)).to_contain_text("attempt 2 (run 1 since retried) ·")
        for i in range(2):
            await expect(history.nth(i)).to_contain_text("→")
            await expect(history.nth(i)).to_contain_text("font 'Garamond' not embedded")

        # Search by ref, any status.
        await done.get_by_placeholder("find item by ref").fill("invoice-0")
        await done.get_by_role("button", name="Find").click()
        found = done.locator(".found tr[data-item-ref]")
        await expect(found).to_have_count(10, timeout=UI_TIMEOUT_MS)
        await expect(done.locator('.found tr[data-item-ref="invoice-07"] .badge')).to_have_text(
            "error"
        )
        await done.get_by_placeholder("find item by ref").fill("invoice-07")
        await done.get_by_role("button", name="Find").click()
        await expect(found).to_have_count(1, timeout=UI_TIMEOUT_MS)
        await shot(page, "tasks", tmp_path)

        # Filter by kind: only the paused task; then by status.
        await page.select_option("#kind-filter", EXTRACT)
        await expect(page.locator("section.task")).to_have_count(1, timeout=UI_TIMEOUT_MS)
        await expect(page.locator("section.task")).to_have_attribute("data-task-id", paused_id)
        assert page.url.endswith(f"/tasks?kind={EXTRACT}")
        await page.select_option("#kind-filter", "")
        await expect(page.locator("section.task")).to_have_count(3, timeout=UI_TIMEOUT_MS)
        await page.select_option("#status-filter", "completed")
        await expect(page.locator("section.task")).to_have_count(1, timeout=UI_TIMEOUT_MS)
        await expect(page.locator("section.task")).to_have_attribute("data-task-id", done_id)
    finally:
        await context.close()
