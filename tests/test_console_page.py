"""The console page at ``/`` in a real headless Chromium: every view renders with
data, the charts draw points, pause shows as paused, and the retry button on a
failed job makes it run again and the page then shows it completed.

Same set-up as the tasks page's test (tests/test_dashboard.py): a real uvicorn
server with a token, the App's workers in this event loop, Debian's chromium.
With ``SHOAL_WRITE_SCREENSHOTS=1`` the test also writes each view's screenshot
to docs/images/ (the pictures docs/console.md and the README show).
"""

from __future__ import annotations

import asyncio
import math
import os
import random
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from shoal import PermanentError, Shoal
from shoal.api import create_api
from shoal.app import App
from shoal.ingest.message import new_envelope
from shoal.ingest.store import IngestStore
from shoal.queue.job import Job
from shoal.testing import Probe

from .test_dashboard import UI_TIMEOUT_MS, browser, serving

__all__ = ["browser"]  # the fixture, shared with the tasks page's test

TOKEN = "console-token"
QUEUE = "email_send"
IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"
WRITE_SCREENSHOTS = os.environ.get("SHOAL_WRITE_SCREENSHOTS") == "1"

CONSOLE_APP = App(name="tests.console:app")
BROKEN = {"on": True}


@CONSOLE_APP.handler(QUEUE, concurrency=4)
async def send_email(job: Job) -> dict[str, Any]:
    if BROKEN["on"]:
        raise PermanentError(f"SMTP 550: mailbox {job.data['to']} unavailable")
    return {"sent_to": job.data["to"]}


@CONSOLE_APP.handler("reports", concurrency=1)
async def report(job: Job) -> None:
    return None


CONSOLE_APP.schedule("digest", "0 */10 * * * *", queue="reports")


async def seed_history(boss: Shoal) -> None:
    """An hour of 10 s samples ending now: the charts' points (the sampler writes
    one per 10 s, too slow to wait for in a test)."""
    now = datetime.now(UTC).replace(microsecond=0)  # noqa: TID251 - the server's real clock
    noise = random.Random(12)
    rows = []
    backlog = 120.0
    for i in range(360):
        at = now - timedelta(seconds=10 * (359 - i))
        busy = 0.5 + 0.5 * math.sin(i / 40)  # a slow swell of traffic
        done = max(0, int(30 + 25 * busy + noise.gauss(0, 4)))
        backlog = max(0.0, backlog + noise.gauss(0, 6) + (busy - 0.5) * 8)
        run = 0.05 + 0.05 * busy + abs(noise.gauss(0, 0.01))
        wait = 0.2 + backlog / 200 + abs(noise.gauss(0, 0.05))
        rows.append(
            (
                10,
                "*",
                at,
                done,
                int(noise.random() < 0.15),
                int(backlog),
                4,
                int(busy * 3),
                run,
                run * 3.2,
                wait,
                wait * 2.5,
            )
        )
    query = sql.SQL(
        "INSERT INTO {}.history (resolution, queue, at, completed, failed, waiting, running, "
        "retrying, run_p50_s, run_p95_s, wait_p50_s, wait_p95_s) "
        "VALUES (%s, %s, %s, %s, %s::int, %s, %s, %s, %s, %s, %s, %s)"
    ).format(sql.Identifier(boss.db.schema))

    async def insert(conn: Any) -> None:
        async with conn.cursor() as cur:
            await cur.executemany(query, rows)

    await boss.db.run(insert)


async def seed_dead_letters(boss: Shoal) -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    letters = [
        (
            f"card-{i}",
            new_envelope({"card": i}, published_at=at, id=f"card-{i}").encode().decode(),
            f"ValueError: card {i}: unknown account",
            5,
        )
        for i in range(3)
    ]
    await IngestStore(boss.db).dead_letter("card.ingest", "attempts", letters, now=None)


@pytest.fixture
async def console(boss: Shoal) -> AsyncIterator[tuple[str, Probe]]:
    BROKEN["on"] = True
    probe = Probe(boss)
    api = create_api(boss, CONSOLE_APP.batches(boss), token=TOKEN)
    stop = asyncio.Event()
    workers = asyncio.create_task(
        CONSOLE_APP.run(boss, stop=stop, grace=timedelta(seconds=0.5), maintenance=False)
    )
    try:
        async with serving(api) as base:
            yield base, probe
    finally:
        stop.set()
        await workers


async def shot(page: Any, name: str, tmp_path: Path) -> None:
    target = IMAGES if WRITE_SCREENSHOTS else tmp_path
    target.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(target / f"console-{name}.png"), full_page=True)


async def test_every_view_renders_and_acts(
    browser: Any, console: tuple[str, Probe], boss: Shoal, tmp_path: Path
) -> None:
    from playwright.async_api import expect

    base, probe = console
    for i in range(3):
        await boss.send(QUEUE, {"to": f"user{i}@example.com"}, retry_limit=0)
    await probe.job_finished(QUEUE, outcome="failed", count=3)
    await seed_history(boss)
    await seed_dead_letters(boss)

    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    page = await context.new_page()
    page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
    try:
        await page.goto(base + "/")
        await expect(page.locator("#auth")).to_be_visible(timeout=UI_TIMEOUT_MS)
        await page.fill("#token", TOKEN)
        await page.click("#auth button[type=submit]")

        # Overview: the counts, each linking to its page, and four charts with points.
        tile = page.locator('[data-tile="failed jobs"] b')
        await expect(tile).to_have_text("3", timeout=UI_TIMEOUT_MS)
        await expect(page.locator('[data-tile="dead letters"] b')).to_have_text("3")
        await expect(page.locator('[data-tile="live workers"] b')).to_have_text("1")
        charts = page.locator(".chart svg")
        await expect(charts).to_have_count(4)
        for i in range(4):
            points = int(await charts.nth(i).get_attribute("data-points") or "0")
            assert points >= 360, f"chart {i} drew {points} points"
        await shot(page, "overview", tmp_path)

        # Queues: pause shows as paused (and is), resume clears it.
        await page.click('nav a[href="#/queues"]')
        row = page.locator(f'tr[data-queue="{QUEUE}"]')
        await expect(row.locator('[data-count="failed"]')).to_have_text("3", timeout=UI_TIMEOUT_MS)
        await row.get_by_role("button", name="Pause").click()
        await expect(row.locator(".badge.paused")).to_be_visible(timeout=UI_TIMEOUT_MS)
        assert await boss.paused_queues() == [QUEUE]
        await shot(page, "queues", tmp_path)
        await row.get_by_role("button", name="Resume").click()
        await expect(row.locator(".badge.paused")).to_have_count(0, timeout=UI_TIMEOUT_MS)
        assert await boss.paused_queues() == []

        # Jobs: failed first; a job's page shows each attempt's error with its time.
        await page.goto(base + f"/#/jobs?queue={QUEUE}&state=failed")
        rows = page.locator("tr[data-job-id]")
        await expect(rows).to_have_count(3, timeout=UI_TIMEOUT_MS)
        await expect(rows.first).to_contain_text("SMTP 550")
        await shot(page, "jobs", tmp_path)
        job_id = await rows.first.get_attribute("data-job-id")
        await rows.first.locator("a").click()
        await expect(page.locator("h2 .badge")).to_have_text("failed", timeout=UI_TIMEOUT_MS)
        await expect(page.locator('li[data-attempt="1"]')).to_contain_text("attempt 1 at")
        await expect(page.locator("#payload")).to_contain_text("@example.com")
        await shot(page, "job", tmp_path)

        # Retry on the job's page: it runs again, and the page shows it completed.
        BROKEN["on"] = False
        await page.click("#retry")
        await probe.job_finished(QUEUE, outcome="completed", job_id=int(job_id or 0))
        await expect(page.locator("h2 .badge")).to_have_text("completed", timeout=UI_TIMEOUT_MS)
        await expect(page.locator("#output")).to_contain_text("sent_to")

        # Retry all failed of the queue (confirmed): the other two run and complete.
        await page.click('nav a[href="#/queues"]')
        await row.get_by_role("button", name="Retry failed (2)").click()
        await probe.job_finished(QUEUE, outcome="completed", count=2)
        await expect(row.locator('[data-count="completed"]')).to_have_text(
            "3", timeout=UI_TIMEOUT_MS
        )

        # Schedules: pause shows as paused.
        await page.click('nav a[href="#/schedules"]')
        digest = page.locator('tr[data-schedule="digest"]')
        await expect(digest).to_contain_text("reports", timeout=UI_TIMEOUT_MS)
        await digest.get_by_role("button", name="Pause").click()
        await expect(digest.locator(".badge.paused")).to_be_visible(timeout=UI_TIMEOUT_MS)
        await shot(page, "schedules", tmp_path)

        # Topics: dead letters with their errors; redrive one.
        await page.goto(base + "/#/topics?dead=card.ingest")
        letters = page.locator("tr[data-dead-id]")
        await expect(letters).to_have_count(3, timeout=UI_TIMEOUT_MS)
        await expect(letters.first).to_contain_text("unknown account")
        await shot(page, "topics", tmp_path)
        await letters.first.get_by_role("button", name="Redrive").click()
        await expect(letters).to_have_count(2, timeout=UI_TIMEOUT_MS)

        # Workers: this test's process, live.
        await page.click('nav a[href="#/workers"]')
        worker = page.locator("tr[data-worker]")
        await expect(worker).to_contain_text("tests.console:app", timeout=UI_TIMEOUT_MS)
        await expect(worker.locator(".badge")).to_have_text("live")
        await shot(page, "workers", tmp_path)

        # Tasks: the batch tasks page, one click away.
        await page.click('nav a[href="/tasks"]')
        await expect(page.locator("#tasks")).to_contain_text("No tasks yet", timeout=UI_TIMEOUT_MS)
    finally:
        await context.close()
