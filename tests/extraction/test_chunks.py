"""Long papers: chunks by page and section, BM25's choice per field, the llm extractor's budget."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shoal_extract.chunking import (
    CHUNK_CHARS,
    Chunk,
    ChunkIndex,
    chunk_document,
    front_matter,
    select,
)
from shoal_extract.extractors.base import CallContext, CallRecord
from shoal_extract.extractors.llm import LlmExtractor, LlmSettings
from shoal_extract.parsing import DocumentFormat, ParsedText, parse_document
from shoal_extract.templates import CLINICAL_TRIAL

from .fake_llm import FakeModel, Script, serve_fake


@pytest.fixture(scope="module")
def long_paper(hard_dir: Path, hard_key: dict[str, Any]) -> tuple[dict[str, Any], ParsedText]:
    entry = next(d for d in hard_key["documents"] if d["layout"] == "long")
    return entry, parse_document((hard_dir / entry["file"]).read_bytes(), DocumentFormat.PDF)


def test_chunks_keep_to_one_page_and_start_at_headings(
    long_paper: tuple[dict[str, Any], ParsedText],
) -> None:
    entry, parsed = long_paper
    chunks = chunk_document(parsed)
    assert {c.page for c in chunks} == set(range(1, parsed.pages + 1)), "every page is read"
    for chunk in chunks:
        assert parsed.text[chunk.start : chunk.start + len(chunk.text)] == chunk.text
        assert parsed.page_at(chunk.start) == chunk.page
        assert parsed.page_at(chunk.start + len(chunk.text) - 1) == chunk.page
        assert len(chunk.text) <= CHUNK_CHARS
    # Nothing but page furniture (the running header, page numbers) is dropped: every
    # other word of the text is in a chunk, and no chunk holds furniture.
    assert parsed.furniture, "the long paper's running lines are found"
    body = list(parsed.text)
    for start, end in parsed.furniture:
        body[start:end] = " " * (end - start)
    assert sum(len(c.text.split()) for c in chunks) == len("".join(body).split())
    participants = next(c for c in chunks if c.section == "3 Participants")
    assert participants.text.startswith("## 3 Participants")
    assert participants.page == entry["sample_size_page"]


def test_bm25_finds_the_sample_size_past_page_40(
    long_paper: tuple[dict[str, Any], ParsedText],
) -> None:
    entry, parsed = long_paper
    chunks = chunk_document(parsed)
    sample_size = next(f for f in CLINICAL_TRIAL.fields if f.name == "sample_size")
    best = ChunkIndex(chunks).ranked(sample_size)[:3]
    assert any(
        c.section == "3 Participants" and str(entry["fields"]["sample_size"]) in c.text
        for c in best
    ), [(c.page, c.section) for c in best]


def test_select_fills_the_budget_round_robin_over_fields() -> None:
    def chunk(i: int, chars: int = 380) -> Chunk:
        return Chunk(i, i + 1, None, i * 1000, "x" * chars)

    c = [chunk(i) for i in range(8)]
    ranked = {"a": [c[3], c[4], c[5]], "b": [c[6], c[3], c[7]]}
    per = c[0].tokens
    # Room for the front matter and two more: each field's best, not a's second.
    chosen = select(ranked, per * 3, always=[c[0]])
    assert [x.index for x in chosen] == [0, 3, 6]
    # Chunks shown before are skipped: the next call gets each field's next best.
    chosen = select(ranked, per * 3, always=[c[0]], exclude=frozenset({3, 6}))
    assert [x.index for x in chosen] == [0, 4, 7]
    assert select(ranked, per - 1, always=[c[0]]) == [], "nothing fits: nothing chosen"
    assert front_matter(c, tokens=per * 2) == c[:2]


async def test_llm_reads_a_long_paper_within_its_budget_and_fills_a_late_field(
    long_paper: tuple[dict[str, Any], ParsedText], hard_key: dict[str, Any]
) -> None:
    entry, parsed = long_paper
    budget = 1000
    records: list[CallRecord] = []

    async def record(entry: CallRecord) -> None:
        records.append(entry)

    with serve_fake(FakeModel(hard_key, Script())) as url:
        extractor = LlmExtractor(
            LlmSettings(base_url=url, model="fake", max_prompt_tokens=budget, max_calls=3)
        )
        try:
            extraction = await extractor.extract(
                parsed, CLINICAL_TRIAL, context=CallContext(record=record)
            )
        finally:
            await extractor.close()
    # The fake answers only what the chunks it was shown state.
    assert extraction.values["sample_size"] == entry["fields"]["sample_size"]
    assert extraction.quotes["sample_size"] == str(entry["fields"]["sample_size"])
    assert len(records) >= 2, "a second call, over chunks not shown before"
    assert all(r.outcome == "answered" and r.usage.prompt_tokens <= budget for r in records)
    chunks = chunk_document(parsed)
    shown_pages = {chunks[i].page for i in extraction.chunks_shown}
    assert entry["sample_size_page"] in shown_pages
    assert len(extraction.chunks_shown) < len(chunks) / 4, "a few chunks, not the paper"


async def test_the_llm_plumbing_gets_every_field_on_the_hard_layouts(
    hard_dir: Path, hard_key: dict[str, Any]
) -> None:
    """The fake answers what it is shown: a miss would be a chunk not chosen."""
    from shoal_extract.evaluate import ResultRow, load_key, score

    rows = []
    with serve_fake(FakeModel(hard_key, Script())) as url:
        extractor = LlmExtractor(LlmSettings(base_url=url, model="fake"))
        try:
            for entry in hard_key["documents"]:
                if entry["layout"] == "scan":
                    continue  # OCR's misreads would be the fake's, not the plumbing's
                parsed = parse_document((hard_dir / entry["file"]).read_bytes(), DocumentFormat.PDF)
                found = await extractor.extract(parsed, CLINICAL_TRIAL, context=CallContext())
                rows.append(ResultRow(entry["sha256"], entry["file"], "completed", found.values))
        finally:
            await extractor.close()
    report = score(rows, load_key(hard_dir / "key.json"), CLINICAL_TRIAL.field_names)
    assert report.misses == (), report.misses
