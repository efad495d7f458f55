"""One PDF page's text layer as Markdown, in reading order, with pdfplumber.

pdfplumber (MIT, on pdfminer.six) gives every word with its box, font and
size. From those this module rebuilds what plain text extraction loses:

- **Reading order across columns.** A page is cut into horizontal bands; a
  band whose lines leave a vertical gutter free (no word crosses it, text on
  both sides) is read left column first, then right. A line that crosses the
  gutter (a title, a figure caption set full width) starts a new band, so a
  full-width header above two columns stays on top.
- **Headings.** A short paragraph set in bold, or clearly larger than the
  document's body text (its most common font size), becomes ``## heading``
  (``#`` for the largest text on the first page, the title).
- **Tables.** Ruled tables pdfplumber finds become Markdown tables, placed
  where they stand on the page; their words are not repeated as text.

Paragraphs are separated by a blank line when the vertical gap between two
lines is larger than a line's usual spacing.
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from dataclasses import dataclass
from typing import Any

from pdfminer.layout import LTChar, LTContainer, LTCurve
from pdfplumber.utils.text import WordExtractor

# A paragraph ends where the gap to the next line exceeds this share of the font size.
PARAGRAPH_GAP = 0.7
# Words whose tops differ by less than this (points) are on one line.
LINE_TOLERANCE = 2.5
# Larger than the body by this ratio: a heading even when not bold.
HEADING_RATIO = 1.15
TITLE_RATIO = 1.3
MAX_HEADING_WORDS = 30
# A two-column band needs this many lines on each side of the gutter.
MIN_COLUMN_LINES = 3
# The narrowest gap between columns (points) that counts as a gutter.
MIN_GUTTER = 6.0


@dataclass(frozen=True, slots=True)
class Line:
    top: float
    bottom: float
    x0: float
    x1: float
    text: str
    size: float
    bold: bool


@dataclass(frozen=True, slots=True)
class PageLayout:
    """One page's Markdown and the text set in its largest font (a title candidate)."""

    markdown: str
    chars: int  # non-space characters of the text layer
    largest_text: str | None


def _lines(words: list[dict[str, Any]]) -> list[Line]:
    """Words grouped into lines by their top edge, each line's words left to right."""
    rows: list[list[dict[str, Any]]] = []
    for word in sorted(words, key=lambda w: (round(float(w["top"]), 1), float(w["x0"]))):
        if rows and abs(float(rows[-1][0]["top"]) - float(word["top"])) <= LINE_TOLERANCE:
            rows[-1].append(word)
        else:
            rows.append([word])
    lines = []
    for row in rows:
        row.sort(key=lambda w: float(w["x0"]))
        sizes = Counter(round(float(w["size"]), 1) for w in row)
        lines.append(
            Line(
                top=min(float(w["top"]) for w in row),
                bottom=max(float(w["bottom"]) for w in row),
                x0=float(row[0]["x0"]),
                x1=max(float(w["x1"]) for w in row),
                text=" ".join(str(w["text"]) for w in row),
                size=sizes.most_common(1)[0][0],
                bold=all("bold" in str(w.get("fontname", "")).lower() for w in row),
            )
        )
    return lines


def _gutter(words: list[dict[str, Any]], width: float) -> float | None:
    """An x between the page's middle thirds that no line of two columns crosses."""
    best: tuple[int, float] | None = None
    x = width * 0.3
    while x <= width * 0.7:
        crossing = sum(1 for w in words if float(w["x0"]) < x < float(w["x1"]))
        if best is None or crossing < best[0]:
            best = (crossing, x)
        x += 2.0
    if best is None:
        return None
    return best[1]


def _ordered(words: list[dict[str, Any]], width: float) -> list[list[Line]]:
    """The page's lines as reading-order runs: full-width bands, and columns left then right."""
    lines = _lines(words)
    gutter = _gutter(words, width)
    if gutter is None:
        return [lines]
    runs: list[list[Line]] = []
    flow: list[Line] = []  # lines read top to bottom: full width, or one column alone
    band: list[Line] = []  # lines since the last full-width one, none crossing the gutter

    def close_band() -> None:
        left = [ln for ln in band if ln.x1 <= gutter]
        right = [ln for ln in band if ln.x0 >= gutter]
        gap = min((ln.x0 for ln in right), default=gutter) - max(
            (ln.x1 for ln in left), default=gutter
        )
        if len(left) >= MIN_COLUMN_LINES and len(right) >= MIN_COLUMN_LINES and gap >= MIN_GUTTER:
            if flow:
                runs.append(flow[:])
                flow.clear()
            runs.append(left)
            runs.append(right)
        else:
            flow.extend(band)
        band.clear()

    for line in lines:
        if line.x0 < gutter < line.x1:
            close_band()
            flow.append(line)
        else:
            band.append(line)
    close_band()
    if flow:
        runs.append(flow)
    return runs


def _paragraphs(run: list[Line]) -> list[list[Line]]:
    paragraphs: list[list[Line]] = []
    for line in run:
        if paragraphs:
            last = paragraphs[-1][-1]
            gap = line.top - last.bottom
            same_style = (line.bold, line.size) == (last.bold, last.size)
            if gap <= PARAGRAPH_GAP * max(line.size, last.size) and same_style:
                paragraphs[-1].append(line)
                continue
        paragraphs.append([line])
    return paragraphs


def _table_markdown(rows: list[list[str | None]]) -> str:
    cells = [[" ".join((c or "").split()).replace("|", "\\|") for c in row] for row in rows]
    width = max(len(r) for r in cells)
    cells = [r + [""] * (width - len(r)) for r in cells]
    out = ["| " + " | ".join(cells[0]) + " |", "|" + " --- |" * width]
    out.extend("| " + " | ".join(r) + " |" for r in cells[1:])
    return "\n".join(out)


@dataclass(frozen=True, slots=True)
class PageWords:
    """What one page's text layer holds: words outside tables, tables, the page width."""

    words: list[dict[str, Any]]
    tables: list[tuple[tuple[float, float, float, float], list[list[str | None]]]]
    width: float
    chars: int  # non-space characters of the text layer, tables included

    def sizes(self) -> Counter[float]:
        """Characters per font size: the document's body size is the most common."""
        sizes: Counter[float] = Counter()
        for w in self.words:
            sizes[round(float(w["size"]), 1)] += len(str(w["text"]))
        return sizes


# pdfplumber's word grouping, with the two attributes the layout reads.
_WORDS = WordExtractor(extra_attrs=["size", "fontname"])


def page_words(page: Any) -> PageWords:
    """The words and ruled tables of one pdfplumber page.

    A page that draws no lines, rectangles or curves can hold no ruled table,
    and its words are grouped from pdfminer's characters directly: the same
    words pdfplumber's ``extract_words`` gives, at about a third of the cost
    (pdfplumber turns every object of the page into a dictionary of all its
    attributes first, and that is most of the time a text page takes).
    """
    chars = _plain_chars(page)
    if chars is not None:
        return PageWords(
            words=_WORDS.extract_words(chars),
            tables=[],
            width=float(page.width),
            chars=sum(1 for c in chars if not str(c["text"]).isspace()),
        )
    tables = [t for t in page.find_tables() if len(t.rows) >= 2]
    boxes = [t.bbox for t in tables]

    def outside(word: dict[str, Any]) -> bool:
        cx = (float(word["x0"]) + float(word["x1"])) / 2
        cy = (float(word["top"]) + float(word["bottom"])) / 2
        return not any(x0 <= cx <= x1 and top <= cy <= bottom for x0, top, x1, bottom in boxes)

    words = page.extract_words(extra_attrs=["size", "fontname"])
    return PageWords(
        words=[w for w in words if outside(w)],
        tables=[(t.bbox, t.extract()) for t in tables],
        width=float(page.width),
        chars=sum(len(str(w["text"]).strip()) for w in words),
    )


def _plain_chars(page: Any) -> list[dict[str, Any]] | None:
    """The page's characters as pdfplumber describes them, or None if it draws any graphics.

    The keys are the ones word grouping reads, computed as pdfplumber's
    ``Page.process_object`` does (top-down coordinates, the MediaBox offset).
    """
    x_shift, top_shift = float(page.mediabox[0]), float(page.mediabox[1])
    height, doctop = float(page.height), float(page.initial_doctop)
    norm = page.pdf.unicode_norm
    chars: list[dict[str, Any]] = []
    stack = list(reversed(page.layout._objs))
    while stack:
        obj = stack.pop()
        if isinstance(obj, LTChar):
            if not isinstance(obj.fontname, str):
                return None  # a byte-encoded font name: pdfplumber's own path decodes it
            text = obj.get_text()
            top = height - obj.y1 + top_shift
            chars.append(
                {
                    "text": text if norm is None else unicodedata.normalize(norm, text),
                    "x0": obj.x0 + x_shift,
                    "x1": obj.x1 + x_shift,
                    "top": top,
                    "bottom": height - obj.y0 + top_shift,
                    "doctop": doctop + top,
                    "upright": obj.upright,
                    "size": obj.size,
                    "fontname": obj.fontname,
                }
            )
        elif isinstance(obj, LTCurve):
            return None  # lines, rectangles and curves: a ruled table may be there
        elif isinstance(obj, LTContainer):
            stack.extend(reversed(obj._objs))
    return chars


def page_layout(page: PageWords, *, body: float, first: bool) -> PageLayout:
    """The Markdown of one page; ``body`` is the document's body font size."""
    sizes = page.sizes()
    largest = max(sizes) if sizes else 0.0
    blocks: list[tuple[float, str]] = []
    largest_text: str | None = None
    for run in _ordered(page.words, page.width):
        for para in _paragraphs(run):
            text = " ".join(ln.text for ln in para)
            size = para[0].size
            short = len(text.split()) <= MAX_HEADING_WORDS
            is_title = first and size == largest and largest >= body * TITLE_RATIO
            if is_title and largest_text is None:
                largest_text = text
            if short and is_title:
                blocks.append((para[0].top, f"# {text}"))
            elif short and (para[0].bold or size >= body * HEADING_RATIO) and size >= body * 0.85:
                blocks.append((para[0].top, f"## {text}"))
            else:
                blocks.append((para[0].top, "\n".join(ln.text for ln in para)))
    # A table goes in before the first block below its top edge.
    parts = [text for _, text in blocks]
    for bbox, rows in sorted(page.tables, key=lambda t: t[0][1], reverse=True):
        kept = [r for r in rows if any(c and c.strip() for c in r)]
        if len(kept) < 2:
            continue
        at = next((i for i, (top, _) in enumerate(blocks) if top > bbox[1]), len(blocks))
        parts.insert(at, _table_markdown(kept))
    return PageLayout("\n\n".join(parts), page.chars, largest_text)


__all__ = ["PageLayout", "PageWords", "page_layout", "page_words"]
