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
from functools import cached_property
from typing import Any

from shoal_extract.extractors.base import CallContext, Extraction
from shoal_extract.parsing import DocumentFormat, ParsedText
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
NAME = re.compile(r"^[A-Z][a-zA-Z'\-]+(?:\s+[A-Z]\.)*(?:\s+[A-Z][a-zA-Z'\-]+)+$")
AFFILIATION_MARKS = re.compile(r"(?<=[a-z])[\d,]*\d\*?|\*|†|‡")
POPULATION = r"(?:adults|patients|participants|outpatients|inpatients|children|women|men|people|subjects|volunteers)"  # noqa: E501 - one alternation
COUNT = r"(?P<n>\d{1,3}(?:,\d{3})+|\d+)"
SAMPLE_SIZE = [
    re.compile(
        rf"\b(?:randomly assigned|randomi[sz]ed|enrolled|recruited|included|A total of)\s+"
        rf"{COUNT}\s+{POPULATION}\b"
    ),
    re.compile(
        # Not across a comma: "Of 900 patients screened, 412 were randomized"
        # names two counts, and the first is not the sample size.
        rf"\b{COUNT}\s+{POPULATION}\b[^.,]{{0,120}}?\bwere\s+"
        r"(?:randomly assigned|randomi[sz]ed|enrolled|allocated)"
    ),
    re.compile(r"\b[Nn]\s*=\s*(?P<n>\d{1,3}(?:,\d{3})+|\d+)\s+(?:were\s+)?randomi[sz]ed"),
]
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


def find_title(s: Sections) -> str | None:
    doc = s.document
    if doc.format is DocumentFormat.MARKDOWN:
        match = re.search(r"^#\s+(.+)$", s.front, re.MULTILINE)
        return _clean(match.group(1)) if match else None
    if doc.title_hint and len(doc.title_hint.split()) >= MIN_TITLE_WORDS:
        return _clean(doc.title_hint)
    for paragraph in re.split(r"\n\s*\n", s.front):
        if not paragraph.strip() or _is_front_line(paragraph):
            continue
        title = _clean(paragraph)
        # The first paragraph that is not header material is the title, or
        # nothing is: a later paragraph is authors or affiliations.
        return title if len(title) <= MAX_TITLE_CHARS and not _authors_of(title) else None
    return None


def find_year(s: Sections) -> int | None:
    if s.citation:
        return int(s.citation.group("year"))
    for pattern in (PUBLISHED, COPYRIGHT):
        match = pattern.search(s.front)
        if match:
            return int(match.group("year"))
    return None


def find_journal(s: Sections) -> str | None:
    return _clean(s.citation.group("journal")) if s.citation else None


def find_doi(s: Sections) -> str | None:
    match = DOI.search(s.front)
    return match.group("doi").rstrip(".,;)]") if match else None


def _authors_of(line: str) -> list[str] | None:
    """The names on an author line ("A. Smith1*, B. Jones2 and C. Wu"), or None."""
    line = AFFILIATION_MARKS.sub("", line)
    parts = [p.strip() for p in re.split(r",\s*(?:and\s+)?|\s+and\s+|;\s*", line) if p.strip()]
    if parts and all(NAME.match(p) for p in parts):
        return parts
    return None


AUTHOR_BLOCK_END = re.compile(r"^(?:\d|Received|Accepted|Abstract|Keywords|Correspond)")
MAX_AUTHOR_LINES = 3


def find_authors(s: Sections) -> str | None:
    """The names printed right under the title (the title anchors where to look)."""
    title = find_title(s)
    if title is None:
        return None
    anchor = re.search(r"\s+".join(map(re.escape, title.split())), s.front)
    if anchor is None:
        return None
    block: list[str] = []
    for raw in s.front[anchor.end() :].splitlines():
        line = raw.strip().strip("*_").strip()
        if not line:
            if block:
                break  # the paragraph under the title ended
            continue
        if AUTHOR_BLOCK_END.match(line):
            break
        block.append(line)
        if len(block) == MAX_AUTHOR_LINES:
            break
    names = _authors_of(" ".join(block)) if block else None
    return ", ".join(names) if names else None


def find_sample_size(s: Sections) -> int | None:
    for pattern in SAMPLE_SIZE:
        match = pattern.search(s.flat_body)
        if match:
            return int(match.group("n").replace(",", ""))
    return None


def _arms(s: Sections) -> re.Match[str] | None:
    return ARMS.search(s.flat_body)


def find_intervention(s: Sections) -> str | None:
    match = _arms(s)
    return match.group("intervention").strip() if match else None


def find_comparator(s: Sections) -> str | None:
    match = _arms(s)
    return match.group("comparator").strip() if match else None


def find_primary_outcome(s: Sections) -> str | None:
    match = PRIMARY_OUTCOME.search(s.flat_body)
    return match.group("outcome").strip() if match else None


def find_conclusion(s: Sections) -> str | None:
    match = CONCLUSION.search(s.flat_body)
    return match.group("conclusion").strip() if match else None


FINDERS: dict[str, Callable[[Sections], Any]] = {
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


def extract_fields(document: ParsedText, template: Template) -> Extraction:
    """Every field of ``template`` from ``document``: a pure function of its text."""
    sections = Sections(document)
    values: dict[str, Any] = {}
    notes: dict[str, str] = {}
    for spec in template.fields:
        finder = FINDERS.get(spec.name)
        value = finder(sections) if finder else None
        if value is not None and spec.check_value(value) is not None:
            value = None  # found something, but not of the field's type: no guess
        values[spec.name] = value
        if value is None:
            notes[spec.name] = NOT_FOUND if finder else "not found: the rules know no such field"
    return Extraction(values=values, notes=notes)


class RulesExtractor:
    """The ``rules`` extractor (the default): offline and deterministic."""

    name = "rules"

    async def extract(
        self, document: ParsedText, template: Template, *, context: CallContext
    ) -> Extraction:
        # Regexes over a long paper take a few milliseconds; off the event loop anyway.
        return await asyncio.to_thread(extract_fields, document, template)


__all__ = ["FINDERS", "NOT_FOUND", "RulesExtractor", "extract_fields"]
