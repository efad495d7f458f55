"""The rules first, the model for what they leave empty (``rules+llm``), on a fake endpoint.

What reaches the endpoint is captured: the chunks it is shown hold no page
furniture, and it is asked only the fields the rules left empty. Its values
are labelled ``llm`` and go through the evidence check (an invented quote is
flagged); an endpoint that fails leaves those fields empty with the error
recorded and the document completed; with no endpoint the mode is the rules,
and says so. Nothing reaches beyond 127.0.0.1.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from fpdf import FPDF

from shoal import Shoal
from shoal_extract.evidence import FLAG, UNVERIFIED_CONFIDENCE
from shoal_extract.extractors.base import CallContext, Extraction
from shoal_extract.extractors.fill import NOT_CONFIGURED, RulesThenLlm
from shoal_extract.extractors.llm import LlmExtractor, LlmSettings
from shoal_extract.extractors.rules import RulesExtractor, extract_fields
from shoal_extract.parsing import DocumentFormat, ParsedText, parse_document
from shoal_extract.templates import CLINICAL_TRIAL, Template
from shoal_extract.workbench import ResultLine, Upload

from .conftest import FAST, Bench, open_bench
from .fake_llm import FakeModel, Script, serve_fake
from .test_llm import llm_settings, run_until_closed

# Papers of the sample corpus (seed 2026) by what the rules leave empty: the sample
# size of the first two (a screening count stands beside the number randomised) and
# the conclusion of the first (a Lancet-style "Interpretation"); the DOI of a paper
# that prints none; nothing at all.
BOTH_MISSING, SAMPLE_MISSING, NO_DOI, ALL_FOUND = (
    "paper-29.pdf",
    "paper-15.pdf",
    "paper-01.pdf",
    "paper-02.pdf",
)


def _truth(key: dict[str, Any], file: str) -> dict[str, Any]:
    return next(d["fields"] for d in key["documents"] if d["file"] == file)


def _rules(corpus_dir: Path, file: str) -> Extraction:
    fmt = DocumentFormat(file.rsplit(".", 1)[1])
    return extract_fields(parse_document((corpus_dir / file).read_bytes(), fmt), CLINICAL_TRIAL)


def _empty(extraction: Extraction) -> tuple[str, ...]:
    return tuple(name for name, value in extraction.values.items() if value is None)


async def _start(bench: Bench, corpus_dir: Path, files: list[str], extractor: str) -> str:
    stored = await bench.bench.upload([Upload(f, (corpus_dir / f).read_bytes()) for f in files])
    created = await bench.bench.start([d.id for d in stored], "clinical_trial", extractor=extractor)
    await run_until_closed(bench, created.task_id)
    return created.task_id


async def _lines(bench: Bench, task_id: str) -> dict[str, ResultLine]:
    return {line.file: line for line in (await bench.bench.all_results(task_id)).lines}


# -- what the endpoint is shown --------------------------------------------------------

BODY = [
    "We randomly assigned 240 adults with mild asthma to a daily",
    "breathing programme or to usual care, and measured lung function.",
    "The primary outcome was the forced expiratory volume at 12 weeks.",
]
HEADER = "JOURNAL OF RESPIRATORY HABITS  Vol 9, 2025"
STAMP = "Downloaded from https://stamps.example.org by a reader"
TITLE = "A Breathing Programme for Adults with Mild Asthma"


def _paper_with_furniture() -> ParsedText:
    pdf = FPDF(unit="pt", format="A4")
    pdf.set_auto_page_break(False)
    for page in range(1, 4):
        pdf.add_page()
        pdf.set_font("Helvetica", size=8)
        pdf.text(60, 40, HEADER)
        pdf.text(270, 810, f"Page {page} of 3")
        with pdf.rotation(90, 20, 600):
            pdf.text(20, 600, STAMP)
        pdf.set_font("Helvetica", size=16 if page == 1 else 10)
        pdf.text(60, 120, TITLE if page == 1 else f"Section {page}")
        pdf.set_font("Helvetica", size=10)
        for i, line in enumerate(BODY):
            pdf.text(60, 160 + 14 * i, line)
    return parse_document(bytes(pdf.output()), DocumentFormat.PDF)


async def test_no_page_furniture_reaches_the_endpoint() -> None:
    parsed = _paper_with_furniture()
    furniture = " ".join(parsed.text[a:b] for a, b in parsed.furniture)
    # The parse found all three kinds: a running header, page numbers, a rotated stamp.
    assert "RESPIRATORY HABITS" in furniture and "Page 2 of 3" in furniture
    assert "stamps.example.org" in furniture
    key = {"documents": [{"file": "asthma.pdf", "fields": {"title": TITLE, "sample_size": 240}}]}
    fake = FakeModel(key, Script())
    with serve_fake(fake) as url:
        extractor = LlmExtractor(LlmSettings(base_url=url, model="fake"))
        try:
            found = await extractor.extract(parsed, CLINICAL_TRIAL, context=CallContext())
        finally:
            await extractor.close()
    sent = fake.sent()
    assert sent and all(s.file == "asthma.pdf" for s in sent), "the paper's text was shown"
    for request in sent:
        flat = " ".join(request.user.split())
        assert "We randomly assigned 240 adults" in flat
        for line in (HEADER, STAMP, "Page 1 of 3", "Page 2 of 3", "Page 3 of 3"):
            assert " ".join(line.split()) not in flat, line
    assert found.values["sample_size"] == 240


# -- the model fills what the rules leave empty -----------------------------------------


class _AnswersEverything:
    """A model that gives a value for every field of the template, asked or not."""

    name = "llm"

    def __init__(self) -> None:
        self.asked: list[tuple[str, ...]] = []

    async def extract(
        self, document: ParsedText, template: Template, *, context: CallContext
    ) -> Extraction:
        self.asked.append(template.field_names)
        values = {f.name: 7 if f.type.value == "integer" else "x" for f in CLINICAL_TRIAL.fields}
        return Extraction(values=values, model="stub")


async def test_the_model_is_asked_only_what_the_rules_left_empty_and_overwrites_nothing(
    corpus_dir: Path,
) -> None:
    parsed = parse_document((corpus_dir / BOTH_MISSING).read_bytes(), DocumentFormat.PDF)
    rules = extract_fields(parsed, CLINICAL_TRIAL)
    model = _AnswersEverything()
    found = await RulesThenLlm(RulesExtractor(), model).extract(
        parsed, CLINICAL_TRIAL, context=CallContext()
    )
    assert model.asked == [_empty(rules)] and "sample_size" in _empty(rules)
    for name, value in rules.values.items():
        if value is not None:
            assert found.values[name] == value and found.sources[name] == "rules", name
            assert found.quotes[name] == rules.quotes[name]
        else:
            assert found.values[name] is not None and found.sources[name] == "llm", name
    assert found.fill is not None and found.fill.status == "answered"
    assert found.fill.asked == found.fill.filled == _empty(rules)


async def test_rules_llm_fills_the_empty_fields_from_the_endpoint_with_checked_evidence(
    boss: Shoal, corpus_dir: Path, key: dict[str, Any]
) -> None:
    files = [BOTH_MISSING, SAMPLE_MISSING, NO_DOI, ALL_FOUND, "paper-06.txt"]
    rules = {f: _rules(corpus_dir, f) for f in files}
    fake = FakeModel(key, Script())
    with serve_fake(fake) as url:
        bench = await open_bench(boss, replace(FAST, llm=llm_settings(url)))
        try:
            task_id = await _start(bench, corpus_dir, files, "rules+llm")
            calls = len(fake.snapshot())
            # The same documents again: each answer is reused, no call is made.
            ids = [line.document_id or 0 for line in (await _lines(bench, task_id)).values()]
            again, _ = await bench.bench.rerun(task_id, ids)
            await run_until_closed(bench, again.task_id)
        finally:
            await bench.extraction.close()
    assert len(fake.snapshot()) == calls
    reused = await _lines(bench, again.task_id)
    lines = await _lines(bench, task_id)
    asked: dict[str, tuple[str, ...]] = {}
    for sent in fake.sent():
        assert sent.file is not None
        # Only the fields the rules left empty reach the endpoint, in any call.
        assert set(sent.fields) <= set(_empty(rules[sent.file])), sent
        asked.setdefault(sent.file, sent.fields)
    for file in files:
        line, found = lines[file], rules[file]
        assert line.status == "completed" and line.extractor == "rules+llm", file
        # The first call asks every field the rules left empty.
        assert asked.get(file, ()) == _empty(found), file
        assert reused[file].fields == line.fields and reused[file].evidence == line.evidence
        assert reused[file].usage.calls == 0
        for name, value in found.values.items():
            if value is not None:
                assert line.fields[name] == value, (file, name)
                assert line.evidence[name]["source"] == "rules", (file, name)
    truth = _truth(key, BOTH_MISSING)
    both = lines[BOTH_MISSING]
    for name in ("sample_size", "conclusion"):
        assert both.fields[name] == truth[name], name
        assert both.evidence[name]["source"] == "llm"
        assert both.evidence[name]["verified"] and both.evidence[name]["page"] == 1
        assert name not in both.field_errors
    assert both.llm_fill is not None and both.llm_fill["status"] == "answered"
    assert set(both.llm_fill["filled"]) == {"sample_size", "conclusion"}
    assert both.usage.calls >= 1 and both.usage.tokens > 0
    # A field neither found (the paper prints no DOI) says why, for both.
    assert rules[NO_DOI].values["doi"] is None and lines[NO_DOI].fields["doi"] is None
    assert lines[NO_DOI].field_errors["doi"].startswith("rules: not found; llm: not found in")
    no_doi = lines[NO_DOI].llm_fill
    assert no_doi is not None and no_doi["status"] == "answered" and no_doi["filled"] == []
    # Nothing left empty by the rules: the model was not asked.
    assert _empty(rules[ALL_FOUND]) == () and ALL_FOUND not in asked
    assert lines[ALL_FOUND].llm_fill == {
        "status": "not_needed",
        "asked": [],
        "filled": [],
        "error": None,
    }
    assert lines[ALL_FOUND].usage.calls == 0


async def test_an_invented_quote_from_the_endpoint_is_flagged_never_verified(
    boss: Shoal, corpus_dir: Path, key: dict[str, Any]
) -> None:
    fake = FakeModel(key, Script(invent_quotes={SAMPLE_MISSING}))
    with serve_fake(fake) as url:
        bench = await open_bench(boss, replace(FAST, llm=llm_settings(url)))
        try:
            task_id = await _start(bench, corpus_dir, [SAMPLE_MISSING], "rules+llm")
        finally:
            await bench.extraction.close()
    line = (await _lines(bench, task_id))[SAMPLE_MISSING]
    assert line.status == "completed"
    # The value is kept for a person to judge, labelled, flagged, its confidence capped.
    assert line.fields["sample_size"] == _truth(key, SAMPLE_MISSING)["sample_size"]
    evidence = line.evidence["sample_size"]
    assert evidence["source"] == "llm" and evidence["verified"] is False
    assert evidence["confidence"] <= UNVERIFIED_CONFIDENCE
    assert evidence["quote"].startswith("Exactly ")
    assert line.flagged == ("sample_size",)
    assert line.field_errors["sample_size"] == f"{FLAG} (flagged)"
    # The rules' values beside it are verified, as ever.
    assert all(e["verified"] for name, e in line.evidence.items() if name != "sample_size")


async def test_a_failing_endpoint_leaves_the_fields_empty_with_its_error_recorded(
    boss: Shoal, corpus_dir: Path, key: dict[str, Any]
) -> None:
    malformed, hanging, down = BOTH_MISSING, SAMPLE_MISSING, "paper-19.pdf"
    files = [malformed, hanging, down]
    rules = {f: _rules(corpus_dir, f) for f in files}
    fake = FakeModel(key, Script(malformed_always={malformed}, hang={hanging}, unavailable={down}))
    with serve_fake(fake) as url:
        # One retry: a timeout or a 503 is retried once, then the rules' values stand.
        settings = replace(FAST, retry_limit=1, llm=replace(llm_settings(url), timeout_s=1.0))
        bench = await open_bench(boss, settings)
        try:
            task_id = await _start(bench, corpus_dir, files, "rules+llm")
        finally:
            await bench.extraction.close()
    lines = await _lines(bench, task_id)
    for file in files:
        line = lines[file]
        # Completed, never failed: the rules' values, the fields asked empty, nothing invented.
        assert line.status == "completed" and line.error is None, file
        assert line.fields == rules[file].values, file
        assert line.llm_fill is not None and line.llm_fill["status"] == "failed", file
        assert line.llm_fill["asked"] == list(_empty(rules[file])) and not line.llm_fill["filled"]
        for name in _empty(rules[file]):
            assert line.field_errors[name].startswith("rules: not found; llm: failed ("), name
        assert all(e["source"] == "rules" for e in line.evidence.values())
    errors = {f: lines[f].llm_fill["error"] for f in files}  # type: ignore[index]
    assert "invalid after a repair attempt" in errors[malformed]
    assert "no answer from" in errors[hanging] and "within 1s" in errors[hanging]
    assert "answered 503" in errors[down]
    # A permanent failure is not retried; a transient one is, while runs remain.
    assert lines[malformed].attempts == 1 and lines[malformed].failed_runs == 0
    for file in (hanging, down):
        assert lines[file].attempts == 2 and lines[file].failed_runs == 1, file
    # Every call is in the ledger, the failed ones included.
    calls = fake.snapshot()
    for file in files:
        assert lines[file].usage.calls == sum(c.file == file for c in calls), file
    assert [c.outcome for c in calls if c.file == malformed] == ["malformed", "malformed"]


async def test_without_an_endpoint_rules_llm_is_the_rules_and_says_so(
    rules_bench: Bench, corpus_dir: Path
) -> None:
    files = [BOTH_MISSING, NO_DOI, ALL_FOUND, "paper-06.txt"]
    rules_task = await _start(rules_bench, corpus_dir, files, "rules")
    both_task = await _start(rules_bench, corpus_dir, files, "rules+llm")
    by_rules, by_both = await _lines(rules_bench, rules_task), await _lines(rules_bench, both_task)
    for file in files:
        alone, both = by_rules[file], by_both[file]
        assert both.status == "completed" and both.extractor == "rules+llm", file
        assert both.fields == alone.fields and both.evidence == alone.evidence, file
        assert both.flagged == alone.flagged and both.usage.calls == 0, file
        empty = [name for name in CLINICAL_TRIAL.field_names if both.fields[name] is None]
        if empty:
            assert both.llm_fill == {
                "status": "not_configured",
                "asked": empty,
                "filled": [],
                "error": NOT_CONFIGURED,
            }, file
            for name in empty:
                assert both.field_errors[name].startswith(
                    f"rules: {alone.field_errors[name]}; llm: no endpoint is configured"
                ), (file, name)
        else:
            assert both.llm_fill is not None and both.llm_fill["status"] == "not_needed"
    assert "SHOAL_LLM_BASE_URL" in NOT_CONFIGURED
