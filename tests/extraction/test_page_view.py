"""A value's page for the reviewer: the page rendered, and the quote's boxes on it."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pypdfium2
import pytest
from PIL import Image

from shoal_extract.serve import build_api

from .conftest import Bench

TOKEN = "page-token"
QUOTE = "A total of 901 outpatients with essential hypertension were enrolled"


@pytest.fixture
async def client(rules_bench: Bench) -> AsyncIterator[httpx.AsyncClient]:
    api = build_api(rules_bench.boss, rules_bench.bench.batches, rules_bench.bench, token=TOKEN)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api),
        base_url="http://127.0.0.1",
        headers={"Authorization": f"Bearer {TOKEN}"},
    ) as c:
        yield c


async def stored(client: httpx.AsyncClient, path: Path) -> int:
    content = await asyncio.to_thread(path.read_bytes)
    response = await client.post(
        "/v1/extraction/documents",
        params={"filename": path.name},
        content=content,
        headers={"Content-Type": "application/octet-stream"},
    )
    assert response.status_code == 201, response.text
    return int(response.json()["document"]["id"])


def near(size: tuple[int, int], expected: tuple[float, float]) -> bool:
    """A rendered size is the page's scaled size to within the pixel PDFium rounds."""
    return all(abs(got - want) <= 1 for got, want in zip(size, expected, strict=True))


def word_box(pdf: bytes, word: str) -> tuple[float, float, float, float]:
    """PDFium's box of ``word`` on page 1 as shares of the page: x0, y0 (top), x1, y1."""
    document = pypdfium2.PdfDocument(pdf)
    page = document[0]
    width, height = page.get_size()
    text = page.get_textpage()
    found = text.search(word, match_case=True).get_next()
    assert found is not None, word
    start, count = found
    boxes = [text.get_charbox(i) for i in range(start, start + count)]
    left = min(b[0] for b in boxes)
    right = max(b[2] for b in boxes)
    top = max(b[3] for b in boxes)
    bottom = min(b[1] for b in boxes)
    document.close()
    return left / width, (height - top) / height, right / width, (height - bottom) / height


async def test_a_pdf_page_is_served_as_a_png_of_the_scaled_page_size(
    client: httpx.AsyncClient, corpus_dir: Path
) -> None:
    doc = await stored(client, corpus_dir / "paper-01.pdf")
    response = await client.get(f"/v1/extraction/documents/{doc}/pages/1.png?scale=1")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "image/png"
    assert "immutable" in response.headers["cache-control"]
    image = Image.open(io.BytesIO(response.content))
    assert near(image.size, (595.28, 841.89))  # A4 in points, one pixel per point
    again = await client.get(
        f"/v1/extraction/documents/{doc}/pages/1.png?scale=1",
        headers={"If-None-Match": response.headers["etag"]},
    )
    assert again.status_code == 304
    bigger = await client.get(f"/v1/extraction/documents/{doc}/pages/1.png?scale=2")
    assert near(Image.open(io.BytesIO(bigger.content)).size, (1190.56, 1683.78))


async def test_a_missing_page_or_document_is_404_and_a_text_document_422(
    client: httpx.AsyncClient, corpus_dir: Path
) -> None:
    doc = await stored(client, corpus_dir / "paper-01.pdf")
    text = await stored(client, corpus_dir / "paper-06.txt")
    missing_page = await client.get(f"/v1/extraction/documents/{doc}/pages/2.png")
    assert missing_page.status_code == 404
    assert missing_page.json()["field"] == "page"
    assert "pages 1-1" in missing_page.json()["message"]
    missing_doc = await client.get(f"/v1/extraction/documents/{doc + 100}/pages/1.png")
    assert missing_doc.status_code == 404
    assert missing_doc.json()["field"] == "document_id"
    not_pdf = await client.get(f"/v1/extraction/documents/{text}/pages/1.png")
    assert not_pdf.status_code == 422
    assert not_pdf.json()["field"] == "document_id"
    assert "not a PDF" in not_pdf.json()["message"]
    too_big = await client.get(f"/v1/extraction/documents/{doc}/pages/1.png?scale=50")
    assert too_big.status_code == 422
    assert too_big.json()["field"] == "scale"


async def test_the_highlight_boxes_land_on_the_quoted_words(
    client: httpx.AsyncClient, corpus_dir: Path
) -> None:
    pdf = corpus_dir / "paper-01.pdf"
    doc = await stored(client, pdf)
    content = await asyncio.to_thread(pdf.read_bytes)
    # The quote as evidence stores it: case and line breaks need not match the page.
    response = await client.get(
        f"/v1/extraction/documents/{doc}/pages/1/highlight",
        params={"quote": QUOTE.lower().replace(" ", "\n  ")},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["found"] is True
    assert body["page"] == 1
    assert len(body["boxes"]) == 1  # the passage is on one line of the page
    (box,) = body["boxes"]
    for word in ("A total", "901 outpatients", "were enrolled"):
        x0, y0, x1, y1 = word_box(content, word)
        assert box["x"] - 1e-3 <= x0 and x1 <= box["x"] + box["width"] + 1e-3, word
        middle = (y0 + y1) / 2
        assert box["y"] <= middle <= box["y"] + box["height"], word
    # Nothing else on the page: the box starts at "A total", not at the line's start.
    methods = word_box(content, "Methods:")
    assert box["x"] > methods[2]


async def test_a_quote_not_on_the_page_gives_no_boxes(
    client: httpx.AsyncClient, corpus_dir: Path
) -> None:
    doc = await stored(client, corpus_dir / "paper-01.pdf")
    response = await client.get(
        f"/v1/extraction/documents/{doc}/pages/1/highlight",
        params={"quote": "a sentence this paper never says"},
    )
    assert response.status_code == 200, response.text
    assert response.json()["found"] is False
    assert response.json()["boxes"] == []
    empty = await client.get(
        f"/v1/extraction/documents/{doc}/pages/1/highlight", params={"quote": ""}
    )
    assert empty.status_code == 422
    assert empty.json()["field"] == "quote"


def rotated(pdf: bytes) -> bytes:
    """The PDF with its first page turned a quarter clockwise (its /Rotate set to 90)."""
    document = pypdfium2.PdfDocument(pdf)
    document[0].set_rotation(90)
    out = io.BytesIO()
    document.save(out)
    document.close()
    return out.getvalue()


async def test_the_boxes_follow_a_rotated_page_as_it_is_rendered(
    client: httpx.AsyncClient, corpus_dir: Path, tmp_path: Path
) -> None:
    upright_pdf = await asyncio.to_thread((corpus_dir / "paper-01.pdf").read_bytes)
    turned_pdf = tmp_path / "turned.pdf"
    await asyncio.to_thread(turned_pdf.write_bytes, rotated(upright_pdf))
    upright = await stored(client, corpus_dir / "paper-01.pdf")
    turned = await stored(client, turned_pdf)
    boxes = {}
    for doc in (upright, turned):
        response = await client.get(
            f"/v1/extraction/documents/{doc}/pages/1/highlight", params={"quote": QUOTE}
        )
        assert response.status_code == 200, response.text
        (boxes[doc],) = response.json()["boxes"]
    image = await client.get(f"/v1/extraction/documents/{turned}/pages/1.png?scale=1")
    assert near(Image.open(io.BytesIO(image.content)).size, (841.89, 595.28))  # landscape
    # A quarter turn clockwise: the line's left end goes to the top, its top to the right.
    a, b = boxes[upright], boxes[turned]
    assert b["height"] > 5 * b["width"]  # the line now runs down the page
    assert abs(b["y"] - a["x"]) < 1e-3 and abs(b["height"] - a["width"]) < 1e-3
    assert abs(b["x"] + b["width"] - (1 - a["y"])) < 1e-3
