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

import itertools
import re
import statistics
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pdfminer.layout import LTChar, LTContainer, LTCurve

from shoal_extract.furniture import banded_signatures, is_furniture
from shoal_extract.pdf_words import Resolver, page_words_from_chars

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
# A gap wider than this many font sizes between two words of a row is a column gap.
SEGMENT_GAP = 0.8
SEGMENT_RATIO = 2.5
# Rows that must part at one x for it to be a gutter of the page.
MIN_GUTTER_ROWS = 3
# Columns within columns: a margin column beside two body columns needs two levels.
MAX_COLUMN_DEPTH = 3
# A page whose characters are mostly rotated is set sideways and read in their frame.
SIDEWAYS_SHARE = 0.6
# A ruled table covers at most this share of its page; a larger frame is a page border.
MAX_TABLE_AREA = 0.7
# A line ending in a hyphen after a word (group 1: the word's letters; group 2: the hyphen).
_LINE_END_HYPHEN = re.compile(r"(\w+)([-\u00ad\u2010])$")


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
    # (start, end) offsets in ``markdown`` of the page furniture: running headers and
    # footers, page numbers, stamps, rotated margin lines. It is kept, after the body.
    furniture: tuple[tuple[int, int], ...] = ()


def _rows(words: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Words grouped into rows by their top edge."""
    rows: list[list[dict[str, Any]]] = []
    for word in sorted(words, key=lambda w: (round(float(w["top"]), 1), float(w["x0"]))):
        if rows and abs(float(rows[-1][0]["top"]) - float(word["top"])) <= LINE_TOLERANCE:
            rows[-1].append(word)
        else:
            rows.append([word])
    return rows


def _segments(
    row: list[dict[str, Any]], gutters: Sequence[float] = ()
) -> list[list[dict[str, Any]]]:
    """A row's words cut where a gap is wider than any word space: columns and margin
    columns often share their baselines, and a row across them is not one line.

    A column gap is wider than ``SEGMENT_GAP`` font sizes and than ``SEGMENT_RATIO``
    times the row's usual gap (a justified title spreads all its gaps alike), or is
    any gap of ``MIN_GUTTER`` points over one of the page's ``gutters``.
    """
    row.sort(key=lambda w: float(w["x0"]))
    gaps = [float(b["x0"]) - float(a["x1"]) for a, b in itertools.pairwise(row)]
    usual = statistics.median(gaps) if len(gaps) >= 3 else 0.0
    segments = [[row[0]]]
    for word, gap in zip(row[1:], gaps, strict=True):
        size = max(float(segments[-1][-1]["size"]), float(word["size"]))
        left, right = float(segments[-1][-1]["x1"]), float(word["x0"])
        wide = gap > max(SEGMENT_GAP * size, MIN_GUTTER, SEGMENT_RATIO * usual)
        if wide or (gap >= MIN_GUTTER and any(left < x < right for x in gutters)):
            segments.append([word])
        else:
            segments[-1].append(word)
    return segments


def _page_gutters(rows: list[list[dict[str, Any]]]) -> list[float]:
    """The x of column gaps that rows cut by the strict rule agree on (``MIN_GUTTER_ROWS``
    of them): where the columns of the page part, so a row justified wide is cut there too."""
    middles: Counter[int] = Counter()
    for row in rows:
        segments = _segments(row)
        for a, b in itertools.pairwise(segments):
            middles[round((float(a[-1]["x1"]) + float(b[0]["x0"])) / 2 / 4)] += 1
    return [key * 4.0 for key, n in middles.items() if n >= MIN_GUTTER_ROWS]


def _lines(words: list[dict[str, Any]]) -> list[Line]:
    """Words grouped into lines by their top edge (a row cut at column gaps), left to right."""
    lines = []
    rows = _rows(words)
    gutters = _page_gutters(rows)
    for row in rows:
        for seg in _segments(row, gutters):
            sizes = Counter(round(float(w["size"]), 1) for w in seg)
            lines.append(
                Line(
                    top=min(float(w["top"]) for w in seg),
                    bottom=max(float(w["bottom"]) for w in seg),
                    x0=float(seg[0]["x0"]),
                    x1=max(float(w["x1"]) for w in seg),
                    text=" ".join(str(w["text"]) for w in seg),
                    size=sizes.most_common(1)[0][0],
                    bold=all("bold" in str(w.get("fontname", "")).lower() for w in seg),
                )
            )
    return lines


def _gutter(lines: list[Line]) -> float | None:
    """The x that fewest lines cross with ``MIN_COLUMN_LINES`` lines wholly on each side
    (the middle-most of equals), or None."""
    if len(lines) < 2 * MIN_COLUMN_LINES:
        return None
    lo, hi = min(ln.x0 for ln in lines), max(ln.x1 for ln in lines)
    middle = (lo + hi) / 2
    best: tuple[int, float, float] | None = None
    x = lo + MIN_GUTTER
    while x <= hi - MIN_GUTTER:
        left = sum(1 for ln in lines if ln.x1 <= x)
        right = sum(1 for ln in lines if ln.x0 >= x)
        if left >= MIN_COLUMN_LINES and right >= MIN_COLUMN_LINES:
            crossing = len(lines) - left - right
            key = (crossing, abs(x - middle), x)
            if best is None or key < best:
                best = key
        x += 2.0
    return None if best is None else best[2]


def _ordered(lines: list[Line], depth: int = 0) -> list[list[Line]]:
    """Lines as reading-order runs: full-width bands, and columns left then right.

    A column is ordered the same way in turn, so a margin column beside two body
    columns is a run of its own, never read line by line into its neighbour.
    """
    gutter = _gutter(lines) if depth < MAX_COLUMN_DEPTH else None
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
            runs.extend(_ordered(left, depth + 1))
            runs.extend(_ordered(right, depth + 1))
        else:
            flow.extend(sorted(band, key=lambda ln: (ln.top, ln.x0)))
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
    height: float = 0.0

    def sizes(self) -> Counter[float]:
        """Characters per font size: the document's body size is the most common."""
        sizes: Counter[float] = Counter()
        for w in self.words:
            sizes[round(float(w["size"]), 1)] += len(str(w["text"]))
        return sizes


def page_words(page: Any, *, resolve: Resolver | None = None) -> PageWords:
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
            words=page_words_from_chars(chars, resolve=resolve),
            tables=[],
            width=float(page.width),
            chars=sum(1 for c in chars if not str(c["text"]).isspace()),
            height=float(page.height),
        )
    tables = [t for t in page.find_tables() if len(t.rows) >= 2 and _is_table_box(t.bbox, page)]
    words = page_words_from_chars(page.chars, resolve=resolve)
    placed: set[int] = set()  # ids of the words a kept table's cells hold
    cells = []
    for table in tables:
        rows, used = _cells(table, words, placed)
        # Fewer than two rows with text is no table (page_layout leaves it out): its
        # words stay text.
        if sum(1 for r in rows if any(c and c.strip() for c in r)) >= 2:
            cells.append((table.bbox, rows))
            placed |= used
    return PageWords(
        # A word inside a table's frame but in none of its cells stays text.
        words=[w for w in words if id(w) not in placed],
        tables=cells,
        width=float(page.width),
        chars=sum(1 for c in page.chars if not str(c["text"]).isspace()),
        height=float(page.height),
    )


def _inside(word: dict[str, Any], box: tuple[float, float, float, float]) -> bool:
    cx = (float(word["x0"]) + float(word["x1"])) / 2
    cy = (float(word["top"]) + float(word["bottom"])) / 2
    return box[0] <= cx <= box[2] and box[1] <= cy <= box[3]


def _cells(
    table: Any, words: list[dict[str, Any]], taken: set[int]
) -> tuple[list[list[str | None]], set[int]]:
    """The table's cells filled with the page's words not ``taken`` (the same word
    grouping as the text), each cell's words in rows, top to bottom; and the ids of
    the words used."""
    rows: list[list[str | None]] = []
    used: set[int] = set()
    for row in table.rows:
        texts: list[str | None] = []
        for cell in row.cells:
            if cell is None:
                texts.append(None)
                continue
            inside = [
                w for w in words if id(w) not in taken and id(w) not in used and _inside(w, cell)
            ]
            used.update(id(w) for w in inside)
            texts.append(
                " ".join(
                    " ".join(str(w["text"]) for w in sorted(r, key=lambda w: float(w["x0"])))
                    for r in _rows(inside)
                )
            )
        rows.append(texts)
    return rows, used


def _is_table_box(bbox: tuple[float, float, float, float], page: Any) -> bool:
    """A ruled table lies on the page and leaves room beside it: a frame drawn round the
    whole page (or past its edges) is a border, and its "cells" would swallow the text."""
    x0, top, x1, bottom = bbox
    width, height = float(page.width), float(page.height)
    inside = x0 >= -2 and top >= -2 and x1 <= width + 2 and bottom <= height + 2
    return inside and (x1 - x0) * (bottom - top) <= MAX_TABLE_AREA * width * height


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
                    "matrix": obj.matrix,
                }
            )
        elif isinstance(obj, LTCurve):
            return None  # lines, rectangles and curves: a ruled table may be there
        elif isinstance(obj, LTContainer):
            stack.extend(reversed(obj._objs))
    return chars


def page_signatures(page: PageWords) -> set[tuple[str, str]]:
    """The page's lines in its top and bottom bands, for :func:`furniture.running_lines`."""
    return banded_signatures(_rows([w for w in page.words if w["upright"]]), page.height)


def _split_furniture(
    page: PageWords, running: frozenset[tuple[str, str]]
) -> tuple[list[dict[str, Any]], list[str]]:
    """The page's body words, and its furniture lines' texts (rotated ones last).

    A page whose text is mostly rotated is set sideways (a landscape table): its
    rotated words are the body, read in their own frame, and the few horizontal
    lines (a running header, the page number) its furniture.
    """
    body: list[dict[str, Any]] = []
    furniture: list[str] = []
    rotated = [w for w in page.words if not w["upright"]]
    rotated_chars = sum(len(str(w["text"])) for w in rotated)
    if rotated_chars > SIDEWAYS_SHARE * sum(len(str(w["text"])) for w in page.words):
        for row in _rows([w for w in page.words if w["upright"]]):
            row.sort(key=lambda w: float(w["x0"]))
            furniture.append(" ".join(str(w["text"]) for w in row))
        turned = [w for w in rotated if "frame" in w]
        for word in turned:
            x0, x1, top, bottom = word["frame"]
            body.append({**word, "x0": x0, "x1": x1, "top": top, "bottom": bottom})
        return body, furniture
    for row in _rows([w for w in page.words if w["upright"]]):
        if is_furniture(row, page.height, running):
            row.sort(key=lambda w: float(w["x0"]))
            furniture.append(" ".join(str(w["text"]) for w in row))
        else:
            body.extend(row)
    # Rotated words in the order they are drawn (along their own line), a new line
    # where one moves across to another column of the margin.
    lines: list[list[dict[str, Any]]] = []
    for word in (w for w in page.words if not w["upright"]):
        if lines and abs(float(lines[-1][-1]["x0"]) - float(word["x0"])) <= float(word["size"]):
            lines[-1].append(word)
        else:
            lines.append([word])
    furniture.extend(" ".join(str(w["text"]) for w in line) for line in lines)
    return body, furniture


def _joined(para: list[Line]) -> list[str]:
    """The paragraph's lines, a word hyphenated at a line's end joined on the first line.

    ``inter-`` + ``action`` gives ``interaction``; a hyphen before a digit is kept
    (``bmjopen-2016-`` + ``012335``: a DOI or an identifier, joined whole).
    """
    texts = [ln.text for ln in para]
    for i in range(len(texts) - 1):
        match = _LINE_END_HYPHEN.search(texts[i])
        if not match or not texts[i + 1]:
            continue
        head, _, rest = texts[i + 1].partition(" ")
        if head[0].islower() and match.group(1).isalpha():
            texts[i] = texts[i][: match.start(2)] + head
        elif head[0].isdigit() or head[0].islower():
            texts[i] = texts[i][: match.end(2)] + head
        else:
            continue
        texts[i + 1] = rest
    return [t for t in texts if t]


def page_layout(
    page: PageWords,
    *,
    body: float,
    first: bool,
    running: frozenset[tuple[str, str]] = frozenset(),
) -> PageLayout:
    """The Markdown of one page; ``body`` is the document's body font size.

    ``running`` holds the document's running lines (:func:`furniture.running_lines`
    over every page's :func:`page_signatures`): those, page numbers and rotated
    lines are furniture, set after the body and listed in ``PageLayout.furniture``.
    """
    words, furniture = _split_furniture(page, running)
    sizes = PageWords(words, [], page.width, 0).sizes()
    largest = max(sizes) if sizes else 0.0
    blocks: list[tuple[float, str]] = []
    largest_text: str | None = None
    for run in _ordered(_lines(words)):
        for para in _paragraphs(run):
            lines = _joined(para)
            text = " ".join(lines)
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
                blocks.append((para[0].top, "\n".join(lines)))
    # A table goes in before the first block below its top edge.
    parts = [text for _, text in blocks]
    for bbox, rows in sorted(page.tables, key=lambda t: t[0][1], reverse=True):
        kept = [r for r in rows if any(c and c.strip() for c in r)]
        if len(kept) < 2:
            continue
        at = next((i for i, (top, _) in enumerate(blocks) if top > bbox[1]), len(blocks))
        parts.insert(at, _table_markdown(kept))
    markdown = "\n\n".join(parts)
    spans = []
    for line in furniture:
        if markdown:
            markdown += "\n\n"
        spans.append((len(markdown), len(markdown) + len(line)))
        markdown += line
    return PageLayout(markdown, page.chars, largest_text, tuple(spans))


__all__ = ["PageLayout", "PageWords", "page_layout", "page_signatures", "page_words"]
