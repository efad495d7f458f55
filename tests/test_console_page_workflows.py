"""The console's Workflows tab in a real headless Chromium (issue 39, item 5).

A run of ``ops.order`` fails at its second step: the run's page shows its
steps on a timeline with the failed step's error folded under it; Retry runs
it again from that step and the page sees it complete. Set up as
tests/test_console_page_running.py: a real uvicorn server with a token, the
workflows' workers in this event loop, Debian's chromium.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from shoal import Shoal
from shoal.api import create_api
from shoal.workflow import RunStatus, Workflows

from . import wfopsapp
from .conftest import wait_for
from .test_console_page_running import TOKEN, signed_in
from .test_dashboard import UI_TIMEOUT_MS, browser, serving

__all__ = ["browser"]


@pytest.fixture
async def workflows(boss: Shoal) -> AsyncIterator[Workflows]:
    wfopsapp.broken["reserve"] = True
    api = wfopsapp.app.workflows(boss)
    for name in api.specs:
        api.work(name)
    yield api
    await boss.stop_workers(timedelta(seconds=5))


@pytest.fixture
async def console(boss: Shoal, workflows: Workflows) -> AsyncIterator[str]:
    api = create_api(boss, wfopsapp.app.batches(boss), token=TOKEN, workflows=workflows)
    async with serving(api) as base:
        yield base


async def test_a_failed_runs_timeline_shows_the_error_and_retry_completes_it(
    browser: Any, console: str, workflows: Workflows
) -> None:
    from playwright.async_api import expect

    await workflows.start("ops.order", {"sku": "Z-3"}, id="order-z3")
    await workflows.start("ops.nap", id="nap-1")

    async def failed() -> bool:
        return (await workflows.get("order-z3")).status is RunStatus.FAILED

    await wait_for(failed)
    context, page = await signed_in(browser, console)
    try:
        # The list: both runs with their status; the filter narrows it to the failed one.
        await page.click('nav a[href="#/workflows"]')
        row = page.locator('tr[data-run="order-z3"]')
        await expect(row).to_contain_text("failed", timeout=UI_TIMEOUT_MS)
        await expect(row).to_contain_text("ops.order")
        await expect(page.locator('tr[data-run="nap-1"]')).to_be_visible()
        await page.select_option("#run-status-filter", "failed")
        await expect(page.locator('tr[data-run="nap-1"]')).to_have_count(0, timeout=UI_TIMEOUT_MS)
        await expect(row).to_be_visible()

        # The run's page: its input, its steps on the timeline, the error under step 2.
        await row.locator("a").click()
        await expect(page.locator("#run-status")).to_contain_text("failed", timeout=UI_TIMEOUT_MS)
        await expect(page.locator('nav a[href="#/workflows"]')).to_have_class("on")
        await expect(page.locator("#run-input")).to_contain_text('"sku": "Z-3"')
        timeline = page.locator("#timeline")
        await expect(timeline.locator('[data-step="1"]')).to_contain_text("check stock")
        await expect(timeline.locator('[data-step="1"]')).to_contain_text("completed")
        await expect(timeline.locator('[data-step="2"]')).to_contain_text("reserve")
        await expect(timeline.locator('[data-step="2"]')).to_contain_text("failed")
        await expect(timeline.locator('[data-step-bar="1"] .bar.completed')).to_be_visible()
        await expect(timeline.locator('[data-step-bar="2"] .bar.failed')).to_be_visible()
        error = timeline.locator('[data-step-error="2"]')
        await expect(error.locator("summary")).to_contain_text(
            "RuntimeError: inventory service refused Z-3"
        )
        traceback = error.locator("pre")
        await expect(traceback).to_be_hidden()  # folded until asked for
        await error.locator("summary").click()
        await expect(traceback).to_contain_text("Traceback", timeout=UI_TIMEOUT_MS)
        await expect(page.locator("#cancel-run")).to_be_disabled()

        # Retry: it runs again from step 2, and the page sees it complete.
        wfopsapp.broken["reserve"] = False
        await page.click("#retry-run")
        await expect(page.locator("#run-status")).to_contain_text(
            "completed", timeout=UI_TIMEOUT_MS
        )
        await expect(page.locator("#run-result")).to_contain_text("reserved Z-3")
        await expect(timeline.locator('[data-step-error="2"]')).to_have_count(0)
        await expect(timeline.locator('[data-step-bar="2"] .bar.completed')).to_be_visible()
        await expect(page.locator("#retry-run")).to_be_disabled()
    finally:
        await context.close()


async def test_a_parent_links_to_its_sleeping_child_and_cancel_asks_first(
    browser: Any, console: str, workflows: Workflows
) -> None:
    from playwright.async_api import expect

    await workflows.start("ops.parent", id="parent-1")  # its child, "parent-1/1", naps

    async def sleeping() -> bool:
        naps = await workflows.list(name="ops.nap", status=RunStatus.SLEEPING)
        return [run.id for run in naps] == ["parent-1/1"]

    await wait_for(sleeping)
    context, page = await signed_in(browser, console)  # accepts every confirm()
    questions: list[str] = []
    page.on("dialog", lambda dialog: questions.append(dialog.message))
    try:
        # The parent waits for its child, and its page links to the child's.
        await page.goto(console + "/#/run/parent-1")
        await expect(page.locator("#run-status")).to_contain_text("waiting", timeout=UI_TIMEOUT_MS)
        await page.click("#timeline a.child-run")
        await expect(page.locator("h2")).to_contain_text("run parent-1/1", timeout=UI_TIMEOUT_MS)
        sleep = page.locator('#timeline [data-step="2"]')
        await expect(sleep).to_contain_text("sleep until", timeout=UI_TIMEOUT_MS)
        await expect(page.locator('#timeline [data-step-bar="2"] .bar.waiting')).to_be_visible()
        await page.click("#cancel-run")
        await expect(page.locator("#run-status")).to_contain_text(
            "cancelled", timeout=UI_TIMEOUT_MS
        )
        assert questions and "Cancel run parent-1/1?" in questions[0]
        # The parent hears of it: its wait for the child ends, and it fails.
        await page.goto(console + "/#/run/parent-1")
        await expect(page.locator("#run-status")).to_contain_text("failed", timeout=UI_TIMEOUT_MS)
    finally:
        await context.close()
