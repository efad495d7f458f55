"""Document bytes to text: PDF with ``pypdf``, plain text and Markdown as UTF-8.

A file that cannot be parsed raises :class:`ParseError` carrying the parser's
own message; the worker turns it into a permanent item error. Nothing a file
contains may crash the worker: pypdf is pure Python, and any exception it
raises on a damaged file becomes a ParseError.

For PDFs the parser also keeps the text drawn in the largest font on the first
page (``title_hint``): a paper's title is set bigger than anything else near
it, a cue the plain text loses.
"""

from __future__ import annotations

import contextlib
import io
import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from statistics import median
from typing import Any

import pypdf

# Papers run to a few dozen pages; past this the rest is appendix and
# references, and a pathological file could keep a worker busy for minutes.
MAX_PAGES = 60
# A title is "bigger than the body" when its font is at least this much larger.
TITLE_FONT_RATIO = 1.2


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


class _PypdfNotes(logging.Handler):
    """Keeps pypdf's warnings about the file being parsed in this thread.

    pypdf reports the telling cause of a failure ("invalid pdf header") as a
    log warning and then raises something vaguer ("Stream has ended
    unexpectedly"). While a thread parses, this handler takes that thread's
    records off the log and into the error message; every other record goes
    on to the root logger's handlers as if pypdf's logger propagated. The
    notes list is written and read by the parsing thread alone.
    """

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self._local = threading.local()

    def emit(self, record: logging.LogRecord) -> None:
        notes: list[str] | None = getattr(self._local, "notes", None)
        if notes is None:
            logging.getLogger().handle(record)
        else:
            notes.append(record.getMessage())

    @contextlib.contextmanager
    def capture(self) -> Iterator[list[str]]:
        notes: list[str] = []
        self._local.notes = notes
        try:
            yield notes
        finally:
            self._local.notes = None


_notes = _PypdfNotes()
_pypdf_log = logging.getLogger("pypdf")
_pypdf_log.addHandler(_notes)
_pypdf_log.propagate = False


@dataclass(frozen=True, slots=True)
class ParsedText:
    text: str
    format: DocumentFormat
    pages: int
    title_hint: str | None = None


def parse_document(content: bytes, fmt: DocumentFormat) -> ParsedText:
    """The text of a document; raises :class:`ParseError` when there is none to be had."""
    if fmt is DocumentFormat.PDF:
        return _parse_pdf(content)
    try:
        text = content.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ParseError(f"not UTF-8 text: {exc}") from None
    if "\x00" in text:
        raise ParseError("not text: the file contains NUL bytes")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        raise ParseError("the file holds no text")
    return ParsedText(text=text, format=fmt, pages=1)


def _parse_pdf(content: bytes) -> ParsedText:
    with _notes.capture() as notes:
        try:
            return _read_pdf(content)
        except ParseError as exc:
            if notes:
                raise ParseError(f"{exc} ({'; '.join(dict.fromkeys(notes))})") from None
            raise


def _read_pdf(content: bytes) -> ParsedText:
    try:
        reader = pypdf.PdfReader(io.BytesIO(content))
        if reader.is_encrypted and not reader.decrypt(""):
            raise ParseError("pypdf: the PDF is encrypted with a password")
        pages = reader.pages[:MAX_PAGES]
        runs: list[tuple[float, str]] = []

        def visit(text: str, cm: Any, tm: Any, font: Any, size: float) -> None:
            runs.append((_effective_size(size, tm), text))

        texts = [pages[0].extract_text(visitor_text=visit)] if pages else []
        texts.extend(page.extract_text() for page in pages[1:])
    except ParseError:
        raise
    except Exception as exc:  # pypdf raises PyPdfError, but a damaged file may raise anything
        raise ParseError(f"pypdf: {type(exc).__name__}: {exc}") from None
    text = "\n".join(texts)
    if not text.strip():
        raise ParseError("pypdf: the PDF has no text layer (a scan without OCR?)")
    return ParsedText(
        text=text, format=DocumentFormat.PDF, pages=len(reader.pages), title_hint=_title(runs)
    )


def _effective_size(size: float, tm: Sequence[float] | None) -> float:
    scale = abs(float(tm[0])) if tm and tm[0] else 1.0
    return round(float(size) * scale, 1)


def _title(runs: list[tuple[float, str]]) -> str | None:
    """The first block of text in the largest font, when it is clearly larger than the body."""
    sized = [(size, text) for size, text in runs if text.strip()]
    if not sized:
        return None
    body = median(size for size, _ in sized)
    largest = max(size for size, _ in sized)
    if largest < body * TITLE_FONT_RATIO:
        return None
    parts: list[str] = []
    for size, text in sized:
        if size == largest:
            parts.append(text.strip())
        elif parts:
            break  # the title's block ended
    title = " ".join(" ".join(parts).split())
    return title or None


__all__ = ["EXTENSIONS", "DocumentFormat", "ParseError", "ParsedText", "parse_document"]
