"""The parse reads the layout habits of real papers, on small PDFs written here.

Each PDF sets one habit at exact positions (fpdf2, the corpus generators'
library): tight word spacing, a running header and page numbers, a margin
column sharing the body's baselines, a hyphenated line end, a superscript
reference marker.
"""

from __future__ import annotations

from fpdf import FPDF

from shoal_extract.chunking import chunk_document
from shoal_extract.parsing import DocumentFormat, ParsedText, parse_document

BODY = [
    "Background and aims of the study were set out before any data were seen",
    "by the trial's steering committee, and the protocol was published ahead",
    "of recruitment so that readers can compare what was planned with what",
    "was done, which is the point of registering a trial in the first place.",
]


def _pdf() -> FPDF:
    pdf = FPDF(unit="pt", format="A4")
    pdf.set_auto_page_break(False)
    pdf.set_font("Helvetica", size=10)
    return pdf


def _words(pdf: FPDF, x: float, y: float, words: list[str], *, gap: float) -> None:
    """Each word placed on its own, ``gap`` points apart: the spacing a typesetter chose."""
    for word in words:
        pdf.text(x, y, word)
        x += pdf.get_string_width(word) + gap


def _parse(pdf: FPDF) -> ParsedText:
    return parse_document(bytes(pdf.output()), DocumentFormat.PDF)


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_tightly_set_words_come_apart() -> None:
    pdf = _pdf()
    pdf.add_page()
    pdf.set_font("Helvetica", size=9)
    # A word space of 1.6 pt at 9 pt (0.18 em): tight, and common in author lines.
    authors = "Doug Downey, Stefan Schoenmackers, and Oren Etzioni"
    _words(pdf, 60, 100, authors.split(" "), gap=1.6)
    for i, line in enumerate(BODY):
        _words(pdf, 60, 130 + 12 * i, line.split(), gap=1.8)
    text = _flat(_parse(pdf).text)
    assert "Doug Downey, Stefan Schoenmackers, and Oren Etzioni" in text
    assert _flat(" ".join(BODY)) in text


def test_a_running_header_and_page_numbers_are_furniture() -> None:
    pdf = _pdf()
    for page in range(1, 4):
        pdf.add_page()
        pdf.set_font("Helvetica", size=8)
        pdf.text(60, 40, "JOURNAL OF LAYOUT HABITS  Vol 7, 2024")
        pdf.text(290, 810, str(page))
        pdf.set_font("Helvetica", size=16 if page == 1 else 10)
        pdf.text(60, 120, "A Study of Margins" if page == 1 else f"Section {page}")
        pdf.set_font("Helvetica", size=10)
        for i, line in enumerate(BODY):
            pdf.text(60, 160 + 14 * i, line)
    parsed = _parse(pdf)
    furniture = [parsed.text[a:b] for a, b in parsed.furniture]
    assert furniture.count("JOURNAL OF LAYOUT HABITS Vol 7, 2024") == 3
    assert {"1", "2", "3"} <= set(furniture), "page numbers"
    assert parsed.title_hint == "A Study of Margins"
    # The header is kept after each page's body, and no chunk carries it.
    assert parsed.page_text(1).startswith("# A Study of Margins")
    assert not any("LAYOUT HABITS" in chunk.text for chunk in chunk_document(parsed))
    # The marks are stored with the parse; one stored before them reads as none.
    assert ParsedText.from_dict(parsed.as_dict()) == parsed
    old = {k: v for k, v in parsed.as_dict().items() if k != "furniture"}
    assert ParsedText.from_dict(old).furniture == ()


def test_a_margin_column_is_kept_apart_from_the_body() -> None:
    pdf = _pdf()
    pdf.add_page()
    margin = ["Department of", "Medicine,", "Birmingham, UK", "Correspondence", "to: A Author"]
    for i, line in enumerate(BODY * 2):
        y = 100 + 13 * i
        pdf.text(170, y, line)  # the body column, 170 pt from the left
        if i < len(margin):
            pdf.text(40, y, margin[i])  # the margin column, on the body's baselines
    text = _flat(_parse(pdf).text)
    assert _flat(" ".join(BODY)) in text, "the body reads on, line after line"
    assert "Department of Medicine, Birmingham, UK" in text


def test_a_word_hyphenated_at_a_line_end_is_joined() -> None:
    pdf = _pdf()
    pdf.add_page()
    lines = [
        "The trial measured the drug-drug inter-",
        "action in adults, registered as bmjopen-2016-",
        "012335 before the first patient was seen.",
    ]
    for i, line in enumerate(lines):
        pdf.text(60, 100 + 13 * i, line)
    text = _flat(_parse(pdf).text)
    assert "the drug-drug interaction in adults" in text
    assert "bmjopen-2016-012335 before" in text


def test_a_superscript_marker_stays_out_of_the_sentence() -> None:
    pdf = _pdf()
    pdf.add_page()
    x = 60.0
    for piece, size, rise in (
        ("Eye protection was proposed more than 100 years ago", 10, 0.0),
        ("1", 6.5, 4.0),
        (" but has received little attention since.", 10, 0.0),
    ):
        pdf.set_font("Helvetica", size=size)
        pdf.text(x, 100 - rise, piece)
        x += pdf.get_string_width(piece)
    text = _flat(_parse(pdf).text)
    assert "more than 100 years ago\u00b9 but has received" in text
    assert " 1 " not in text
