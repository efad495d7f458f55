"""The overview's charts in a real headless Chromium: round ticks on y, clock
times on x, the nearest sample's values on hover, and a run-time chart that
one 15 s outlier does not flatten (it is clipped, and the chart says so).

Same set-up as tests/test_dashboard.py (a real uvicorn server, Debian's chromium).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg import sql

from shoal import Shoal
from shoal.api import create_api
from shoal.app import App

from .test_dashboard import UI_TIMEOUT_MS, browser, serving

__all__ = ["browser"]

SAMPLES = 60  # ten minutes of 10 s samples
OUTLIER = 37  # the sample whose run p95 is 15 s
PLOT_TOP, PLOT_BOTTOM = 10, 170 - 22  # the chart's plot area, in SVG units (console.html)


async def seed_runs(boss: Shoal) -> datetime:
    """Run times of 0.1-0.5 s (p50) and twice that (p95), but one p95 of 15 s."""
    now = datetime.now(UTC).replace(microsecond=0)  # noqa: TID251 - the server's real clock
    rows = []
    for i in range(SAMPLES):
        run = 0.1 + 0.1 * (i % 5)
        p95 = 15.0 if i == OUTLIER else 2 * run
        at = now - timedelta(seconds=10 * (SAMPLES - 1 - i))
        rows.append((10, "*", at, 10, 0, 5, 1, 0, run, p95, 0.2, 0.4))
    query = sql.SQL(
        "INSERT INTO {}.history (resolution, queue, at, completed, failed, waiting, running, "
        "retrying, run_p50_s, run_p95_s, wait_p50_s, wait_p95_s) "
        "VALUES (%s, %s, %s, %s, %s::int, %s, %s, %s, %s, %s, %s, %s)"
    ).format(sql.Identifier(boss.db.schema))

    async def insert(conn: Any) -> None:
        async with conn.cursor() as cur:
            await cur.executemany(query, rows)

    await boss.db.run(insert)
    return now - timedelta(seconds=10 * (SAMPLES - 1 - OUTLIER))


@pytest.fixture
async def base(boss: Shoal) -> AsyncIterator[str]:
    async with serving(create_api(boss, App().batches(boss), token=None)) as url:
        yield url


def points(attr: str | None) -> list[tuple[float, float]]:
    pairs = (p.split(",") for p in (attr or "").split())
    return [(float(x), float(y)) for x, y in pairs]


async def test_charts_have_ticks_hover_values_and_survive_one_outlier(
    browser: Any, base: str, boss: Shoal
) -> None:
    from playwright.async_api import expect

    spike_at = await seed_runs(boss)
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        await page.goto(base + "/#/overview?window=15m")
        run = page.locator('.chart:has(h3:text-is("Run time"))')
        chart = run.locator("svg")
        await expect(chart).to_have_attribute(
            "data-points", str(2 * SAMPLES), timeout=UI_TIMEOUT_MS
        )

        # Ticks: a few round values on y, from 0; clock times on x.
        y_ticks = await chart.locator("text.tick-y").all_text_contents()
        assert 3 <= len(y_ticks) <= 8 and y_ticks[0] == "0 ms", y_ticks
        x_ticks = await chart.locator("text.tick-x").all_text_contents()
        assert len(x_ticks) >= 3 and all(":" in t for t in x_ticks), x_ticks
        depth_ticks = await page.locator(
            '.chart:has(h3:text-is("Queue depth")) text.tick-y'
        ).all_text_contents()
        assert depth_ticks[:3] == ["0", "2", "4"], depth_ticks  # waiting is 5: 0, 2, 4, 6

        # One 15 s outlier: clipped, said on the chart, and the other points keep their height.
        await expect(chart.locator("text.clip-note")).to_contain_text("clipped at")
        await expect(chart.locator("text.clip-note")).to_contain_text("peak 15.0 s")
        p95 = points(
            await chart.locator('polyline[data-series="run_p95_s"]').get_attribute("points")
        )
        p50 = points(
            await chart.locator('polyline[data-series="run_p50_s"]').get_attribute("points")
        )
        others = [y for i, (_, y) in enumerate(p95) if i != OUTLIER]
        plot = PLOT_BOTTOM - PLOT_TOP
        # 0.2-1.0 s on a scale to 15 s would span 5% of the plot; clipped, over a quarter.
        assert max(others) - min(others) > 0.25 * plot, others
        assert max(y for _, y in p50) - min(y for _, y in p50) > 0.1 * plot
        assert p95[OUTLIER][1] == pytest.approx(PLOT_TOP)  # drawn at the top edge

        # Hover over the outlier: the readout gives its true value and time.
        box = await chart.bounding_box()
        assert box is not None
        sx = box["x"] + p95[OUTLIER][0] / 520 * box["width"]
        await page.mouse.move(sx, box["y"] + box["height"] / 2)
        readout = run.locator(".readout")
        await expect(readout).to_contain_text("p95 15.0 s")
        await expect(readout).to_contain_text("p50 300 ms")
        assert await readout.get_attribute("data-at") == spike_at.isoformat().replace(
            "+00:00", ".000Z"
        )
        # The readout stays through the page's refreshes while the pointer is there.
        await expect(page.locator("#status")).to_contain_text("updated", timeout=UI_TIMEOUT_MS)
        await page.evaluate("refresh(true, true)")
        await expect(readout).to_contain_text("p95 15.0 s")
        await page.mouse.move(1, 1)
        await expect(readout).not_to_contain_text("p95")
    finally:
        await page.close()
