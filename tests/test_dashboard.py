"""The dashboard in a real headless Chromium: live progress bars, failed items, cancel, retry.

A real uvicorn server (with a token, so the page's token prompt is exercised)
and the App's workers run in this test's event loop; Playwright drives Debian's
``chromium`` (never a downloaded browser). The test skips, saying why, only
when that browser is missing or cannot start on this machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from shoal import PermanentError, Shoal
from shoal.api import create_api
from shoal.app import App
from shoal.batch.item import Item
from shoal.batch.kinds import BatchKind
from shoal.batch.service import Batches

from .conftest import BROWSER_SKIP, wait_for

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TOKEN = "dashboard-token"
WORK = "dash.work"
IDLE = "dash.idle"  # declared to the API only: no worker runs it, so it can be cancelled
UI_TIMEOUT_MS = 20_000
HAVE_CHROMIUM = os.path.exists(CHROMIUM)

DASH_APP = App()


@DASH_APP.batch(WORK, concurrency=4, retry_limit=0, retry_delay=timedelta(milliseconds=50))
async def work(item: Item) -> dict[str, Any]:
    """Sleeps ``sleep_ms`` so the bar has time to move; ``fail`` fails it for good."""
    data = item.data if isinstance(item.data, dict) else {}
    await asyncio.sleep(data.get("sleep_ms", 0) / 1000)  # noqa: TID251 - simulated work the bar shows
    if data.get("fail"):
        raise PermanentError(f"{item.ref}: unreadable scan")
    return {"ref": item.ref}


async def _never(item: Item) -> None:  # pragma: no cover - no worker runs the idle kind
    raise AssertionError("the idle kind has no worker")


class _TestServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield  # leave pytest's signal handling alone


@contextlib.asynccontextmanager
async def serving(api: FastAPI) -> AsyncIterator[str]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = _TestServer(
        uvicorn.Config(api, lifespan="off", log_level="warning", ws="none", http="h11")
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await wait_for(lambda: server.started, timeout_s=10)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


def _skip_loudly(reason: str) -> None:
    print(f"\n*** test_dashboard SKIPPED: {reason} ***\n", file=sys.stderr)
    pytest.skip(BROWSER_SKIP + reason)  # conftest's summary names it at the end of the run


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    if not HAVE_CHROMIUM:
        _skip_loudly(f"{CHROMIUM} is missing: install it with `apt-get install -y chromium`")
    try:
        from playwright.async_api import async_playwright
    except ImportError as exc:  # pragma: no cover - the test extra installs it
        _skip_loudly(f"playwright is not installed ({exc}): pip install -e '.[test]'")
    async with async_playwright() as playwright:
        try:
            chromium = await playwright.chromium.launch(
                executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=60_000
            )
        except Exception as exc:  # the browser exists but cannot start on this machine
            _skip_loudly(f"{CHROMIUM} cannot be launched: {type(exc).__name__}: {exc}")
        try:
            yield chromium
        finally:
            await chromium.close()


@pytest.fixture
async def dashboard(boss: Shoal) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    """The API with a token, served over TCP, and DASH_APP's workers running."""
    kinds = {**DASH_APP.kinds, IDLE: BatchKind(name=IDLE, handler=_never)}
    api = create_api(boss, Batches(boss, kinds), token=TOKEN)
    stop = asyncio.Event()
    workers = asyncio.create_task(DASH_APP.run(boss, stop=stop, grace=timedelta(seconds=0.5)))
    try:
        async with (
            serving(api) as base,
            httpx.AsyncClient(
                base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}
            ) as client,
        ):
            yield base, client
    finally:
        stop.set()
        await workers


async def test_progress_bars_reach_100_percent_and_failed_items_show_their_errors(
    browser: Any, dashboard: tuple[str, httpx.AsyncClient]
) -> None:
    from playwright.async_api import expect

    base, client = dashboard
    page = await browser.new_page()
    page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))  # Cancel's confirm
    try:
        await page.goto(base + "/tasks")
        # The API needs a token: the page asks for it, then shows the (empty) task list.
        await expect(page.locator("#auth")).to_be_visible(timeout=UI_TIMEOUT_MS)
        await page.fill("#token", TOKEN)
        await page.click("#auth button[type=submit]")
        await expect(page.locator("#auth")).to_be_hidden(timeout=UI_TIMEOUT_MS)
        await expect(page.locator("#tasks")).to_contain_text("No tasks yet", timeout=UI_TIMEOUT_MS)

        # Created while the page is open: it appears by polling and fills up live.
        items = [
            {"ref": f"scan-{i:02}", "data": {"sleep_ms": 150, "fail": i in (3, 7)}}
            for i in range(16)
        ]
        created = await client.post("/v1/tasks", json={"kind": WORK, "items": items})
        assert created.status_code == 202, created.text
        task_id = created.json()["task_id"]
        card = page.locator(f'section.task[data-task-id="{task_id}"]')
        bar = card.get_by_role("progressbar")
        await expect(bar).to_be_visible(timeout=UI_TIMEOUT_MS)
        await expect(bar).to_have_attribute("aria-valuenow", "100", timeout=UI_TIMEOUT_MS)
        await expect(bar).to_contain_text("100%")
        await expect(card.locator(".badge")).to_have_text(
            "completed with errors", timeout=UI_TIMEOUT_MS
        )
        await expect(card.locator('[data-count="completed"]')).to_have_text("14 completed")
        await expect(card.locator('[data-count="error"]')).to_have_text("2 error")

        # Failed items, with each one's error.
        await card.locator("details.failed summary").click()
        failed = card.locator("details.failed table")
        await expect(failed).to_contain_text("scan-03", timeout=UI_TIMEOUT_MS)
        await expect(failed).to_contain_text("scan-07")
        await expect(failed).to_contain_text("PermanentError: scan-03: unreadable scan")

        # Retry failed: the items run again (and fail again), the task closes again.
        await card.get_by_role("button", name="Retry failed").click()

        async def retried() -> bool:
            page_ = (await client.get(f"/v1/tasks/{task_id}/items?status=error")).json()
            view = (await client.get(f"/v1/tasks/{task_id}")).json()
            return view["status"] == "completed" and all(
                len(i["errors"]) == 2 for i in page_["items"]
            )

        await wait_for(retried, timeout_s=20)
        await expect(card.locator(".badge")).to_have_text(
            "completed with errors", timeout=UI_TIMEOUT_MS
        )
        await expect(card.locator("details.failed table")).to_contain_text(
            "attempt 1", timeout=UI_TIMEOUT_MS
        )

        # Cancel: an idle task's pending items are cancelled and the task closes.
        idle = await client.post("/v1/tasks", json={"kind": IDLE, "items": ["x", "y", "z"]})
        idle_id = idle.json()["task_id"]
        idle_card = page.locator(f'section.task[data-task-id="{idle_id}"]')
        await expect(idle_card.locator(".badge")).to_have_text("processing", timeout=UI_TIMEOUT_MS)
        await expect(idle_card.get_by_role("progressbar")).to_have_attribute("aria-valuenow", "0")
        await idle_card.get_by_role("button", name="Cancel").click()
        await expect(idle_card.locator(".badge")).to_have_text("cancelled", timeout=UI_TIMEOUT_MS)
        await expect(idle_card.locator('[data-count="cancelled"]')).to_have_text("3 cancelled")
        await expect(idle_card.get_by_role("button", name="Cancel")).to_be_disabled()
        # Newest first.
        ids = await page.locator("section.task").evaluate_all(
            "nodes => nodes.map(n => n.dataset.taskId)"
        )
        assert ids == [idle_id, task_id]
    finally:
        await page.close()


async def test_tasks_page_has_the_console_header_tracebacks_and_a_cancel_that_can_be_undone(
    browser: Any, dashboard: tuple[str, httpx.AsyncClient]
) -> None:
    from playwright.async_api import expect

    base, client = dashboard
    page = await browser.new_page()
    dialogs: list[str] = []
    answer = {"accept": False}

    async def on_dialog(dialog: Any) -> None:
        dialogs.append(dialog.message)
        await (dialog.accept() if answer["accept"] else dialog.dismiss())

    page.on("dialog", on_dialog)
    try:
        # The console's header and navigation, the same on both pages, Tasks marked.
        await page.goto(base + "/")
        console_nav = await page.locator("header nav a").all_inner_texts()
        console_bg = await page.locator("header").evaluate("h => getComputedStyle(h).background")
        await page.goto(base + "/tasks")
        await page.fill("#token", TOKEN)
        await page.click("#auth button[type=submit]")
        assert await page.locator("header nav a").all_inner_texts() == console_nav
        assert await page.locator("header").evaluate("h => getComputedStyle(h).background") == (
            console_bg
        )
        await expect(page.locator("header nav a.on")).to_have_text("Tasks")

        # A failed item's stored traceback, shown when the operator opens it.
        created = await client.post(
            "/v1/tasks", json={"kind": WORK, "items": ["fine", {"ref": "bad", "data": {"fail": 1}}]}
        )
        task_id = created.json()["task_id"]
        card = page.locator(f'section.task[data-task-id="{task_id}"]')
        await expect(card.locator(".badge")).to_have_text(
            "completed with errors", timeout=UI_TIMEOUT_MS
        )
        await card.locator("details.failed > summary").click()
        entry = card.locator('tr[data-item-ref="bad"] li[data-attempt="1"]')
        trace = entry.locator("details.traceback pre")
        await expect(entry.locator("details.traceback summary")).to_be_visible(
            timeout=UI_TIMEOUT_MS
        )
        await expect(trace).to_be_hidden()
        await entry.locator("details.traceback summary").click()
        await expect(trace).to_be_visible()
        await expect(trace).to_contain_text("Traceback (most recent call last)")
        await expect(trace).to_contain_text("PermanentError: bad: unreadable scan")

        # Cancel asks first, saying what happens and how to undo it; declined, nothing changes.
        idle = await client.post("/v1/tasks", json={"kind": IDLE, "items": ["x", "y", "z"]})
        idle_id = idle.json()["task_id"]
        idle_card = page.locator(f'section.task[data-task-id="{idle_id}"]')
        bar = idle_card.get_by_role("progressbar")
        await expect(idle_card.locator(".badge")).to_have_text("processing", timeout=UI_TIMEOUT_MS)
        await idle_card.get_by_role("button", name="Cancel").click()
        assert len(dialogs) == 1
        assert "3 pending item(s) will not start" in dialogs[0]
        assert 'press "Retry failed"' in dialogs[0]
        view = (await client.get(f"/v1/tasks/{idle_id}")).json()
        assert (view["status"], view["progress"]["cancelled"]) == ("processing", 0)
        # Accepted: cancelled, and the card shows the split, not "100%".
        answer["accept"] = True
        await idle_card.get_by_role("button", name="Cancel").click()
        await expect(idle_card.locator(".badge")).to_have_text("cancelled", timeout=UI_TIMEOUT_MS)
        await expect(bar).to_have_text("0 done · 0 failed · 3 cancelled")
        await expect(bar).to_have_attribute("aria-valuenow", "0")
        await expect(bar.locator("span.cancelled")).to_have_attribute("style", "width: 100%;")

        # The undo: Retry failed re-opens the cancelled task and its items.
        await idle_card.get_by_role("button", name="Retry failed").click()
        await expect(idle_card.locator(".badge")).to_have_text("processing", timeout=UI_TIMEOUT_MS)
        await expect(idle_card.locator('[data-count="pending"]')).to_have_text("3 pending")
        await expect(bar).to_have_text("0%")
        view = (await client.get(f"/v1/tasks/{idle_id}")).json()
        assert (view["status"], view["progress"]["pending"]) == ("processing", 3)
    finally:
        await page.close()
