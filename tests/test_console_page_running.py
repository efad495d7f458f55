"""The console page in a real headless Chromium answers the three questions of
issue 38 a new user could not: which worker runs what (worker page <-> job
page), why a job has not run (a sentence on top of its page), and what a dead
letter held (its body, and a Discard button per letter).

Set up as tests/test_console_page.py: a real uvicorn server with a token, the
App's workers in this event loop, Debian's chromium.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shoal import Shoal
from shoal.api import create_api
from shoal.app import App
from shoal.ingest.message import new_envelope
from shoal.ingest.store import IngestStore
from shoal.queue.job import Job

from .conftest import wait_for
from .test_dashboard import UI_TIMEOUT_MS, browser, serving

__all__ = ["browser"]  # the fixture, shared with the tasks page's test

TOKEN = "console-token"
RUNNING_APP = App(name="tests.running:app")
STARTED = asyncio.Event()
RELEASE = asyncio.Event()


@RUNNING_APP.handler("papers", concurrency=2)
async def parse_paper(job: Job) -> None:
    STARTED.set()
    await RELEASE.wait()


@RUNNING_APP.handler("flaky", concurrency=1)
async def flaky(job: Job) -> None:
    raise TimeoutError("gateway timed out")


@pytest.fixture
async def console(boss: Shoal) -> AsyncIterator[str]:
    STARTED.clear()
    RELEASE.clear()
    api = create_api(boss, RUNNING_APP.batches(boss), token=TOKEN)
    stop = asyncio.Event()
    workers = asyncio.create_task(
        RUNNING_APP.run(boss, stop=stop, grace=timedelta(seconds=0.5), maintenance=False)
    )
    try:
        async with serving(api) as base:
            yield base
    finally:
        RELEASE.set()
        stop.set()
        await workers


async def signed_in(browser: Any, base: str) -> tuple[Any, Any]:
    from playwright.async_api import expect

    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    page = await context.new_page()
    page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
    await page.goto(base + "/")
    await expect(page.locator("#auth")).to_be_visible(timeout=UI_TIMEOUT_MS)
    await page.fill("#token", TOKEN)
    await page.click("#auth button[type=submit]")
    return context, page


async def test_a_worker_page_and_a_job_page_link_to_each_other(
    browser: Any, console: str, boss: Shoal
) -> None:
    from playwright.async_api import expect

    job_id = await boss.send("papers", {"doc": "paper-17", "pages": 12})
    await asyncio.wait_for(STARTED.wait(), 30)
    context, page = await signed_in(browser, console)
    try:
        # Workers -> the worker's page: the job it runs, with a preview of its data.
        await page.click('nav a[href="#/workers"]')
        worker = page.locator("tr[data-worker]")
        await expect(worker).to_contain_text("tests.running:app", timeout=UI_TIMEOUT_MS)
        await worker.locator("a").first.click()
        running = page.locator(f'tr[data-running="job:{job_id}"]')
        await expect(running).to_contain_text("paper-17", timeout=UI_TIMEOUT_MS)
        await expect(running).to_contain_text("papers")
        await expect(page.locator('nav a[href="#/workers"]')).to_have_class("on")

        # -> the job's page: why it is where it is, and who holds it ...
        await running.locator("a").first.click()
        why = page.locator("#why")
        await expect(why).to_contain_text("held by worker", timeout=UI_TIMEOUT_MS)
        await expect(why).to_contain_text("lease until")
        # ... -> back to the worker that holds it.
        await page.click("#holder")
        await expect(page.locator(f'tr[data-running="job:{job_id}"]')).to_be_visible(
            timeout=UI_TIMEOUT_MS
        )
    finally:
        await context.close()


async def test_a_job_page_says_why_the_job_has_not_run(
    browser: Any, console: str, boss: Shoal
) -> None:
    from playwright.async_api import expect

    later = await boss.send("reports", {"n": 1}, start_after=timedelta(hours=1))
    await boss.pause_queue("held")
    held = await boss.send("held", {"n": 2})
    retrying = await boss.send("flaky", {"n": 3}, retry_limit=3, retry_delay=timedelta(minutes=10))
    assert retrying is not None

    async def retried() -> bool:  # the worker's first attempt fails into retry
        return (await boss.get_job(retrying)).state.value == "retry"

    await wait_for(retried)
    context, page = await signed_in(browser, console)
    why = page.locator("#why")
    try:
        await page.goto(console + f"/#/job/{later}")
        await expect(why).to_contain_text("Waiting until", timeout=UI_TIMEOUT_MS)
        await expect(why).to_contain_text("(in 5")  # 59.9 min, or 59.8 on a slow run
        await expect(page.locator("dl.timings")).to_contain_text("start after")

        await page.goto(console + f"/#/job/{held}")
        await expect(why).to_contain_text("queue held is paused", timeout=UI_TIMEOUT_MS)

        await page.goto(console + f"/#/job/{retrying}")
        await expect(why).to_contain_text("retry 1 of 3 at", timeout=UI_TIMEOUT_MS)
        await expect(why).to_contain_text("gateway timed out")
        await expect(page.locator("dl.timings")).to_contain_text("next try at")
        await expect(page.locator("dl.timings")).to_contain_text("3 retries")
        await expect(page.locator('li[data-attempt="1"]')).to_contain_text("TimeoutError")
    finally:
        await context.close()


async def test_dead_letters_show_their_bodies_and_discard_one_by_one(
    browser: Any, console: str, boss: Shoal
) -> None:
    from playwright.async_api import expect

    at = datetime(2026, 1, 1, tzinfo=UTC)
    body = {
        "card": 7,
        "readings": [{"at": f"2026-01-01T00:{m:02d}:00Z", "mb": m} for m in range(30)],
    }
    letters = [
        (
            f"card-{i}",
            new_envelope(body if i == 0 else {"card": i}, published_at=at, id=f"card-{i}")
            .encode()
            .decode(),
            f"ValueError: card {i}: unknown account",
            4,
        )
        for i in range(2)
    ]
    store = IngestStore(boss.db)
    await store.dead_letter("card.ingest", "attempts", letters, now=None)
    context, page = await signed_in(browser, console)
    try:
        await page.goto(console + "/#/topics?dead=card.ingest")
        rows = page.locator("tr[data-dead-id]")
        await expect(rows).to_have_count(2, timeout=UI_TIMEOUT_MS)
        long = rows.first
        await expect(long).to_contain_text('"card": 7')
        await expect(long).to_contain_text("unknown account")
        full = json.dumps(body, indent=2)
        assert full[-40:] not in (await long.locator("pre").first.inner_text())  # cut short
        await long.get_by_text("show all").click()
        await expect(long.locator("details pre")).to_contain_text('"mb": 29')
        await expect(rows.nth(1)).to_contain_text('"card": 1')

        # Discard (confirmed): that letter only, for good.
        await rows.nth(1).get_by_role("button", name="Discard").click()
        await expect(rows).to_have_count(1, timeout=UI_TIMEOUT_MS)
        left = await store.dead_letters("card.ingest", include_redriven=True)
        assert [d.message_id for d in left] == ["card-0"]
    finally:
        await context.close()
