"""The sample corpus: synthetic trial reports (PDF, text, Markdown) and their key.

``write_corpus(folder)`` writes a few dozen papers made up from a seeded
random generator, so the same seed gives the same bytes on every machine,
and ``key.json`` beside them with every paper's true field values (and the
SHA-256 of its file, which is how a result is matched to its truth).

The papers look like trial reports: a citation header in one of three
styles, a DOI (not always), a title in a large font, authors with
affiliation marks, received/accepted dates, a structured abstract, an
introduction that quotes other years, and references carrying other DOIs.
Those are the traps a naive extractor falls into. A few papers state no
sample size, and a few have no DOI: their key says ``null``, and the right
answer is "not found". Some phrasings are harder on purpose (a screening
count next to the randomized one, a Lancet-style "Interpretation" in place
of "Conclusions"), so an extractor's accuracy is not 100% by construction.

Three files are broken on purpose (a truncated PDF, an HTML error page saved
as ``.pdf``, a PDF with no text layer) to show permanent item errors.
"""

from __future__ import annotations

import hashlib
import json
import random
import textwrap
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fpdf import FPDF

GENERATOR_VERSION = 1
DEFAULT_SEED = 2026
DEFAULT_PAPERS = 42  # plus the broken files
KEY_FILE = "key.json"
# Every PDF claims this creation date, so the bytes depend on the seed alone.
PDF_DATE = datetime(2026, 1, 1, tzinfo=UTC)

FIRST = ["Anna", "Tom", "Maria", "Jonas", "Lea", "Omar", "Priya", "Chen", "Sofia", "David",
         "Ines", "Karim", "Nora", "Felix", "Aisha", "Lukas", "Mei", "Pedro", "Hana",
         "Erik"]  # fmt: skip
LAST = ["Keller", "Brandt", "Lopez", "Novak", "Haddad", "Sato", "Okafor", "Lindqvist", "Rossi",
        "Moreau", "Nguyen", "Fischer", "Costa", "Kowalski", "Ahmed", "Berg", "Tanaka", "Weber",
        "Silva", "Dubois", "Murphy", "Jensen", "Ivanova", "Park"]  # fmt: skip
JOURNALS = ["Journal of Clinical Trials", "Trials in Medicine", "European Journal of Therapeutics",
            "Clinical Research Letters", "Annals of Evidence-Based Care",
            "International Journal of Randomized Studies"]  # fmt: skip
PREFIXES = ["10.1186", "10.1016", "10.1371", "10.5555", "10.7326"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]  # fmt: skip
POPULATIONS = ["adults", "patients", "participants", "outpatients"]
# condition, interventions, comparators, outcomes
AREAS: list[tuple[str, list[str], list[str], list[str]]] = [
    ("type 2 diabetes", ["metformin 1000 mg twice daily", "empagliflozin 10 mg daily",
     "a structured exercise programme"], ["placebo", "usual care"],
     ["change in HbA1c at 24 weeks", "fasting plasma glucose at 12 weeks"]),
    ("essential hypertension", ["amlodipine 5 mg daily", "a low-sodium diet",
     "home blood pressure telemonitoring"], ["placebo", "usual care"],
     ["change in systolic blood pressure at 12 weeks", "blood pressure control at 6 months"]),
    ("major depressive disorder", ["internet-delivered cognitive behavioural therapy",
     "sertraline 50 mg daily", "a group exercise intervention"],
     ["waiting list", "placebo", "attention control"],
     ["change in PHQ-9 score at 8 weeks", "remission at 12 weeks"]),
    ("chronic low back pain", ["spinal manipulation", "a graded activity programme",
     "acupuncture"], ["sham acupuncture", "usual care", "advice only"],
     ["pain intensity at 3 months", "Roland-Morris disability score at 12 weeks"]),
    ("moderate asthma", ["budesonide-formoterol as needed", "a breathing retraining programme"],
     ["maintenance budesonide", "usual care"],
     ["rate of severe exacerbations over 52 weeks", "asthma control score at 6 months"]),
    ("knee osteoarthritis", ["supervised physiotherapy", "intra-articular hyaluronic acid",
     "a weight-loss programme"], ["saline injection", "usual care", "education only"],
     ["WOMAC pain score at 6 months", "walking distance at 12 weeks"]),
    ("insomnia disorder", ["digital cognitive behavioural therapy for insomnia",
     "zolpidem 5 mg nightly"], ["sleep hygiene education", "placebo"],
     ["insomnia severity index at 8 weeks", "sleep efficiency at 4 weeks"]),
    ("atrial fibrillation", ["catheter ablation", "a nurse-led care programme"],
     ["antiarrhythmic drug therapy", "usual care"],
     ["freedom from atrial arrhythmia at 12 months", "cardiovascular hospitalisation at 1 year"]),
]  # fmt: skip
LABELS = ["ORIGINAL ARTICLE", "RESEARCH", "Clinical Trial Report"]
ACRONYMS = ["STEP", "BRIDGE", "CLEAR", "PACE", "REST", "FOCUS", "SPRING", "ANCHOR"]


@dataclass(frozen=True, slots=True)
class Paper:
    """One synthetic paper: its true values and how it is laid out."""

    file: str
    format: str  # pdf | txt | md
    title: str
    authors: list[str]
    year: int
    journal: str
    volume: int
    issue: int
    pages: str
    doi: str | None
    sample_size: int | None
    intervention: str
    comparator: str
    primary_outcome: str
    conclusion: str
    condition: str
    population: str
    # layout choices
    header_style: int
    doi_style: int
    methods_style: int
    outcome_style: int
    conclusion_heading: str
    label: str | None
    affiliation_marks: bool
    received: str
    accepted: str
    published: str

    def truth(self) -> dict[str, Any]:
        """The true values of the clinical-trial template's fields."""
        return {
            "title": self.title,
            "authors": ", ".join(self.authors),
            "year": self.year,
            "journal": self.journal,
            "doi": self.doi,
            "sample_size": self.sample_size,
            "intervention": self.intervention,
            "comparator": self.comparator,
            "primary_outcome": self.primary_outcome,
            "conclusion": self.conclusion,
        }


def make_papers(count: int = DEFAULT_PAPERS, seed: int = DEFAULT_SEED) -> list[Paper]:
    """``count`` papers, the same ones for the same seed."""
    rng = random.Random(seed)
    papers = []
    used_titles: set[str] = set()
    for i in range(count):
        fmt = "pdf" if i % 7 < 5 else ("txt" if i % 7 == 5 else "md")
        paper = random_paper(rng, i, fmt)
        while paper.title in used_titles:
            paper = random_paper(rng, i, fmt)
        used_titles.add(paper.title)
        papers.append(paper)
    return papers


def _cap(text: str) -> str:
    return text[0].upper() + text[1:]


def _date(rng: random.Random, year: int) -> str:
    return f"{rng.randint(1, 28)} {rng.choice(MONTHS)} {year}"


def random_paper(rng: random.Random, index: int, fmt: str) -> Paper:
    condition, interventions, comparators, outcomes = rng.choice(AREAS)
    intervention = rng.choice(interventions)
    comparator = rng.choice(comparators)
    outcome = rng.choice(outcomes)
    population = rng.choice(POPULATIONS)
    year = rng.randint(2008, 2025)
    style = rng.randrange(3)
    if style == 0:
        title = f"{_cap(intervention)} versus {comparator} in {population} with {condition}: a randomized controlled trial"  # noqa: E501 - one title
    elif style == 1:
        short = outcome.split(" at ")[0]
        title = f"Effect of {intervention} on {short} in {condition}: the {rng.choice(ACRONYMS)} randomized clinical trial"  # noqa: E501 - one title
    else:
        title = f"{_cap(intervention)} for {condition}: a multicentre randomised trial against {comparator}"  # noqa: E501 - one title
    names = rng.sample(range(len(FIRST) * len(LAST)), rng.randint(2, 6))
    authors = [f"{FIRST[n % len(FIRST)]} {LAST[n // len(FIRST)]}" for n in names]
    has_doi = rng.random() > 0.15
    doi = f"{rng.choice(PREFIXES)}/s{rng.randint(10000, 99999)}-{year % 100:02d}-{rng.randint(100, 9999):04d}"  # noqa: E501 - one DOI
    stated_n = rng.random() > 0.1
    effect = rng.random() > 0.4
    if effect:
        conclusion = f"{_cap(intervention)} improved {outcome.split(' at ')[0]} compared with {comparator} in {population} with {condition}."  # noqa: E501 - one sentence
    else:
        conclusion = f"In {population} with {condition}, {intervention} did not improve {outcome.split(' at ')[0]} compared with {comparator}."  # noqa: E501 - one sentence
    first_page = rng.randint(1, 900)
    return Paper(
        file=f"paper-{index + 1:02d}.{fmt}",
        format=fmt,
        title=title,
        authors=authors,
        year=year,
        journal=rng.choice(JOURNALS),
        volume=rng.randint(3, 60),
        issue=rng.randint(1, 12),
        pages=f"{first_page}-{first_page + rng.randint(6, 14)}",
        doi=doi if has_doi else None,
        sample_size=rng.randint(40, 2400) if stated_n else None,
        intervention=intervention,
        comparator=comparator,
        primary_outcome=outcome,
        conclusion=conclusion,
        condition=condition,
        population=population,
        header_style=rng.randrange(3),
        doi_style=rng.randrange(3),
        methods_style=rng.choice([0, 1, 2, 4]) if stated_n else 3,
        outcome_style=rng.randrange(3),
        conclusion_heading="Interpretation" if rng.random() < 0.15 else "Conclusions",
        label=rng.choice(LABELS) if rng.random() < 0.4 else None,
        affiliation_marks=rng.random() < 0.5,
        received=_date(rng, year - 1),
        accepted=_date(rng, year - rng.randint(0, 1)),
        published=_date(rng, year),
    )


# -- the text of a paper, as blocks -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Block:
    """A run of text in one style: ``kind`` picks the font (and Markdown markup)."""

    kind: str  # header | doi | label | title | authors | small | heading | body | ref
    text: str


def blocks(paper: Paper, rng: random.Random) -> list[Block]:
    """The paper's content in reading order."""
    p = paper
    out: list[Block] = []
    if p.header_style == 0:
        out.append(Block("header", f"{p.journal}. {p.year};{p.volume}({p.issue}):{p.pages}"))
    elif p.header_style == 1:
        out.append(Block("header", f"{p.journal} {p.volume} ({p.year}) {p.pages}"))
    else:
        out.append(Block("header", f"{p.journal} | Published online {p.published}"))
    if p.doi is not None:
        text = ("https://doi.org/{}", "DOI: {}", "doi:{}")[p.doi_style].format(p.doi)
        out.append(Block("doi", text))
    if p.label:
        out.append(Block("label", p.label))
    out.append(Block("title", p.title))
    marks = [f"{rng.randint(1, 3)}" + ("*" if i == 0 else "") for i in range(len(p.authors))]
    names = [n + (m if p.affiliation_marks else "") for n, m in zip(p.authors, marks, strict=True)]
    out.append(Block("authors", ", ".join(names[:-1]) + " and " + names[-1]))
    out.append(Block("small", f"1 Department of Medicine, University of {rng.choice(LAST)}berg"))
    out.append(Block("small", f"Received {p.received}; accepted {p.accepted}"))
    out.append(Block("heading", "Abstract"))
    out.append(
        Block(
            "body",
            f"Background: {_cap(p.condition)} is common and costly. Whether "
            f"{p.intervention} helps {p.population} with {p.condition} is uncertain.",
        )
    )
    n, pop, cond, i, c = p.sample_size, p.population, p.condition, p.intervention, p.comparator
    methods = (
        f"In this randomized controlled trial, we randomly assigned {n} {pop} with {cond} "
        f"to receive {i} or {c}.",
        f"We conducted a double-blind trial in which {n} {pop} with {cond} were randomized "
        f"to {i} or {c}.",
        f"A total of {n} {pop} with {cond} were enrolled and allocated to {i} or {c}.",
        f"Eligible {pop} with {cond} were randomly assigned to {i} or {c}.",
        f"Of {(n or 0) * 2 + 17} {pop} with {cond} screened, {n} were randomly assigned "
        f"to {i} or {c}.",
    )[p.methods_style]
    outcome = ("The primary outcome was", "The primary end point was", "Our primary outcome was")
    out.append(Block("body", f"Methods: {methods} {outcome[p.outcome_style]} {p.primary_outcome}."))
    out.append(
        Block(
            "body",
            f"Results: Baseline characteristics were balanced. The difference in "
            f"{p.primary_outcome} was {rng.uniform(0.1, 9.9):.1f} points "
            f"(95% CI {rng.uniform(0.1, 2):.1f} to {rng.uniform(2, 12):.1f}).",
        )
    )
    out.append(Block("body", f"{p.conclusion_heading}: {p.conclusion}"))
    out.append(Block("small", f"Keywords: {p.condition}; randomized trial; {p.comparator}"))
    old = rng.randint(1995, p.year - 3)
    out.append(Block("heading", "1 Introduction"))
    out.append(
        Block(
            "body",
            f"Since a {old} meta-analysis, {p.condition} has been treated in many ways; "
            f"trials from {old + 1} onwards were small. We therefore compared {p.intervention} "
            f"with {p.comparator}. This paper follows the CONSORT {rng.choice([2010, 2025])} "
            "statement.",
        )
    )
    out.append(Block("heading", "2 Methods"))
    out.append(
        Block(
            "body",
            "Participants gave written informed consent. Allocation was concealed by a central "
            "web system, and outcome assessors were blinded to the allocated group.",
        )
    )
    out.append(Block("heading", "References"))
    for k in range(1, rng.randint(3, 5)):
        ref_year = rng.randint(1998, p.year - 1)
        ref_doi = f"{rng.choice(PREFIXES)}/j.{rng.randint(1000, 9999)}.{ref_year}.{k:03d}"
        author = f"{rng.choice(LAST)} {rng.choice('ABCDEFGHJK')}"
        out.append(
            Block(
                "ref",
                f"{k}. {author}, et al. A trial in {rng.choice(AREAS)[0]}. "
                f"{rng.choice(JOURNALS)}. {ref_year};{rng.randint(1, 40)}:{rng.randint(1, 300)}. "
                f"doi:{ref_doi}",
            )
        )
    return out


def render_text(paper: Paper, parts: list[Block]) -> str:
    """Plain text, wrapped at 78 columns, blank lines between blocks."""
    paragraphs = []
    for block in parts:
        if block.kind in ("header", "doi", "label", "heading"):
            paragraphs.append(block.text)
        else:
            paragraphs.append(textwrap.fill(block.text, 78, break_on_hyphens=False))
    return "\n\n".join(paragraphs) + "\n"


def render_markdown(paper: Paper, parts: list[Block]) -> str:
    lines = []
    for block in parts:
        if block.kind == "title":
            lines.append(f"# {block.text}")
        elif block.kind == "heading":
            lines.append(f"## {block.text}")
        elif block.kind == "label":
            lines.append(f"*{block.text}*")
        elif block.kind == "ref":
            lines.append(f"- {block.text}")
        else:
            lines.append(block.text)
    return "\n\n".join(lines) + "\n"


# font family, style, size, line height (mm), space after (mm)
PDF_STYLES: dict[str, tuple[str, float, float, float]] = {
    "header": ("", 9, 4.5, 0.5),
    "doi": ("", 9, 4.5, 3),
    "label": ("B", 9, 4.5, 2),
    "title": ("B", 16, 7.5, 3),
    "authors": ("", 10.5, 5, 1),
    "small": ("I", 8, 4, 1),
    "heading": ("B", 11, 6, 1),
    "body": ("", 10, 5, 2),
    "ref": ("", 8, 4, 1),
}


def render_pdf(paper: Paper, parts: list[Block]) -> bytes:
    pdf = FPDF(format="A4")
    pdf.set_creation_date(PDF_DATE)
    pdf.set_margins(20, 18, 20)
    pdf.set_auto_page_break(True, margin=18)
    pdf.add_page()
    for block in parts:
        style, size, height, after = PDF_STYLES[block.kind]
        pdf.set_font("Helvetica", style, size)
        pdf.multi_cell(0, height, block.text, new_x="LMARGIN", new_y="NEXT")
        pdf.ln(after)
    return bytes(pdf.output())


def _scan_without_text() -> bytes:
    """A PDF page with only a drawing: what a scan without OCR looks like to a parser."""
    pdf = FPDF(format="A4")
    pdf.set_creation_date(PDF_DATE)
    pdf.add_page()
    for y in range(30, 260, 8):
        pdf.rect(20, y, 170, 4, style="F")
    return bytes(pdf.output())


def broken_files(sample_pdf: bytes) -> dict[str, tuple[bytes, str]]:
    """Name -> (bytes, why it is broken)."""
    return {
        "broken-truncated.pdf": (
            sample_pdf[: len(sample_pdf) // 3],
            "a PDF cut off a third of the way in (an interrupted download)",
        ),
        "broken-not-a-pdf.pdf": (
            b"<!doctype html><html><body><h1>403 Forbidden</h1>"
            b"<p>You do not have access to this article.</p></body></html>\n",
            "an HTML error page saved as .pdf",
        ),
        "broken-scan-no-text.pdf": (
            _scan_without_text(),
            "a page of drawings only: no text layer, and nothing for OCR to read",
        ),
    }


def write_corpus(
    folder: Path, *, count: int = DEFAULT_PAPERS, seed: int = DEFAULT_SEED
) -> list[Path]:
    """Write the papers, the broken files and ``key.json`` into ``folder``; return their paths.

    Deterministic: the same ``count`` and ``seed`` write the same bytes.
    """
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed + 1)
    entries: list[dict[str, Any]] = []
    written: list[Path] = []
    first_pdf: bytes | None = None
    for paper in make_papers(count, seed):
        parts = blocks(paper, rng)
        if paper.format == "pdf":
            content = render_pdf(paper, parts)
            first_pdf = first_pdf or content
        elif paper.format == "txt":
            content = render_text(paper, parts).encode()
        else:
            content = render_markdown(paper, parts).encode()
        path = folder / paper.file
        path.write_bytes(content)
        written.append(path)
        entries.append(
            {
                "file": paper.file,
                "sha256": hashlib.sha256(content).hexdigest(),
                "expected": "completed",
                "fields": paper.truth(),
            }
        )
    assert first_pdf is not None, "the corpus has PDFs"
    for name, (content, why) in broken_files(first_pdf).items():
        path = folder / name
        path.write_bytes(content)
        written.append(path)
        entries.append(
            {
                "file": name,
                "sha256": hashlib.sha256(content).hexdigest(),
                "expected": "error",
                "why": why,
                "fields": None,
            }
        )
    key = {"generator": GENERATOR_VERSION, "seed": seed, "documents": entries}
    (folder / KEY_FILE).write_text(json.dumps(key, indent=1, ensure_ascii=False) + "\n")
    return written


__all__ = [
    "DEFAULT_PAPERS",
    "DEFAULT_SEED",
    "KEY_FILE",
    "Block",
    "Paper",
    "blocks",
    "make_papers",
    "random_paper",
    "write_corpus",
]
