"""The workbench page in headless Chromium: upload, pick, start, watch, browse, correct a
value, retry, export (the correction in it), re-run one document; a value's page with
its passage boxed.

A real uvicorn server (with a token, so the page's token prompt is exercised)
serves shoal's API with the workbench mounted; the extraction workers run in
this test's event loop. Playwright drives Debian's ``chromium``; the test
skips, saying why, only when that browser is missing or cannot start.
"""

from __future__ import annotations

import asyncio
import csv
import io
import os
import re
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from shoal import Shoal
from shoal_extract.serve import build_api, serving
from tests.test_dashboard import browser  # noqa: F401 - the fixture, shared

from .conftest import Bench, open_bench

TOKEN = "workbench-token"
UI_TIMEOUT_MS = 20_000


@pytest.fixture
async def workbench(boss: Shoal) -> AsyncIterator[tuple[str, Bench]]:
    bench = await open_bench(boss)
    api = build_api(boss, bench.bench.batches, bench.bench, token=TOKEN, token_name="reviewer-1")
    stop = asyncio.Event()
    workers = asyncio.create_task(
        bench.extraction.app.run(boss, stop=stop, grace=timedelta(seconds=0.5))
    )
    try:
        async with serving(api, port=0) as base:
            yield base, bench
    finally:
        stop.set()
        await workers
        await bench.extraction.close()


async def test_upload_pick_start_watch_browse_retry_and_export(
    browser: Any,  # noqa: F811 - the fixture imported above
    workbench: tuple[str, Bench],
    corpus_dir: Path,
    tmp_path: Path,
    key: dict[str, Any],
) -> None:
    from playwright.async_api import expect

    base, _ = workbench
    truth = {d["file"]: d["fields"] for d in key["documents"]}
    context = await browser.new_context(accept_downloads=True)
    page = await context.new_page()
    try:
        await page.goto(base + "/extraction")
        await expect(page.locator("#auth")).to_be_visible(timeout=UI_TIMEOUT_MS)
        await page.fill("#token", TOKEN)
        await page.click("#auth button[type=submit]")
        await expect(page.locator("#auth")).to_be_hidden(timeout=UI_TIMEOUT_MS)
        await expect(page.locator("#template")).to_have_value(
            "clinical_trial", timeout=UI_TIMEOUT_MS
        )

        # Upload: two papers, a broken PDF, and a file type the workbench refuses.
        refused = tmp_path / "notes.docx"
        refused.write_bytes(b"PK\x03\x04 not a paper")
        files = [
            corpus_dir / "paper-01.pdf",
            corpus_dir / "paper-06.txt",
            corpus_dir / "broken-truncated.pdf",
            refused,
        ]
        await page.set_input_files("#upload-input", [str(f) for f in files])
        await page.click("#upload-btn")
        message = page.locator("#upload-msg")
        await expect(message).to_contain_text("notes.docx: refused", timeout=UI_TIMEOUT_MS)
        await expect(message).to_contain_text("not a supported file type")
        await expect(message).to_contain_text("paper-01.pdf: stored as document")
        rows = page.locator("#docs tbody tr")
        await expect(rows).to_have_count(3, timeout=UI_TIMEOUT_MS)

        # Pick them all, start the default template with the rules extractor.
        await page.check("#pick-all")
        await expect(page.locator("#picked")).to_have_text("3 document(s) picked")
        await page.click("#start")
        await expect(page.locator("#start-msg")).to_contain_text("started with 3 document(s)")
        card = page.locator("section.task").first
        bar = card.get_by_role("progressbar")
        await expect(bar).to_have_attribute("aria-valuenow", "100", timeout=UI_TIMEOUT_MS)
        await expect(card.locator(".badge")).to_have_text(
            "completed with errors", timeout=UI_TIMEOUT_MS
        )
        await expect(card.locator('[data-count="completed"]')).to_have_text("2 completed")
        await expect(card.locator('[data-count="error"]')).to_have_text("1 error")

        # Results: per-field values, not-found fields, and the parser's error.
        await card.locator("button.results").click()
        table = page.locator("#results table")
        paper = table.locator("tr", has_text="paper-01.pdf")
        await expect(paper.locator('td[data-field="title"]')).to_have_text(
            truth["paper-01.pdf"]["title"], timeout=UI_TIMEOUT_MS
        )
        await expect(paper.locator('td[data-field="year"]')).to_have_text(
            str(truth["paper-01.pdf"]["year"])
        )
        # A click on a value shows its evidence: page, confidence, the quoted passage.
        year = paper.locator('td[data-field="year"]')
        await year.click()
        # A citation line alone is one signal: the middle band (apps/extraction/README.md).
        await expect(year.locator(".evidence")).to_contain_text("p. 1 · confidence 85% · “")
        await expect(year.locator(".evidence")).to_contain_text(str(truth["paper-01.pdf"]["year"]))
        await year.locator(".value").click()  # the value again: the panel closes
        await expect(year.locator(".evidence")).to_have_count(0)

        # Review: correct the title; the table shows the correction, who made it, the original.
        title = paper.locator('td[data-field="title"]')
        await title.click()
        await title.locator("input.correction").fill("A corrected title")
        await title.locator("button.correct").click()
        title = table.locator("tr", has_text="paper-01.pdf").locator('td[data-field="title"]')
        await expect(title).to_have_class(re.compile(r"\bcorrected\b"), timeout=UI_TIMEOUT_MS)
        await expect(title).to_contain_text("A corrected title")
        await expect(title.locator(".reviewed")).to_contain_text("corrected by reviewer-1")
        await expect(title.locator(".reviewed")).to_contain_text(truth["paper-01.pdf"]["title"])
        await expect(page.locator("#results .ledger")).to_contain_text("(corrected: 1)")
        broken = table.locator('tr[data-status="error"]')
        await expect(broken).to_contain_text("broken-truncated.pdf")
        await expect(broken.locator("td.item-error")).to_contain_text("ParseError: pdfminer")

        # Retry failed: the broken file runs again and fails again.
        await expect(broken).to_contain_text("(failed runs: 1)")
        await card.locator("button.retry").click()
        await expect(table.locator('tr[data-status="error"]')).to_contain_text(
            "(failed runs: 2)", timeout=UI_TIMEOUT_MS
        )
        await expect(card.locator(".badge")).to_have_text(
            "completed with errors", timeout=UI_TIMEOUT_MS
        )

        # Export CSV: one row per document, one column per field.
        async with page.expect_download() as download_info:
            await card.locator("button.export-csv").click()
        download = await download_info.value
        text = await asyncio.to_thread(Path(await download.path()).read_text)
        exported = list(csv.DictReader(io.StringIO(text)))
        assert sorted(r["file"] for r in exported) == sorted(f.name for f in files[:3])
        by_file = {r["file"]: r for r in exported}
        assert by_file["paper-01.pdf"]["doi"] == (truth["paper-01.pdf"]["doi"] or "")
        assert by_file["broken-truncated.pdf"]["status"] == "error"
        assert by_file["paper-01.pdf"]["title"] == "A corrected title"
        assert by_file["paper-01.pdf"]["corrected"] == "title"
        assert by_file["paper-01.pdf"]["title.original"] == truth["paper-01.pdf"]["title"]
        assert by_file["paper-01.pdf"]["title.reviewer"] == "reviewer-1"

        # Re-run one document (with step 2's template and extractor): a new task.
        await table.locator("tr", has_text="paper-06.txt").locator("button.rerun-one").click()
        await expect(page.locator("#rerun-msg")).to_contain_text("re-runs 1 document(s)")
        await expect(page.locator("section.task")).to_have_count(2, timeout=UI_TIMEOUT_MS)
        rerun = page.locator("section.task").first
        await expect(rerun).to_contain_text("re-run of")
        await expect(rerun.locator(".badge")).to_have_text("completed", timeout=UI_TIMEOUT_MS)
        await expect(table.locator("tr[data-item-id]")).to_have_count(1, timeout=UI_TIMEOUT_MS)
    finally:
        await context.close()


# With SHOAL_WRITE_SCREENSHOTS=1 the page test rewrites the picture apps/extraction/README.md shows.
WRITE_SCREENSHOTS = os.environ.get("SHOAL_WRITE_SCREENSHOTS") == "1"
IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"


async def test_clicking_a_value_shows_its_page_with_the_passage_boxed(
    browser: Any,  # noqa: F811 - the fixture imported above
    workbench: tuple[str, Bench],
    corpus_dir: Path,
    key: dict[str, Any],
    tmp_path: Path,
) -> None:
    from playwright.async_api import expect

    base, _ = workbench
    truth = {d["file"]: d["fields"] for d in key["documents"]}
    context = await browser.new_context(viewport={"width": 1400, "height": 900})
    page = await context.new_page()
    try:
        await page.goto(base + "/extraction")
        await page.fill("#token", TOKEN)
        await page.click("#auth button[type=submit]")
        await expect(page.locator("#template")).to_have_value(
            "clinical_trial", timeout=UI_TIMEOUT_MS
        )
        await page.set_input_files("#upload-input", [str(corpus_dir / "paper-01.pdf")])
        await page.click("#upload-btn")
        await expect(page.locator("#docs tbody tr")).to_have_count(1, timeout=UI_TIMEOUT_MS)
        await page.check("#pick-all")
        await page.click("#start")
        card = page.locator("section.task").first
        await expect(card.locator(".badge")).to_have_text("completed", timeout=UI_TIMEOUT_MS)
        await card.locator("button.results").click()

        # Keyboard: the value takes focus, Enter opens it and its page beside the table.
        year = page.locator('#results td[data-field="year"]')
        await expect(year).to_have_text(str(truth["paper-01.pdf"]["year"]), timeout=UI_TIMEOUT_MS)
        await year.focus()
        await page.keyboard.press("Enter")
        view = page.locator("#page-view")
        await expect(view).to_be_visible(timeout=UI_TIMEOUT_MS)
        await expect(view.locator("#page-title")).to_contain_text(
            "paper-01.pdf · p. 1 · year", timeout=UI_TIMEOUT_MS
        )
        await expect(view.locator("#page-note")).to_contain_text(
            "the quoted passage is boxed", timeout=UI_TIMEOUT_MS
        )
        image = view.locator("#page-image")
        await expect(image).to_have_js_property("complete", True, timeout=UI_TIMEOUT_MS)
        assert await image.evaluate("(img) => img.naturalWidth") > 500  # a page, decoded
        boxes = view.locator(".hl")
        # The boxes are drawn once the image has its size: wait until the
        # first lies inside the decoded page (layout follows the decode).
        await expect(boxes.first).to_be_visible(timeout=UI_TIMEOUT_MS)
        await page.wait_for_function(
            """() => {
                const img = document.getElementById("page-image");
                const hl = document.querySelector("#page-view .hl");
                if (!img || !hl || !img.complete || img.naturalWidth === 0) return false;
                const p = img.getBoundingClientRect(), b = hl.getBoundingClientRect();
                return p.width > 0 && b.left >= p.left && b.right <= p.right + 1
                    && b.top >= p.top && b.bottom <= p.bottom + 1;
            }""",
            timeout=UI_TIMEOUT_MS,
        )
        picture = await image.bounding_box()
        box = await boxes.first.bounding_box()
        assert picture is not None and box is not None
        assert (
            picture["x"] <= box["x"]
            and box["x"] + box["width"] <= picture["x"] + picture["width"] + 1
        )
        assert (
            picture["y"] <= box["y"]
            and box["y"] + box["height"] <= picture["y"] + picture["height"] + 1
        )
        assert box["width"] > 5 and box["height"] > 3  # a visible box, not a dot
        target = IMAGES if WRITE_SCREENSHOTS else tmp_path
        await page.screenshot(path=str(target / "workbench-page-view.png"))

        # Escape closes it; the button in the value's panel opens it again.
        await page.keyboard.press("Escape")
        await expect(view).to_be_hidden(timeout=UI_TIMEOUT_MS)
        await year.locator("button.show-page").click()
        await expect(view).to_be_visible(timeout=UI_TIMEOUT_MS)
        await expect(view.locator(".hl").first).to_be_visible(timeout=UI_TIMEOUT_MS)
        await view.locator("#page-close").click()
        await expect(view).to_be_hidden(timeout=UI_TIMEOUT_MS)
    finally:
        await context.close()
