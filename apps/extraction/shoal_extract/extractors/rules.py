"""``rules``: the offline, deterministic extractor. Patterns and layout cues, no model.

It reads the front matter (everything before the abstract) for the
bibliographic fields and the abstract and body (never the references) for
the trial's elements. Each field has a short list of patterns tried in
order; when none matches, the field is "not found". It never falls back to
"the first year in the text" or "any DOI": a reference's DOI or a received
date is a wrong answer, and a wrong answer is worse than none.

Fields it knows: title, authors, year, journal, doi, sample_size,
intervention, comparator, primary_outcome, conclusion. Any other field of a
template is reported as not found, with the reason.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from shoal_extract.extractors import front_matter
from shoal_extract.extractors.base import CallContext, Extraction
from shoal_extract.parsing import DocumentFormat, ParsedText
from shoal_extract.pdf_signals import PdfSignals
from shoal_extract.templates import Template

NOT_FOUND = "not found"
# Beyond this a "title" is a run of body text: the paragraph split failed.
MAX_TITLE_CHARS = 300
MIN_TITLE_WORDS = 4
# Where the front matter ends when a paper has no "Abstract" heading.
FRONT_MATTER_FALLBACK_CHARS = 2000

_YEAR = r"(?P<year>(?:18|19|20)\d{2})"
# The citation lines journals print in the header, with the journal's name.
CITATIONS = [
    # Journal of X. 2019;12(3):45-67
    re.compile(rf"^(?P<journal>[A-Z][^\n|;]*?)\.\s+{_YEAR}\s*;\s*\d+", re.MULTILINE),
    # Journal of X 12 (2019) 45-67
    re.compile(rf"^(?P<journal>[A-Z][^\n|;]*?)\s+\d+\s+\({_YEAR}\)\s+\d+", re.MULTILINE),
    # Journal of X | Published online 3 May 2019
    re.compile(
        rf"^(?P<journal>[A-Z][^\n|;]*?)\s*\|\s*Published(?: online)?:?\s+"
        rf"(?:\d{{1,2}}\s+)?[A-Z][a-z]+\.?\s+{_YEAR}",
        re.MULTILINE,
    ),
]
PUBLISHED = re.compile(
    rf"\bPublished(?: online)?:?\s+(?:\d{{1,2}}\s+)?[A-Z][a-z]+\.?\s+(?:\d{{1,2}},\s+)?{_YEAR}"
)
COPYRIGHT = re.compile(rf"(?:©|\(c\)|Copyright)\s*{_YEAR}", re.IGNORECASE)
DOI = re.compile(
    r"(?:https?://(?:dx\.)?doi\.org/|\bdoi:?\s*)(?P<doi>10\.\d{4,9}/[^\s\"<>]+)", re.IGNORECASE
)
ABSTRACT = re.compile(r"^[#*\s]*Abstract\b", re.MULTILINE | re.IGNORECASE)
REFERENCES = re.compile(r"^[#\s]*(?:References|Bibliography)\s*$", re.MULTILINE | re.IGNORECASE)
# A personal name: capitalised words of letters in any script (Zoë Müller, Søren
# Ødegård), initials allowed in between. [^\W\d_] is "a letter" in Python's re.
_WORD = r"[^\W\d_][^\W\d_'\-]*(?:['\-][^\W\d_]+)*"
NAME = re.compile(rf"^{_WORD}(?:\s+[^\W\d_]\.)*(?:\s+{_WORD})+$")
AFFILIATION_MARKS = re.compile(r"(?<=[^\W\d_])[\d,]*\d\*?|\*|†|‡")
POPULATION = r"(?:adults|patients|participants|outpatients|inpatients|children|women|men|people|subjects|volunteers)"  # noqa: E501 - one alternation
COUNT = r"(?P<n>\d{1,3}(?:,\d{3})+|\d+)"
SAMPLE_SIZE = [
    # A structured abstract's label: "Patients—308 patients (mean age 60 years ...)"
    re.compile(
        rf"\b(?:Patients|Participants|Subjects)\s*[\u2014\u2013:]\s*{COUNT}\s+{POPULATION}\b"
    ),
    # "Of 180 patients included in this study": not "Of 900 patients screened"
    re.compile(rf"\bOf\s+{COUNT}\s+{POPULATION}\s+(?:included|enrolled|randomi[sz]ed)\b"),
    re.compile(
        rf"\b(?:randomly assigned|randomi[sz]ed|enrolled|recruited|included|A total of)\s+"
        rf"{COUNT}\s+{POPULATION}\b"
    ),
    re.compile(
        # Not across a comma: "Of 900 patients screened, 412 were randomized"
        # names two counts, and the first is not the sample size.
        rf"\b{COUNT}\s+{POPULATION}\b[^.,]{{0,120}}?\bwere\s+"
        r"(?:randomly assigned|randomi[sz]ed|enrolled|allocated|included)"
    ),
    re.compile(r"\b[Nn]\s*=\s*(?P<n>\d{1,3}(?:,\d{3})+|\d+)\s+(?:were\s+)?randomi[sz]ed"),
    # A table row (Markdown, as the parser writes tables): | Randomized | 416 |
    re.compile(
        rf"\|\s*(?:Randomi[sz]ed|Randomly assigned)\b[^|\n]*\|\s*{COUNT}\s*\|", re.IGNORECASE
    ),
]
# The first three patterns are the usual phrasings; the rest can mislead.
SAMPLE_SIZE_USUAL = 2
ARMS = re.compile(
    r"\b(?:randomly assigned|randomi[sz]ed|allocated)\b[^.]*?\bto\s+(?:receive\s+)?"
    r"(?P<intervention>[^.;]+?)\s+(?:or|versus|vs\.?)\s+(?P<comparator>[^.;]+?)\.(?:\s|$)"
)
PRIMARY_OUTCOME = re.compile(
    r"\bprimary\s+(?:outcome|end\s?point)(?:\s+measure)?\s+(?:was|were)\s+(?:the\s+)?"
    r"(?P<outcome>[^.;]+?)\.(?:\s|$)",
    re.IGNORECASE,
)
CONCLUSION = re.compile(
    r"\bConclusions?(?: and relevance)?\s*[:.]\s*(?P<conclusion>.+?\.)(?=\s+[A-Z]|\s*$)"
)


class Sections:
    """A document cut where the rules look: front matter, body (without references)."""

    def __init__(self, document: ParsedText) -> None:
        self.document = document

    @cached_property
    def text(self) -> str:
        return self.document.text

    @cached_property
    def body(self) -> str:
        match = REFERENCES.search(self.text)
        return self.text[: match.start()] if match else self.text

    @cached_property
    def front(self) -> str:
        match = ABSTRACT.search(self.body)
        return self.body[: match.start()] if match else self.body[:FRONT_MATTER_FALLBACK_CHARS]

    @cached_property
    def flat_body(self) -> str:
        """The body on one line, words re-joined where a line break split a hyphenated word."""
        flat = " ".join(self.body.split())
        return re.sub(r"(?<=[a-z])- (?=[a-z])", "-", flat)

    @cached_property
    def independent_body(self) -> str:
        """PDFium's text of a PDF's pages on one line, up to its references ("" if none)."""
        signals = self.document.signals
        if signals is None:
            return ""
        text = "\n".join(signals.pages)
        match = REFERENCES.search(text)
        flat = " ".join((text[: match.start()] if match else text).split())
        return re.sub(r"(?<=[a-z])[\ufffe\x02] ?(?=[a-z])", "", flat)

    @cached_property
    def searched(self) -> tuple[str, ...]:
        """Where the sentence patterns look: PDFium's text first (the printed words), the parse."""
        return tuple(t for t in (self.independent_body, self.flat_body) if t)

    @cached_property
    def citation(self) -> re.Match[str] | None:
        for pattern in CITATIONS:
            match = pattern.search(self.front)
            if match:
                return match
        return None


def _clean(text: str) -> str:
    return " ".join(text.split()).strip()


def _is_front_line(paragraph: str) -> bool:
    """Header material that is not the title: citation lines, DOIs, labels."""
    flat = _clean(paragraph)
    return (
        any(p.search(flat) for p in CITATIONS)
        or bool(DOI.search(flat))
        or bool(PUBLISHED.search(flat))
        or len(flat.split()) < MIN_TITLE_WORDS
    )


# How sure a rule is of what it found (a ranking aid for review, not a
# calibrated probability): a labelled or printed-for-the-purpose source, the
# usual phrasing, a fallback that can mislead.
SURE, USUAL, FALLBACK = 0.95, 0.85, 0.7


@dataclass(frozen=True, slots=True)
class Found:
    """A rule's value, the passage of the text it read it from, and how sure it is."""

    value: Any
    quote: str
    confidence: float


def find_title(s: Sections) -> Found | None:
    doc = s.document
    if doc.format is DocumentFormat.MARKDOWN:
        match = re.search(r"^#\s+(.+)$", s.front, re.MULTILINE)
        return Found(_clean(match.group(1)), match.group(1), SURE) if match else None
    if doc.title_hint and len(doc.title_hint.split()) >= MIN_TITLE_WORDS:
        return Found(_clean(doc.title_hint), doc.title_hint, SURE)
    for paragraph in re.split(r"\n\s*\n", s.front):
        if not paragraph.strip() or _is_front_line(paragraph):
            continue
        title = _clean(paragraph.lstrip("# "))
        # The first paragraph that is not header material is the title, or
        # nothing is: a later paragraph is authors or affiliations.
        if len(title) <= MAX_TITLE_CHARS and not _authors_of(title):
            return Found(title, paragraph.lstrip("# "), FALLBACK)
        return None
    return None


def find_year(s: Sections) -> Found | None:
    if s.citation:
        return Found(int(s.citation.group("year")), s.citation.group(0), SURE)
    for pattern in (PUBLISHED, COPYRIGHT):
        match = pattern.search(s.front)
        if match:
            return Found(int(match.group("year")), match.group(0), USUAL)
    return None


def find_journal(s: Sections) -> Found | None:
    if s.citation is None:
        return None
    return Found(_clean(s.citation.group("journal")), s.citation.group(0), SURE)


def find_doi(s: Sections) -> Found | None:
    match = DOI.search(s.front)
    if match is None:
        return None
    return Found(match.group("doi").rstrip(".,;)]"), match.group(0).rstrip(".,;)]"), SURE)


def _authors_of(line: str) -> list[str] | None:
    """The names on an author line ("A. Smith1*, B. Jones2 and C. Wu"), or None."""
    line = AFFILIATION_MARKS.sub("", line)
    parts = [p.strip() for p in re.split(r",\s*(?:and\s+)?|\s+and\s+|;\s*", line) if p.strip()]
    if parts and all(NAME.match(p) and all(w[0].isupper() for w in p.split()) for p in parts):
        return parts
    return None


AUTHOR_BLOCK_END = re.compile(r"^(?:\d|Received|Accepted|Abstract|Keywords|Correspond)")
MAX_AUTHOR_LINES = 3


def find_authors(s: Sections) -> Found | None:
    """The names printed right under the title (the title anchors where to look)."""
    title = find_title(s)
    if title is None:
        return None
    anchor = re.search(r"\s+".join(map(re.escape, title.value.split())), s.front)
    if anchor is None:
        return None
    block: list[str] = []
    printed: list[str] = []
    for raw in s.front[anchor.end() :].splitlines():
        line = raw.strip().strip("*_").strip()
        if not line:
            if block:
                break  # the paragraph under the title ended
            continue
        if AUTHOR_BLOCK_END.match(line):
            break
        block.append(line)
        printed.append(raw.strip())
        if len(block) == MAX_AUTHOR_LINES:
            break
    names = _authors_of(" ".join(block)) if block else None
    return Found(", ".join(names), " ".join(printed), USUAL) if names else None


def find_sample_size(s: Sections) -> Found | None:
    for rank, pattern in enumerate(SAMPLE_SIZE):
        match = next((m for text in s.searched for m in [pattern.search(text)] if m), None)
        if match:
            n = int(match.group("n").replace(",", ""))
            # A table row is quoted as its cells read on the page, not as Markdown.
            quote = " ".join(match.group(0).replace("|", " ").split())
            return Found(n, quote, USUAL if rank <= SAMPLE_SIZE_USUAL else FALLBACK)
    return None


def _arms(s: Sections) -> re.Match[str] | None:
    return ARMS.search(s.flat_body)


def find_intervention(s: Sections) -> Found | None:
    match = _arms(s)
    return Found(match.group("intervention").strip(), match.group(0), USUAL) if match else None


def find_comparator(s: Sections) -> Found | None:
    match = _arms(s)
    return Found(match.group("comparator").strip(), match.group(0), USUAL) if match else None


def find_primary_outcome(s: Sections) -> Found | None:
    match = PRIMARY_OUTCOME.search(s.flat_body)
    return Found(match.group("outcome").strip(), match.group(0), SURE) if match else None


def find_conclusion(s: Sections) -> Found | None:
    match = CONCLUSION.search(s.flat_body)
    return Found(match.group("conclusion").strip(), match.group(0), SURE) if match else None


FINDERS: dict[str, Callable[[Sections], Found | None]] = {
    "title": find_title,
    "authors": find_authors,
    "year": find_year,
    "journal": find_journal,
    "doi": find_doi,
    "sample_size": find_sample_size,
    "intervention": find_intervention,
    "comparator": find_comparator,
    "primary_outcome": find_primary_outcome,
    "conclusion": find_conclusion,
}


# Fields a PDF's front page and metadata answer (pdf_signals): read there, not in the parse.
FRONT_FINDERS: dict[str, Callable[[PdfSignals], front_matter.Signal | None]] = {
    "title": front_matter.find_title,
    "authors": front_matter.find_authors,
    "year": front_matter.find_year,
    "journal": front_matter.find_journal,
    "doi": front_matter.find_doi,
}


def _find(name: str, sections: Sections) -> Found | None:
    signals = sections.document.signals
    # A front page read by OCR has no text layer for PDFium: the text rules read the OCR.
    scanned = 1 in sections.document.ocr_pages
    if signals is not None and not scanned and name in FRONT_FINDERS:
        found = FRONT_FINDERS[name](signals)
        return None if found is None else Found(found.value, found.quote, found.confidence)
    finder = FINDERS.get(name)
    return finder(sections) if finder else None


def extract_fields(document: ParsedText, template: Template) -> Extraction:
    """Every field of ``template`` from ``document``: a pure function of its text."""
    sections = Sections(document)
    values: dict[str, Any] = {}
    notes: dict[str, str] = {}
    quotes: dict[str, str] = {}
    confidence: dict[str, float] = {}
    for spec in template.fields:
        finder = FINDERS.get(spec.name)
        found = _find(spec.name, sections)
        if found is not None and spec.check_value(found.value) is not None:
            found = None  # found something, but not of the field's type: no guess
        values[spec.name] = None if found is None else found.value
        if found is None:
            notes[spec.name] = NOT_FOUND if finder else "not found: the rules know no such field"
        else:
            quotes[spec.name] = found.quote
            confidence[spec.name] = found.confidence
    return Extraction(values=values, notes=notes, quotes=quotes, confidence=confidence)


class RulesExtractor:
    """The ``rules`` extractor (the default): offline and deterministic."""

    name = "rules"

    async def extract(
        self, document: ParsedText, template: Template, *, context: CallContext
    ) -> Extraction:
        # Regexes over a long paper take a few milliseconds; off the event loop anyway.
        return await asyncio.to_thread(extract_fields, document, template)


__all__ = ["FINDERS", "NOT_FOUND", "Found", "RulesExtractor", "extract_fields"]
