"""Evidence: every value's page and quote, checked against the source text; flagged when absent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shoal_extract.evidence import FLAG, UNVERIFIED_CONFIDENCE, check_evidence
from shoal_extract.extractors.base import CallContext, Extraction
from shoal_extract.extractors.llm import LlmExtractor, LlmSettings
from shoal_extract.extractors.rules import extract_fields
from shoal_extract.parsing import DocumentFormat, join_pages, parse_document
from shoal_extract.templates import CLINICAL_TRIAL, StoredTemplate
from shoal_extract.worker import result_of

from .fake_llm import FakeModel, Script, serve_fake

PAGES = [
    "# A trial\n\nWe randomly assigned 416 adults\nwith a low-\nsodium diet.",
    "## Results\n\nThe primary outcome was    blood pressure at 12 weeks.",
]


def test_a_quote_is_found_across_line_breaks_and_gives_its_page() -> None:
    doc = join_pages(PAGES, DocumentFormat.PDF)
    evidence = check_evidence(
        doc,
        {"sample_size": 416, "diet": "low-sodium diet", "outcome": "blood pressure at 12 weeks"},
        {
            "sample_size": "randomly assigned 416 adults with a",
            "diet": "a Low-sodium diet.",
            "outcome": "The primary outcome was blood pressure",
        },
        {"sample_size": 0.9},
    )
    assert {k: (e.page, e.verified) for k, e in evidence.items()} == {
        "sample_size": (1, True),
        "diet": (1, True),
        "outcome": (2, True),
    }
    assert evidence["sample_size"].confidence == 0.9


def test_a_quote_not_in_the_source_is_flagged_never_silently_kept() -> None:
    doc = join_pages(PAGES, DocumentFormat.PDF)
    evidence = check_evidence(
        doc,
        {"sample_size": 500, "title": "A trial", "year": 2031, "none": None},
        {"sample_size": "we randomly assigned 500 adults"},
        {"sample_size": 0.9},
    )
    assert "none" not in evidence, "no value, no evidence"
    invented = evidence["sample_size"]
    assert not invented.verified and invented.page is None
    assert invented.quote == "we randomly assigned 500 adults"
    assert invented.confidence == UNVERIFIED_CONFIDENCE
    # No quote: the value itself is looked for.
    assert evidence["title"].verified and evidence["title"].page == 1
    assert not evidence["year"].verified and evidence["year"].quote is None
    # The result keeps the value for review, lists it as flagged, and says why.
    stored = StoredTemplate(1, 1, CLINICAL_TRIAL)
    values = dict.fromkeys(CLINICAL_TRIAL.field_names) | {"sample_size": 500, "title": "A trial"}
    result = result_of(Extraction(values=values), stored, "llm", pages=2, evidence=evidence)
    assert result["fields"]["sample_size"] == 500
    assert result["flagged"] == ["sample_size", "year"]
    assert result["field_errors"]["sample_size"] == f"{FLAG} (flagged)"
    assert result["evidence"]["title"] == {
        "page": 1,
        "quote": "A trial",
        "confidence": 0.6,
        "verified": True,
        "source": "llm",  # the extractor the value came from
    }


def test_rules_evidence_is_verified_with_its_page_on_every_corpus_paper(
    corpus_dir: Path, hard_dir: Path, hard_key: dict[str, Any]
) -> None:
    checked = 0
    for folder in (corpus_dir, hard_dir):
        key = json.loads((folder / "key.json").read_text())
        for entry in key["documents"]:
            if entry["expected"] != "completed" or entry.get("layout") == "scan":
                continue  # scans: OCR runs in test_parsing; its text is the same path
            fmt = DocumentFormat(entry["file"].rsplit(".", 1)[1])
            parsed = parse_document((folder / entry["file"]).read_bytes(), fmt)
            found = extract_fields(parsed, CLINICAL_TRIAL)
            evidence = check_evidence(parsed, found.values, found.quotes, found.confidence)
            assert set(evidence) == {k for k, v in found.values.items() if v is not None}
            assert all(e.verified and e.page and e.quote for e in evidence.values()), entry["file"]
            if "sample_size_page" in entry:
                assert evidence["sample_size"].page == entry["sample_size_page"]
            checked += 1
    assert checked > 40


async def test_the_llm_extractors_quotes_are_checked(
    hard_dir: Path, hard_key: dict[str, Any]
) -> None:
    entry = next(d for d in hard_key["documents"] if d["layout"] == "two_column")
    parsed = parse_document((hard_dir / entry["file"]).read_bytes(), DocumentFormat.PDF)
    with serve_fake(FakeModel(hard_key, Script(invent_quotes={entry["file"]}))) as url:
        extractor = LlmExtractor(LlmSettings(base_url=url, model="fake"))
        try:
            found = await extractor.extract(parsed, CLINICAL_TRIAL, context=CallContext())
        finally:
            await extractor.close()
    evidence = check_evidence(parsed, found.values, found.quotes, found.confidence)
    # The fake invents the quote of the sample size; every other quote is the paper's.
    assert not evidence["sample_size"].verified
    assert all(e.verified for name, e in evidence.items() if name != "sample_size")
