"""Document bytes to text that keeps its structure and its pages.

PDF: every page's text layer through pdfplumber (:mod:`shoal_extract.pdf_layout`:
reading order across columns, headings as ``#``/``##``, ruled tables as
Markdown tables); a page without a usable text layer (a scan) is OCRed with
Tesseract (:mod:`shoal_extract.ocr`), and only such a page. Plain text and
Markdown are read as UTF-8, one page.

The result keeps where each page starts in the text, so an extracted value
can say which page it came from. There is no silent limit: a PDF with more
pages than the operator's :class:`ParseLimits` allow (or more pages to OCR)
is refused with a :class:`ParseError` saying so, never cut short.

A file that cannot be parsed raises :class:`ParseError` carrying the
parser's own message; the worker turns it into a permanent item error.
Nothing a file contains may crash the worker: any exception the PDF
libraries raise on a damaged file becomes a ParseError.
"""

from __future__ import annotations

import bisect
import io
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import pdfplumber
import pypdfium2

from shoal_extract.furniture import running_lines
from shoal_extract.ocr import OcrUnavailable, read_page_image, render_for_ocr
from shoal_extract.pdf_layout import page_layout, page_signatures, page_words
from shoal_extract.pdf_signals import PdfSignals, read_signals
from shoal_extract.pdf_words import Resolver
from shoal_extract.pdfium_lock import PDFIUM

# Bumped whenever the same bytes would parse to different text: parsed
# output is stored per (document hash, parser version).
PARSER_VERSION = 2
# A page with fewer characters than this in its text layer is treated as a scan.
MIN_TEXT_CHARS = 20
DEFAULT_MAX_PAGES = 500
DEFAULT_MAX_OCR_PAGES = 100
PAGE_SEPARATOR = "\n\n"

# pdfminer logs a warning for every harmless oddity of a file (a missing
# CropBox, a bad font width); the errors that matter are raised.
logging.getLogger("pdfminer").setLevel(logging.ERROR)
# PDFium is not thread-safe: one lock for every use of it in the process.
_pdfium = PDFIUM


class DocumentFormat(StrEnum):
    PDF = "pdf"
    TEXT = "txt"
    MARKDOWN = "md"


EXTENSIONS: dict[str, DocumentFormat] = {
    ".pdf": DocumentFormat.PDF,
    ".txt": DocumentFormat.TEXT,
    ".md": DocumentFormat.MARKDOWN,
    ".markdown": DocumentFormat.MARKDOWN,
}


class ParseError(Exception):
    """The file cannot be turned into text; the message is the parser's."""


@dataclass(frozen=True, slots=True)
class ParseLimits:
    """What the operator allows one document to cost (``SHOAL_EXTRACT_MAX_PAGES`` etc.)."""

    max_pages: int = DEFAULT_MAX_PAGES
    max_ocr_pages: int = DEFAULT_MAX_OCR_PAGES


@dataclass(frozen=True, slots=True)
class ParsedText:
    """A document's text, pages joined by a blank line, and where each page starts."""

    text: str
    format: DocumentFormat
    page_starts: tuple[int, ...] = (0,)
    title_hint: str | None = None
    ocr_pages: tuple[int, ...] = ()  # 1-based numbers of the pages read by OCR
    # A PDF's metadata, PDFium's text of each page, its front lines (pdf_signals).
    signals: PdfSignals | None = None
    # (start, end) offsets in ``text`` of page furniture (running headers and footers,
    # page numbers, stamps, rotated margin lines): kept in the text, after each page's
    # body, so fields and chunks can leave it out. Empty for a parse made before
    # parser version 2, for text files and for OCRed pages.
    furniture: tuple[tuple[int, int], ...] = ()

    @property
    def pages(self) -> int:
        return len(self.page_starts)

    def page_at(self, offset: int) -> int:
        """The 1-based page that character ``offset`` of the text is on."""
        return max(1, bisect.bisect_right(self.page_starts, offset))

    def page_text(self, number: int) -> str:
        start = self.page_starts[number - 1]
        end = self.page_starts[number] if number < self.pages else len(self.text)
        return self.text[start:end]

    def is_furniture(self, start: int, end: int | None = None) -> bool:
        """Whether the text from ``start`` (to ``end``) lies within page furniture."""
        end = start + 1 if end is None else end
        return any(a <= start and end <= b for a, b in self.furniture)

    def as_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "format": self.format.value,
            "page_starts": list(self.page_starts),
            "title_hint": self.title_hint,
            "ocr_pages": list(self.ocr_pages),
            "signals": None if self.signals is None else self.signals.as_dict(),
            "furniture": [list(span) for span in self.furniture],
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ParsedText:
        return cls(
            text=raw["text"],
            format=DocumentFormat(raw["format"]),
            page_starts=tuple(raw["page_starts"]),
            title_hint=raw.get("title_hint"),
            ocr_pages=tuple(raw.get("ocr_pages", ())),
            signals=PdfSignals.from_dict(raw["signals"]) if raw.get("signals") else None,
            furniture=tuple((int(a), int(b)) for a, b in raw.get("furniture", ())),
        )


def join_pages(
    pages: list[str],
    fmt: DocumentFormat,
    *,
    title_hint: str | None = None,
    ocr: tuple[int, ...] = (),
    signals: PdfSignals | None = None,
    furniture: Sequence[tuple[tuple[int, int], ...]] = (),
) -> ParsedText:
    """One text of the pages; ``furniture`` holds each page's spans in its page's text."""
    if any("\x00" in page for page in pages):
        # PostgreSQL's text and jsonb cannot hold NUL, and it carries no meaning in
        # text; the spans would move with it, so a page holding one has none.
        furniture = [
            () if "\x00" in page else spans for page, spans in zip(pages, furniture, strict=True)
        ]
        pages = [page.replace("\x00", "") for page in pages]
    starts, offset = [], 0
    for page in pages:
        starts.append(offset)
        offset += len(page) + len(PAGE_SEPARATOR)
    spans = tuple(
        (start + a, start + b)
        for start, page_spans in zip(starts, furniture, strict=False)
        for a, b in page_spans
    )
    return ParsedText(
        PAGE_SEPARATOR.join(pages),
        fmt,
        tuple(starts),
        title_hint,
        ocr,
        signals=signals,
        furniture=spans,
    )


def parse_document(
    content: bytes, fmt: DocumentFormat, limits: ParseLimits | None = None
) -> ParsedText:
    """The text of a document; raises :class:`ParseError` when there is none to be had."""
    if fmt is DocumentFormat.PDF:
        return _parse_pdf(content, limits or ParseLimits())
    try:
        text = content.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ParseError(f"not UTF-8 text: {exc}") from None
    if "\x00" in text:
        raise ParseError("not text: the file contains NUL bytes")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        raise ParseError("the file holds no text")
    return ParsedText(text=text, format=fmt)


def _parse_pdf(content: bytes, limits: ParseLimits) -> ParsedText:
    if b"%PDF-" not in content[:1024]:
        raise ParseError(f"not a PDF: the file begins {content[:24]!r} (invalid pdf header)")
    texts: list[str] = []
    furniture: list[tuple[tuple[int, int], ...]] = []
    scans: list[int] = []
    title: str | None = None
    try:
        with pdfplumber.open(io.BytesIO(content)) as pdf:
            count = len(pdf.pages)
            if count > limits.max_pages:
                raise ParseError(
                    f"the PDF has {count} pages, over the limit of {limits.max_pages} "
                    "(SHOAL_EXTRACT_MAX_PAGES)"
                )
            pages = []
            with _Glyphs(content) as glyphs:
                for page in pdf.pages:
                    pages.append(page_words(page, resolve=glyphs.resolver(page)))
                    page.close()
        sizes: Counter[float] = Counter()
        for words in pages:
            sizes.update(words.sizes())
        body = sizes.most_common(1)[0][0] if sizes else 0.0
        running = running_lines([page_signatures(words) for words in pages])
        for index, words in enumerate(pages):
            if words.chars < MIN_TEXT_CHARS:
                scans.append(index)
                texts.append("")
                furniture.append(())
                continue
            layout = page_layout(words, body=body, first=index == 0, running=running)
            if index == 0:
                title = layout.largest_text
            texts.append(layout.markdown)
            furniture.append(layout.furniture)
    except ParseError:
        raise
    except Exception as exc:  # pdfminer has its own errors; a damaged file may raise anything
        cause = exc.__cause__ or exc
        raise ParseError(f"pdfminer: {type(cause).__name__}: {cause}") from None
    if not texts:
        raise ParseError("the PDF has no pages")
    if scans:
        _ocr(content, scans, texts, limits)
    if not any(t.strip() for t in texts):
        raise ParseError(
            f"the PDF has no text layer, and OCR found no text on its {len(texts)} page(s)"
        )
    return join_pages(
        texts,
        DocumentFormat.PDF,
        title_hint=title,
        ocr=tuple(i + 1 for i in scans),
        signals=read_signals(content),
        furniture=furniture,
    )


class _Glyphs:
    """PDFium's reading of a glyph pdfminer cannot map to Unicode (a ``(cid:N)``).

    The document is opened in PDFium only when the first such glyph turns up.
    """

    def __init__(self, content: bytes) -> None:
        self._content = content
        self._pdf: pypdfium2.PdfDocument | None = None
        self._pages: dict[int, Any] = {}

    def __enter__(self) -> _Glyphs:
        return self

    def __exit__(self, *_: object) -> None:
        with _pdfium:
            for textpage in self._pages.values():
                textpage.close()
            if self._pdf is not None:
                self._pdf.close()

    def resolver(self, page: Any) -> Resolver:
        index = int(page.page_number) - 1
        height = float(page.height)
        x_shift, y_shift = float(page.mediabox[0]), float(page.mediabox[1])

        def resolve(x0: float, top: float, x1: float, bottom: float) -> str | None:
            x = (x0 + x1) / 2 - x_shift + x_shift
            y = height - (top + bottom) / 2 + y_shift
            with _pdfium:
                textpage = self._textpage(index)
                at = textpage.get_index(x, y, (x1 - x0) / 2, (bottom - top) / 2)
                if at is None or at < 0:
                    return None
                text = str(textpage.get_text_range(at, 1))
            return text if text.strip() and "\ufffd" not in text else None

        return resolve

    def _textpage(self, index: int) -> Any:
        if self._pdf is None:
            self._pdf = pypdfium2.PdfDocument(self._content)
        if index not in self._pages:
            self._pages[index] = self._pdf[index].get_textpage()
        return self._pages[index]


def _ocr(content: bytes, scans: list[int], texts: list[str], limits: ParseLimits) -> None:
    """Fill ``texts`` at the ``scans`` indexes with what OCR reads there."""
    if len(scans) > limits.max_ocr_pages:
        raise ParseError(
            f"{len(scans)} pages have no text layer and need OCR, over the limit of "
            f"{limits.max_ocr_pages} (SHOAL_EXTRACT_MAX_OCR_PAGES)"
        )
    with _pdfium:
        try:
            pdf = pypdfium2.PdfDocument(content)
        except Exception as exc:
            raise ParseError(f"pdfium: {type(exc).__name__}: {exc}") from None
    try:
        for index in scans:
            # Only the rendering needs PDFium: Tesseract reads the page with
            # the lock free for other threads' parses and page views.
            with _pdfium:
                page = pdf[index]
                try:
                    image = render_for_ocr(page)
                finally:
                    page.close()
            try:
                texts[index] = read_page_image(image)
            except OcrUnavailable as exc:
                raise ParseError(
                    f"page {index + 1} has no text layer and needs OCR, but {exc}"
                ) from None
    finally:
        with _pdfium:
            pdf.close()


__all__ = [
    "DEFAULT_MAX_OCR_PAGES",
    "DEFAULT_MAX_PAGES",
    "EXTENSIONS",
    "PARSER_VERSION",
    "DocumentFormat",
    "ParseError",
    "ParseLimits",
    "ParsedText",
    "join_pages",
    "parse_document",
]
