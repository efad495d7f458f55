"""A stored PDF's page as the reviewer sees it: the page rendered, the quoted passage boxed.

The workbench shows a value's evidence on its page, so a reviewer checks the
value without opening the PDF. PDFium renders the page (:func:`render_page`,
a PNG) and gives the boxes of the quote's characters (:func:`quote_boxes`).

The quote is looked for in PDFium's text of the page, the same text the
evidence was verified against (``evidence.py``), compared the same way:
NFKC, case folded, whitespace and hyphens (a word broken at a line end,
PDFium's hyphenation marks) set aside. A quote that is not there gives no
boxes; the page says so, as the evidence's flag does. Boxes are one per line
of the passage, in page-relative coordinates (0..1, from the page's top
left), so the page draws them over the image at any size.

>>> png = render_page(content, 1, scale=1.5)                        # doctest: +SKIP
>>> quote_boxes(content, 1, "randomised 240 adults").boxes           # doctest: +SKIP
(Box(x=0.118, y=0.301, width=0.402, height=0.014),)
"""

from __future__ import annotations

import ctypes
import io
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pypdfium2
import pypdfium2.raw as pdfium_c

from shoal import InvalidInput, NotFound
from shoal_extract.pdfium_lock import PDFIUM

# What the page route draws at: 1.5 is ~108 dpi, legible on a laptop screen.
DEFAULT_SCALE = 1.5
# A4 at 4 is 2380 x 3368 pixels (~32 MB as RGB while rendered): enough to read a
# footnote, and a bound on what one request can make the server allocate.
MIN_SCALE, MAX_SCALE = 0.25, 4.0
# A page larger than A0 at the top scale is refused rather than rendered.
MAX_PIXELS = 60_000_000
# Characters PDFium's text and the quote both drop before comparing (as evidence.py).
_HYPHENS = frozenset("-\u00ad\u2010\u2011\ufffe\x02")
# Two characters are on one line of the passage when their vertical centres
# are closer than this share of the line's height.
SAME_LINE = 0.5

# PDFium is not thread-safe: one lock for every use of it in the process.
_pdfium = PDFIUM


@dataclass(frozen=True, slots=True)
class Box:
    """A rectangle on the page, as shares of its width and height from the top left."""

    x: float
    y: float
    width: float
    height: float

    def as_dict(self) -> dict[str, float]:
        return {
            "x": round(self.x, 5),
            "y": round(self.y, 5),
            "width": round(self.width, 5),
            "height": round(self.height, 5),
        }


@dataclass(frozen=True, slots=True)
class Highlight:
    """Where a quote is on a page: its boxes (none when it is not there)."""

    page: int
    pages: int
    width_pt: float
    height_pt: float
    boxes: tuple[Box, ...]

    @property
    def found(self) -> bool:
        return bool(self.boxes)

    def as_dict(self) -> dict[str, Any]:
        return {
            "page": self.page,
            "pages": self.pages,
            "width_pt": round(self.width_pt, 2),
            "height_pt": round(self.height_pt, 2),
            "found": self.found,
            "boxes": [b.as_dict() for b in self.boxes],
        }


@contextmanager
def _open_page(content: bytes, number: int) -> Iterator[tuple[Any, int]]:
    """Page ``number`` (1-based) of the PDF and its page count, under the PDFium lock."""
    with _pdfium:
        try:
            pdf = pypdfium2.PdfDocument(content)
        except Exception as exc:  # PdfiumError, or whatever a damaged file raises
            raise InvalidInput("document", f"PDFium cannot open it: {exc}") from None
        try:
            count = len(pdf)
            if not 1 <= number <= count:
                raise NotFound(f"page {number}: the document has pages 1-{count}", field="page")
            page = pdf[number - 1]
            try:
                yield page, count
            finally:
                page.close()
        finally:
            pdf.close()


def render_page(content: bytes, number: int, *, scale: float = DEFAULT_SCALE) -> bytes:
    """Page ``number`` of the PDF ``content`` as a PNG, ``scale`` pixels per point.

    Raises NotFound for a page the document does not have, InvalidInput for a
    scale out of bounds or a file PDFium cannot open.
    """
    if not MIN_SCALE <= scale <= MAX_SCALE:
        raise InvalidInput("scale", f"must be {MIN_SCALE}-{MAX_SCALE}, got {scale!r:.20}")
    with _open_page(content, number) as (page, _):
        width, height = page.get_size()
        if width * height * scale * scale > MAX_PIXELS:
            raise InvalidInput(
                "scale",
                f"page {number} is {width:.0f} x {height:.0f} pt: at {scale} it would be "
                f"over {MAX_PIXELS} pixels; ask for a smaller scale",
            )
        image = page.render(scale=scale).to_pil()
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=False)
    return out.getvalue()


def quote_boxes(content: bytes, number: int, quote: str) -> Highlight:
    """The boxes of ``quote`` on page ``number``, one per line it spans; none if absent."""
    needle = "".join(_comparable(quote))
    with _open_page(content, number) as (page, count):
        width, height = page.get_size()
        text_page = page.get_textpage()
        try:
            chars = _page_chars(text_page)
            flat = "".join(c for c, _ in chars)
            at = flat.find(needle) if needle else -1
            hit = [] if at < 0 else [i for _, i in chars[at : at + len(needle)]]
            rects = [_char_rect(text_page, i) for i in hit]
        finally:
            text_page.close()
        lines = _merge_lines([r for r in rects if r is not None])
        boxes = tuple(_on_display(page, line) for line in lines)
    return Highlight(number, count, float(width), float(height), boxes)


# The device PDFium maps page points onto, to share the page: its /Rotate and
# crop box are applied as when it renders, and 1e5 units keep 5 decimals.
_DEVICE = 100_000


def _on_display(page: Any, rect: Rect) -> Box:
    """A rectangle in page points as the rendered page shows it, in shares of the page."""
    left, bottom, right, top = rect
    xs: list[int] = []
    ys: list[int] = []
    for px, py in ((left, top), (right, bottom)):
        x, y = ctypes.c_int(), ctypes.c_int()
        pdfium_c.FPDF_PageToDevice(
            page.raw, 0, 0, _DEVICE, _DEVICE, 0, px, py, ctypes.byref(x), ctypes.byref(y)
        )
        xs.append(x.value)
        ys.append(y.value)
    return Box(
        x=min(xs) / _DEVICE,
        y=min(ys) / _DEVICE,
        width=abs(xs[1] - xs[0]) / _DEVICE,
        height=abs(ys[1] - ys[0]) / _DEVICE,
    )


def _comparable(text: str) -> Iterator[str]:
    """The characters of ``text`` as compared: NFKC, case folded, no spaces or hyphens."""
    for char in text:
        for out in unicodedata.normalize("NFKC", char).casefold():
            if not out.isspace() and out not in _HYPHENS:
                yield out


def _page_chars(text_page: Any) -> list[tuple[str, int]]:
    """PDFium's characters of the page as compared, each with the index it came from."""
    chars: list[tuple[str, int]] = []
    for i in range(pdfium_c.FPDFText_CountChars(text_page.raw)):
        char = chr(pdfium_c.FPDFText_GetUnicode(text_page.raw, i))
        chars.extend((out, i) for out in _comparable(char))
    return chars


Rect = tuple[float, float, float, float]  # left, bottom, right, top in PDF points


def _char_rect(text_page: Any, index: int) -> Rect | None:
    """A character's box in PDF points, or None for one PDFium generated (no box)."""
    box = pdfium_c.FS_RECTF()
    if not pdfium_c.FPDFText_GetLooseCharBox(text_page.raw, index, ctypes.byref(box)):
        return None
    if box.right <= box.left or box.top <= box.bottom:
        return None
    return (box.left, box.bottom, box.right, box.top)


def _merge_lines(rects: list[Rect]) -> list[Rect]:
    """Consecutive character boxes joined into one box per line of text."""
    lines: list[Rect] = []
    for left, bottom, right, top in rects:
        if lines:
            l0, b0, r0, t0 = lines[-1]
            middle, height = (bottom + top) / 2, max(t0 - b0, top - bottom)
            if abs(middle - (b0 + t0) / 2) < SAME_LINE * height and left >= l0 - height:
                lines[-1] = (min(l0, left), min(b0, bottom), max(r0, right), max(t0, top))
                continue
        lines.append((left, bottom, right, top))
    return lines


__all__ = [
    "DEFAULT_SCALE",
    "MAX_SCALE",
    "MIN_SCALE",
    "Box",
    "Highlight",
    "quote_boxes",
    "render_page",
]
