"""The console page's switch for shoal's own queues (names ``shoal.``), in a real
headless Chromium: hidden by default, shown when switched on, and the choice
kept across a reload (issue 38, item 4)."""

from __future__ import annotations

from typing import Any

from shoal import Shoal
from shoal.api import create_api
from shoal.batch.aggregator import AGGREGATOR_QUEUE
from shoal.batch.service import Batches
from shoal.queue.job import Job
from shoal.testing import drain

from .test_dashboard import UI_TIMEOUT_MS, browser, serving

__all__ = ["browser"]  # the fixture


async def ok(job: Job) -> None:
    return None


async def test_switch_shows_shoals_own_queues_and_is_remembered(browser: Any, boss: Shoal) -> None:
    from playwright.async_api import expect

    await boss.send("email", {})
    await boss.send(AGGREGATOR_QUEUE, {})
    await drain(boss, AGGREGATOR_QUEUE, ok)
    await boss.schedule(AGGREGATOR_QUEUE, "* * * * * *", {}, queue=AGGREGATOR_QUEUE)
    async with serving(create_api(boss, Batches(boss, {}), token=None)) as base:
        context = await browser.new_context(viewport={"width": 1280, "height": 800})
        page = await context.new_page()
        try:
            await page.goto(base + "/#/queues")
            internal_row = page.locator(f'tr[data-queue="{AGGREGATOR_QUEUE}"]')
            await expect(page.locator('tr[data-queue="email"]')).to_be_visible(
                timeout=UI_TIMEOUT_MS
            )
            await expect(internal_row).to_have_count(0)
            await expect(page.locator("#internal")).not_to_be_checked()

            await page.check("#internal")
            await expect(internal_row).to_be_visible(timeout=UI_TIMEOUT_MS)
            await page.reload()  # the switch is remembered
            await expect(page.locator("#internal")).to_be_checked(timeout=UI_TIMEOUT_MS)
            await expect(internal_row).to_be_visible(timeout=UI_TIMEOUT_MS)
            await page.click('nav a[href="#/schedules"]')
            schedule = page.locator(f'tr[data-schedule="{AGGREGATOR_QUEUE}"]')
            await expect(schedule).to_be_visible(timeout=UI_TIMEOUT_MS)

            await page.uncheck("#internal")
            await expect(schedule).to_have_count(0, timeout=UI_TIMEOUT_MS)
            await page.click('nav a[href="#/jobs"]')
            await expect(page.locator("tr[data-job-id]")).to_have_count(1, timeout=UI_TIMEOUT_MS)
            await expect(page.locator("tr[data-job-id]")).to_contain_text("email")
        finally:
            await context.close()
