"""The hard corpus: the layouts real papers come in, with their key.

``write_hard_corpus(folder)`` writes PDFs that the sample corpus lacks, each
kind a few times from a seeded generator (the same seed, the same bytes):

=====================  =================================================================
layout                 what is hard about it
=====================  =================================================================
``two_column``         the body set in two columns: plain text extraction interleaves them
``table_only``         the number randomized is given only in a ruled table
``scan``               image-only pages (a scan without OCR): Tesseract must read them
``long``               45+ pages; the number randomized is stated on page 40 or later
=====================  =================================================================

Every paper's authors carry accented (non-ASCII) names, and some papers lack
a DOI or a sample size (their key says ``null``: "not found" is right).

**Held-out layouts.** Three more layouts are marked ``held_out`` in the key:
the rules extractor was not written against them, so their accuracy,
reported apart by ``shoal-extract evaluate``, says how the rules fare on a
layout they have not seen. They are a citation header in another style, a
transposed participant table, and other phrasings of the methods. Do not
tune the rules to them: add new held-out layouts instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import random
from pathlib import Path
from typing import Any

import pypdfium2
from fpdf import FPDF

from shoal_extract.corpus import (
    DEFAULT_SEED,
    GENERATOR_VERSION,
    KEY_FILE,
    PDF_DATE,
    PDF_STYLES,
    Block,
    Paper,
    blocks,
    random_paper,
)

# Accented names, all within Latin-1 (the core PDF fonts' range).
FIRST_INTL = ["Zoë", "José", "Søren", "Agnès", "Jürgen", "Björn", "Inés", "Fátima", "Noémie",
              "Åsa", "Chloé", "Raúl"]  # fmt: skip
LAST_INTL = ["Müller", "Peña", "Ødegård", "Lefèvre", "Gonçalves", "Þórsson", "Sánchez",
             "Öztürk", "Hernández", "Brontë", "Nuñez", "Ångström"]  # fmt: skip
SEEN_LAYOUTS = ("two_column", "table_only", "scan", "long")
HELD_OUT_LAYOUTS = ("held_out_header", "held_out_table", "held_out_phrasing")
LAYOUTS = SEEN_LAYOUTS + HELD_OUT_LAYOUTS
DEFAULT_PER_LAYOUT = 2
# The long papers: this many pages of supplement come before the participants section.
LONG_FILLER_PAGES = 42
SCAN_DPI = 200


@dataclasses.dataclass(frozen=True, slots=True)
class HardPaper:
    paper: Paper
    layout: str
    parts: list[Block]

    @property
    def held_out(self) -> bool:
        return self.layout in HELD_OUT_LAYOUTS


def _names(rng: random.Random) -> list[str]:
    count = rng.randint(2, 5)
    firsts = rng.sample(FIRST_INTL, count)
    lasts = rng.sample(LAST_INTL, count)
    return [f"{f} {last}" for f, last in zip(firsts, lasts, strict=True)]


def _replace(parts: list[Block], starts: str, block: Block) -> list[Block]:
    return [block if b.text.startswith(starts) else b for b in parts]


def _insert_after(parts: list[Block], starts: str, new: list[Block]) -> list[Block]:
    at = next(i for i, b in enumerate(parts) if b.text.startswith(starts)) + 1
    return parts[:at] + new + parts[at:]


def _filler(rng: random.Random, paper: Paper, pages: int) -> list[Block]:
    """Supplement pages: tables described in prose, one heading and a few paragraphs a page."""
    out: list[Block] = []
    words = ["baseline", "follow-up", "adherence", "sensitivity", "subgroup", "missing data",
             "imputation", "protocol", "site", "visit", "adverse event", "laboratory"]  # fmt: skip
    for k in range(1, pages + 1):
        out.append(Block("pagebreak", ""))
        out.append(Block("heading", f"Supplementary Section S{k}"))
        for _ in range(4):
            topic = rng.sample(words, 3)
            out.append(
                Block(
                    "body",
                    f"This section reports {topic[0]} data by {topic[1]} for {paper.population} "
                    f"with {paper.condition}. Analyses of {topic[2]} followed the statistical "
                    "analysis plan; estimates are shown with 95% confidence intervals and were "
                    "consistent with the main analysis across every site and visit window. " * 2,
                )
            )
    return out


def hard_paper(rng: random.Random, index: int, layout: str) -> HardPaper:
    """One paper of ``layout``: its truth and its blocks."""
    base = random_paper(rng, index, "pdf")
    n = rng.randint(40, 2400)
    lacks = rng.random() < 0.25  # a paper lacking a field: "not found" is right
    paper = dataclasses.replace(
        base,
        file=f"hard-{index + 1:02d}-{layout.replace('_', '-')}.pdf",
        authors=_names(rng),
        sample_size=None if lacks and layout == "two_column" else n,
        doi=None if lacks else base.doi,
        # Methods stated without the count where the count must come from elsewhere.
        methods_style=3 if layout in ("table_only", "long", "held_out_table") else 0,
    )
    if paper.sample_size is None:
        paper = dataclasses.replace(paper, methods_style=3)
    parts = blocks(paper, rng)
    p = paper
    if layout in ("table_only", "held_out_table"):
        screened, analysed = n * 2 + rng.randint(5, 90), n - rng.randint(0, n // 10)
        rows = [["Stage", "Participants"], ["Screened", str(screened)],
                ["Randomized", str(n)], ["Analysed", str(analysed)]]  # fmt: skip
        if layout == "held_out_table":
            rows = [list(col) for col in zip(*rows, strict=True)]  # stages across, counts below
        table = Block("table", json.dumps(rows))
        parts = _insert_after(
            parts, "Results:", [Block("small", "Table 1. Flow of participants"), table]
        )
    elif layout == "long":
        participants = [
            Block("pagebreak", ""),
            Block("heading", "3 Participants"),
            Block(
                "body",
                f"Between {p.year - 4} and {p.year - 2} we randomly assigned {n} {p.population} "
                f"with {p.condition} at 14 sites; follow-up was complete for most of them.",
            ),
        ]
        refs = next(i for i, b in enumerate(parts) if b.text == "References")
        parts = parts[:refs] + _filler(rng, p, LONG_FILLER_PAGES) + participants + parts[refs:]
    elif layout == "held_out_header":
        parts = _replace(
            parts,
            p.journal,
            Block("header", f"Vol {p.volume} - No {p.issue} - {p.year} - {p.journal}"),
        )
    elif layout == "held_out_phrasing":
        parts = _replace(
            parts,
            "Methods:",
            Block(
                "body",
                f"Methods: Participants (n = {n}) with {p.condition} were randomised 1:1 to "
                f"{p.intervention} or {p.comparator}. Efficacy was judged on "
                f"{p.primary_outcome}, the main outcome measure.",
            ),
        )
    return HardPaper(paper, layout, parts)


def _write_block(pdf: FPDF, block: Block, *, width: float = 0) -> None:
    style, size, height, after = PDF_STYLES[block.kind]
    pdf.set_font("Helvetica", style, size)
    pdf.multi_cell(width, height, block.text, new_x="LMARGIN", new_y="NEXT")
    pdf.ln(after)


def _write_table(pdf: FPDF, block: Block) -> None:
    pdf.set_font("Helvetica", "", 9)
    with pdf.table(width=120, align="LEFT") as table:
        for values in json.loads(block.text):
            row = table.row()
            for value in values:
                row.cell(value)
    pdf.ln(3)


def _new_pdf() -> FPDF:
    pdf = FPDF(format="A4")
    pdf.set_creation_date(PDF_DATE)
    pdf.set_margins(20, 18, 20)
    pdf.set_auto_page_break(True, margin=18)
    pdf.add_page()
    return pdf


def render_single(parts: list[Block]) -> tuple[bytes, dict[int, int]]:
    """One column; returns the PDF and the page each block starts on."""
    pdf = _new_pdf()
    pages: dict[int, int] = {}
    for i, block in enumerate(parts):
        pages[i] = pdf.page_no()
        if block.kind == "pagebreak":
            pdf.add_page()
        elif block.kind == "table":
            _write_table(pdf, block)
        else:
            _write_block(pdf, block)
    return bytes(pdf.output()), pages


def render_two_column(parts: list[Block]) -> bytes:
    """Front matter across the page, then everything from the abstract on in two columns."""
    pdf = _new_pdf()
    body_from = next(i for i, b in enumerate(parts) if b.text == "Abstract")
    for block in parts[:body_from]:
        _write_block(pdf, block)
    columns = pdf.text_columns(ncols=2, gutter=8)
    with columns:
        for block in parts[body_from:]:
            style, size, _, after = PDF_STYLES[block.kind]
            pdf.set_font("Helvetica", style, size)
            columns.write(text=block.text + "\n")
            columns.ln(after + 2)
    return bytes(pdf.output())


def render_scan(parts: list[Block]) -> bytes:
    """The single-column PDF printed and scanned: each page an image, no text layer."""
    clean, _ = render_single(parts)
    document = pypdfium2.PdfDocument(clean)
    pdf = FPDF(format="A4")
    pdf.set_creation_date(PDF_DATE)
    pdf.set_margins(0, 0, 0)
    pdf.set_auto_page_break(False)
    try:
        for index in range(len(document)):
            image = document[index].render(scale=SCAN_DPI / 72, grayscale=True).to_pil()
            png = io.BytesIO()
            image.save(png, format="PNG", optimize=True)
            pdf.add_page()
            pdf.image(png, x=0, y=0, w=pdf.w, h=pdf.h)
    finally:
        document.close()
    return bytes(pdf.output())


def render_hard(hard: HardPaper) -> tuple[bytes, int | None]:
    """The PDF of ``hard``, and the page its participant count is stated on (long papers)."""
    if hard.layout == "two_column":
        return render_two_column(hard.parts), None
    if hard.layout == "scan":
        return render_scan(hard.parts), None
    content, pages = render_single(hard.parts)
    stated = next((pages[i] for i, b in enumerate(hard.parts) if b.text == "3 Participants"), None)
    return content, stated


def make_hard_papers(
    per_layout: int = DEFAULT_PER_LAYOUT, seed: int = DEFAULT_SEED
) -> list[HardPaper]:
    rng = random.Random(seed + 7)
    papers: list[HardPaper] = []
    for layout in LAYOUTS:
        for _ in range(per_layout):
            papers.append(hard_paper(rng, len(papers), layout))
    return papers


def write_hard_corpus(
    folder: Path, *, per_layout: int = DEFAULT_PER_LAYOUT, seed: int = DEFAULT_SEED
) -> list[Path]:
    """Write the hard papers and ``key.json`` into ``folder``; return their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    entries: list[dict[str, Any]] = []
    written: list[Path] = []
    for hard in make_hard_papers(per_layout, seed):
        content, stated_on = render_hard(hard)
        path = folder / hard.paper.file
        path.write_bytes(content)
        written.append(path)
        entry: dict[str, Any] = {
            "file": hard.paper.file,
            "sha256": hashlib.sha256(content).hexdigest(),
            "expected": "completed",
            "layout": hard.layout,
            "held_out": hard.held_out,
            "fields": hard.paper.truth(),
        }
        if stated_on is not None:
            entry["sample_size_page"] = stated_on
        entries.append(entry)
    key = {"generator": GENERATOR_VERSION, "seed": seed, "hard": True, "documents": entries}
    (folder / KEY_FILE).write_text(json.dumps(key, indent=1, ensure_ascii=False) + "\n")
    return written


__all__ = [
    "HELD_OUT_LAYOUTS",
    "LAYOUTS",
    "SEEN_LAYOUTS",
    "HardPaper",
    "hard_paper",
    "make_hard_papers",
    "render_hard",
    "write_hard_corpus",
]
