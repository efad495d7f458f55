"""Each parser path on files the corpus generators write: text layer, two columns, tables, scans."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pdfplumber
import pytest

from shoal_extract.parsing import DocumentFormat, ParseError, ParseLimits, parse_document
from shoal_extract.pdf_layout import page_words
from shoal_extract.pdf_words import page_words_from_chars


def _paper(key: dict[str, Any], layout: str) -> dict[str, Any]:
    return next(d for d in key["documents"] if d.get("layout") == layout)


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_a_text_layer_keeps_its_title_and_headings(corpus_dir: Path, key: dict[str, Any]) -> None:
    truth = next(d for d in key["documents"] if d["file"] == "paper-01.pdf")["fields"]
    parsed = parse_document((corpus_dir / "paper-01.pdf").read_bytes(), DocumentFormat.PDF)
    assert parsed.pages == 1 and parsed.ocr_pages == ()
    assert parsed.title_hint == truth["title"]
    lines = parsed.text.splitlines()
    assert f"# {truth['title']}" in lines, "the title, across its two lines, is one heading"
    assert {"## Abstract", "## 1 Introduction", "## 2 Methods", "## References"} <= set(lines)
    # Blocks are paragraphs: the title's block and the authors' are apart.
    assert "\n\n" in parsed.text


def test_pages_without_graphics_give_the_words_pdfplumber_chars_give(
    corpus_dir: Path, hard_dir: Path
) -> None:
    """The short path for text-only pages changes the cost of parsing, never the words."""
    fast = slow = 0
    for path in sorted([*corpus_dir.glob("paper-*.pdf"), *hard_dir.glob("*.pdf")]):
        with pdfplumber.open(path) as pdf:
            for page in pdf.pages:
                words = page_words_from_chars(page.chars)
                found = page_words(page)
                if found.tables or page.lines or page.rects or page.curves:
                    slow += 1
                    continue
                fast += 1
                assert found.words == words, f"{path.name} page {page.page_number}"
                assert found.chars == sum(1 for c in page.chars if not c["text"].isspace())
    assert fast > 20 and slow > 0, "both paths were taken"


def test_two_columns_read_left_then_right(hard_dir: Path, hard_key: dict[str, Any]) -> None:
    entry = _paper(hard_key, "two_column")
    truth = entry["fields"]
    parsed = parse_document((hard_dir / entry["file"]).read_bytes(), DocumentFormat.PDF)
    flat = _flat(parsed.text)
    # Sentences that wrap over several lines of one column come out whole: plain
    # extraction would interleave them with the other column's lines.
    assert f"Conclusions: {truth['conclusion']}" in flat or truth["conclusion"] in flat
    assert "The primary" in flat and truth["primary_outcome"] in flat
    order = [flat.index(h) for h in ("## Abstract", "## 1 Introduction", "## 2 Methods")]
    assert order == sorted(order), "sections in reading order"
    # The full-width front matter stays on top.
    assert flat.index(truth["title"]) < flat.index("## Abstract")


def test_a_ruled_table_becomes_a_markdown_table(hard_dir: Path, hard_key: dict[str, Any]) -> None:
    entry = _paper(hard_key, "table_only")
    n = entry["fields"]["sample_size"]
    parsed = parse_document((hard_dir / entry["file"]).read_bytes(), DocumentFormat.PDF)
    assert "| Stage | Participants |\n| --- | --- |" in parsed.text
    assert f"| Randomized | {n} |" in parsed.text
    # The table's words are not repeated as loose text.
    assert len(re.findall(rf"\b{n}\b", parsed.text)) == 1


def test_a_long_paper_is_read_in_full_and_knows_its_pages(
    hard_dir: Path, hard_key: dict[str, Any]
) -> None:
    entry = _paper(hard_key, "long")
    content = (hard_dir / entry["file"]).read_bytes()
    parsed = parse_document(content, DocumentFormat.PDF)
    assert parsed.pages > 40
    at = parsed.text.index(f"we randomly assigned {entry['fields']['sample_size']} ")
    assert parsed.page_at(at) == entry["sample_size_page"] >= 40
    assert parsed.page_text(parsed.page_at(at)).startswith("## 3 Participants")
    # Over the operator's limit: a clear refusal, never a silent cut.
    with pytest.raises(ParseError, match=r"has \d+ pages, over the limit of 10"):
        parse_document(content, DocumentFormat.PDF, ParseLimits(max_pages=10))


def test_a_scanned_page_is_ocred(hard_dir: Path, hard_key: dict[str, Any], tesseract: str) -> None:
    entry = _paper(hard_key, "scan")
    truth = entry["fields"]
    parsed = parse_document((hard_dir / entry["file"]).read_bytes(), DocumentFormat.PDF)
    assert parsed.ocr_pages == (1,)
    words = set(re.findall(r"\w+", parsed.text.casefold()))
    wanted = re.findall(r"\w+", f"{truth['title']} {truth['conclusion']}".casefold())
    # OCR misreads a glyph now and then (HbA1c as HbAtc): most words, not all.
    assert sum(w in words for w in wanted) >= 0.9 * len(wanted)
    assert str(truth["year"]) in words


def test_only_pages_without_a_text_layer_are_ocred(corpus_dir: Path) -> None:
    # A page with a text layer never reaches Tesseract: with no Tesseract at
    # all, text-layer PDFs still parse.
    parsed = parse_document((corpus_dir / "paper-02.pdf").read_bytes(), DocumentFormat.PDF)
    assert parsed.ocr_pages == ()


def test_scans_read_in_threads_at_once_read_as_one_at_a_time(
    hard_dir: Path, hard_key: dict[str, Any], tesseract: str
) -> None:
    # The worker parses in threads: each thread OCRs on a Tesseract engine of
    # its own, taken from and given back to the process's idle ones.
    content = (hard_dir / _paper(hard_key, "scan")["file"]).read_bytes()
    alone = parse_document(content, DocumentFormat.PDF).text
    with ThreadPoolExecutor(max_workers=3) as pool:
        texts = list(pool.map(lambda _: parse_document(content, DocumentFormat.PDF).text, range(3)))
    assert texts == [alone] * 3


def test_without_tesseracts_english_data_a_scan_fails_naming_the_package(
    hard_dir: Path, hard_key: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Tesseract's own setting names a folder without the model: as on a
    # machine without Debian's tesseract-ocr-eng.
    monkeypatch.setenv("TESSDATA_PREFIX", str(tmp_path))
    content = (hard_dir / _paper(hard_key, "scan")["file"]).read_bytes()
    with pytest.raises(ParseError, match="page 1 has no text layer and needs OCR") as caught:
        parse_document(content, DocumentFormat.PDF)
    assert f"eng.traineddata) is not in TESSDATA_PREFIX={tmp_path}" in str(caught.value)
    assert "apt-get install tesseract-ocr-eng" in str(caught.value)
    with pytest.raises(ParseError, match="need OCR, over the limit of 0"):
        parse_document(content, DocumentFormat.PDF, ParseLimits(max_ocr_pages=0))
