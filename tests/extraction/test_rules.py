"""The offline pieces: the corpus generator, the parser, the rules extractor, templates."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from shoal import InvalidInput
from shoal_extract.corpus import write_corpus
from shoal_extract.evaluate import ResultRow, score
from shoal_extract.extractors.llm import check_answer
from shoal_extract.extractors.rules import extract_fields
from shoal_extract.ocr import OcrUnavailable, tessdata_dir
from shoal_extract.parsing import EXTENSIONS, DocumentFormat, ParseError, parse_document
from shoal_extract.templates import CLINICAL_TRIAL, METADATA, SHIPPED_TEMPLATES, parse_template


def extract_all(corpus_dir: Path) -> list[ResultRow]:
    rows = []
    for path in sorted(corpus_dir.iterdir()):
        if path.suffix not in EXTENSIONS:
            continue
        content = path.read_bytes()
        sha = hashlib.sha256(content).hexdigest()
        try:
            parsed = parse_document(content, EXTENSIONS[path.suffix])
        except ParseError:
            rows.append(ResultRow(sha, path.name, "error", None))
            continue
        rows.append(
            ResultRow(sha, path.name, "completed", extract_fields(parsed, CLINICAL_TRIAL).values)
        )
    return rows


def test_rules_get_title_year_journal_and_doi_right_on_every_sample_paper(
    corpus_dir: Path, key: dict[str, Any]
) -> None:
    from shoal_extract.evaluate import load_key

    report = score(
        extract_all(corpus_dir), load_key(corpus_dir / "key.json"), CLINICAL_TRIAL.field_names
    )
    by_field = {f.name: f for f in report.fields}
    papers = sum(1 for d in key["documents"] if d["fields"])
    assert papers >= 36, "a few dozen papers"
    for name in ("title", "year", "journal", "doi"):
        assert (by_field[name].correct, by_field[name].total) == (papers, papers), [
            m for m in report.misses if m.field == name
        ]
    # Every document ends as the key says: broken files are errors, the rest extracted.
    assert report.status_right == report.documents == len(key["documents"])


def test_rules_say_not_found_rather_than_guess(corpus_dir: Path, key: dict[str, Any]) -> None:
    from shoal_extract.evaluate import load_key

    report = score(
        extract_all(corpus_dir), load_key(corpus_dir / "key.json"), CLINICAL_TRIAL.field_names
    )
    assert report.misses, "the corpus has phrasings the rules do not read"
    # Every miss is a "not found", never a wrong value.
    assert all(m.got is None for m in report.misses), [
        m for m in report.misses if m.got is not None
    ]
    # Papers without a DOI or a stated sample size: the rules answer None, which is right.
    no_doi = [d for d in key["documents"] if d["fields"] and d["fields"]["doi"] is None]
    no_n = [d for d in key["documents"] if d["fields"] and d["fields"]["sample_size"] is None]
    assert no_doi and no_n
    results = {r.file: r for r in extract_all(corpus_dir)}
    assert all((results[d["file"]].values or {})["doi"] is None for d in no_doi)
    assert all((results[d["file"]].values or {})["sample_size"] is None for d in no_n)


def test_broken_files_fail_with_the_parsers_message(corpus_dir: Path) -> None:
    messages = {}
    for name in ("broken-truncated.pdf", "broken-not-a-pdf.pdf", "broken-scan-no-text.pdf"):
        with pytest.raises(ParseError) as caught:
            parse_document((corpus_dir / name).read_bytes(), DocumentFormat.PDF)
        messages[name] = str(caught.value)
    assert "pdfminer" in messages["broken-truncated.pdf"]
    assert "invalid pdf header" in messages["broken-not-a-pdf.pdf"]
    try:
        tessdata_dir()
    except OcrUnavailable:  # the error names what to install
        assert "tesseract-ocr-eng" in messages["broken-scan-no-text.pdf"]
    else:  # OCR ran on the page without a text layer and found nothing to read
        assert "no text layer, and OCR found no text" in messages["broken-scan-no-text.pdf"]
    with pytest.raises(ParseError, match="not UTF-8"):
        parse_document(b"\xff\xfe\x00broken", DocumentFormat.TEXT)


def test_garbage_never_escapes_the_parser_as_anything_but_parse_error() -> None:
    for junk in (
        b"%PDF-1.7\n" + bytes(range(256)) * 8,
        b"%PDF-",
        b"\x00" * 100,
        b"%PDF-1.4\n%%EOF",
    ):
        with pytest.raises(ParseError):
            parse_document(junk, DocumentFormat.PDF)


def test_the_corpus_is_the_same_for_the_same_seed(tmp_path: Path, key: dict[str, Any]) -> None:
    write_corpus(tmp_path / "again")
    again = {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (tmp_path / "again").iterdir()
    }
    assert {d["file"]: d["sha256"] for d in key["documents"]}.items() <= again.items()


def test_shipped_templates_round_trip_and_bad_ones_name_the_field() -> None:
    for template in SHIPPED_TEMPLATES:
        assert parse_template(template.as_dict()) == template
    assert CLINICAL_TRIAL.field_names == (
        "title", "authors", "year", "journal", "doi", "sample_size",
        "intervention", "comparator", "primary_outcome", "conclusion",
    )  # fmt: skip
    assert set(METADATA.field_names) == {"title", "authors", "year", "journal", "doi"}

    def one(**field: object) -> dict[str, object]:
        return {
            "name": "t",
            "fields": [{"name": "a", "type": "string", "description": "x", **field}],
        }

    bad = [
        ({**one(), "name": "Bad Name"}, "template.name"),
        ({"name": "t", "fields": []}, "template.fields"),
        (one(type="date"), "template.fields[0].type"),
        (one(description=""), "template.fields[0].description"),
        (one(required="yes"), "template.fields[0].required"),
        ({"name": "t", "fields": one()["fields"] * 2}, "template.fields[1].name"),  # type: ignore[operator]
    ]
    for raw, field in bad:
        with pytest.raises(InvalidInput) as caught:
            parse_template(raw)
        assert caught.value.field == field


def test_a_model_answer_is_checked_against_the_template() -> None:
    good = {name: None for name in METADATA.field_names} | {"title": "T", "year": 2020}
    import json

    assert check_answer(json.dumps(good), METADATA)[0] == good
    assert check_answer("```json\n" + json.dumps(good) + "\n```", METADATA)[0] == good
    assert check_answer("{title: 1}", METADATA)[1][0].startswith("not JSON")
    _, problems = check_answer(json.dumps(good | {"year": "2020", "extra": 1}), METADATA)
    assert any("year" in p for p in problems) and any("unknown keys" in p for p in problems)
    _, problems = check_answer(json.dumps({"title": "T"}), METADATA)
    assert any("missing keys" in p for p in problems)
    _, problems = check_answer(json.dumps(good | {"doi": "https://doi.org/10.1/x"}), METADATA)
    assert any(p.startswith("doi") for p in problems)
