"""What a PDF says besides the parse: its metadata, pdfium's text, the front page's lines.

The parse (:mod:`shoal_extract.pdf_layout`, pdfplumber) rebuilds reading
order; the fields and their evidence also need what it does not keep:

- **metadata**: the Info dictionary (``Title``, ``Author``, ``Subject``) and
  the XMP packet's ``dc:title``, ``dc:identifier``, ``prism:doi``,
  ``prism:publicationName``. A value from here is used only where the page
  prints it too (the rules check).
- **pages**: every page's text as PDFium extracts it, a second extraction
  independent of pdfplumber's. Evidence is verified against it: a quote that
  is not in PDFium's text of its page is not a passage of the PDF.
- **lines**: the text lines of the first pages with their size (the height of
  the font's box, in points) and position (top-down, in points), in PDFium's
  order. The title is the largest text on the front page, not the first.

Reading them costs a few milliseconds a page. A file PDFium cannot open has
no signals (``None``); the parse decides whether the file is readable.
"""

from __future__ import annotations

import ctypes
import io
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pypdfium2
import pypdfium2.raw as pdfium_c
from pdfminer.pdfdocument import PDFDocument
from pdfminer.pdfparser import PDFParser
from pdfminer.pdftypes import resolve1

from shoal_extract.pdfium_lock import PDFIUM

# The pages whose lines are kept: the front page, and a second one behind a cover page.
LINE_PAGES = 2
MAX_META_CHARS = 2000
INFO_KEYS = ("Title", "Author", "Subject", "Keywords")
XMP_TAGS = ("dc:title", "dc:identifier", "prism:doi", "prism:publicationName", "pdfx:doi")
_XMP_TAG = re.compile(
    rb"<(?P<tag>" + b"|".join(t.encode() for t in XMP_TAGS) + rb")\b[^>]*>(?P<body>.*?)</(?P=tag)>",
    re.DOTALL,
)
_XML_ELEMENT = re.compile(r"<[^>]*>")
_XML_ENTITIES = {"&amp;": "&", "&lt;": "<", "&gt;": ">", "&quot;": '"', "&apos;": "'"}
# PDFium is not thread-safe: one lock for every use of it in the process.
_pdfium = PDFIUM


@dataclass(frozen=True, slots=True)
class TextLine:
    """One line of a front page: its text, size and box (points, from the top left)."""

    page: int  # 1-based
    text: str
    size: float
    x0: float
    top: float
    x1: float
    bottom: float
    # The text with each run of superscript characters (smaller, raised) as " ^ ":
    # where an author's affiliation markers were.
    marked: str = ""

    def as_list(self) -> list[Any]:
        return [
            self.page,
            self.text,
            self.size,
            self.x0,
            self.top,
            self.x1,
            self.bottom,
            self.marked,
        ]

    @classmethod
    def from_list(cls, raw: list[Any]) -> TextLine:
        page, text, size, x0, top, x1, bottom, *marked = raw
        return cls(int(page), str(text), float(size), x0, top, x1, bottom, "".join(marked))


@dataclass(frozen=True, slots=True)
class PdfSignals:
    metadata: Mapping[str, str] = field(default_factory=dict)
    pages: tuple[str, ...] = ()  # PDFium's text of every page
    lines: tuple[TextLine, ...] = ()  # the lines of the first LINE_PAGES pages
    page_heights: tuple[float, ...] = ()  # of the first LINE_PAGES pages

    def as_dict(self) -> dict[str, Any]:
        return {
            "metadata": dict(self.metadata),
            "pages": list(self.pages),
            "lines": [line.as_list() for line in self.lines],
            "page_heights": list(self.page_heights),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> PdfSignals:
        return cls(
            metadata={str(k): str(v) for k, v in raw.get("metadata", {}).items()},
            pages=tuple(raw.get("pages", ())),
            lines=tuple(TextLine.from_list(x) for x in raw.get("lines", ())),
            page_heights=tuple(float(h) for h in raw.get("page_heights", ())),
        )


def storable(text: str) -> str:
    """Text PostgreSQL stores: surrogate pairs joined, a lone half replaced, no NUL."""
    joined = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return joined.replace("\x00", "")


def read_signals(content: bytes) -> PdfSignals | None:
    """The metadata, PDFium's page texts and the front pages' lines, or None."""
    metadata = dict(_xmp(content))
    with _pdfium:
        try:
            pdf = pypdfium2.PdfDocument(content)
        except Exception:  # pypdfium2's PdfiumError, or anything a damaged file raises
            return None
        try:
            info = pdf.get_metadata_dict(skip_empty=True)
            for key in INFO_KEYS:
                value = storable(" ".join(str(info.get(key, "")).split()))
                if value:
                    metadata[key] = value[:MAX_META_CHARS]
            pages: list[str] = []
            lines: list[TextLine] = []
            heights: list[float] = []
            for index in range(len(pdf)):
                page = pdf[index]
                text_page = page.get_textpage()
                pages.append(storable(text_page.get_text_range()))
                if index < LINE_PAGES:
                    heights.append(float(page.get_height()))
                    lines.extend(_lines(text_page, index + 1, float(page.get_height())))
                text_page.close()
                page.close()
        except Exception:
            return None
        finally:
            pdf.close()
    return PdfSignals(metadata, tuple(pages), tuple(lines), tuple(heights))


def _lines(text_page: Any, number: int, height: float) -> list[TextLine]:
    """The page's lines as PDFium breaks them, each with its median character height."""
    out: list[TextLine] = []
    chars: list[tuple[str, float, float, float, float]] = []
    box = pdfium_c.FS_RECTF()

    def close() -> None:
        text = storable("".join(c[0] for c in chars)).strip()
        sizes = sorted(c[4] - c[2] for c in chars if not c[0].isspace())
        if text and sizes:
            size = sizes[len(sizes) // 2]
            out.append(
                TextLine(
                    page=number,
                    text=" ".join(text.split()),
                    size=round(size, 1),
                    x0=round(min(c[1] for c in chars), 1),
                    top=round(min(c[2] for c in chars), 1),
                    x1=round(max(c[3] for c in chars), 1),
                    bottom=round(max(c[4] for c in chars), 1),
                    marked=" ".join(storable(_marked(chars, size)).split()),
                )
            )
        chars.clear()

    for i in range(pdfium_c.FPDFText_CountChars(text_page)):
        char = chr(pdfium_c.FPDFText_GetUnicode(text_page, i))
        if char in "\r\n":
            close()
            continue
        if not pdfium_c.FPDFText_GetLooseCharBox(text_page, i, ctypes.byref(box)):
            continue
        chars.append((char, box.left, height - box.top, box.right, height - box.bottom))
    close()
    return out


# A superscript: set at most this share of the line's size, its foot raised by a fifth of it.
SUPERSCRIPT_SIZE, SUPERSCRIPT_RAISE = 0.8, 0.2


def _marked(chars: list[tuple[str, float, float, float, float]], size: float) -> str:
    """The line's text with runs of superscript characters replaced by " ^ "."""
    feet = sorted(c[4] for c in chars if not c[0].isspace())
    foot = feet[len(feet) // 2]
    out: list[str] = []
    for char, _, top, _, bottom in chars:
        raised = foot - bottom > SUPERSCRIPT_RAISE * size
        accent = (
            unicodedata.category(char) == "Sk"
        )  # a spacing accent (an acute, a diaeresis) is set high too
        if not char.isspace() and not accent and bottom - top < SUPERSCRIPT_SIZE * size and raised:
            if not out or out[-1] != " ^ ":
                out.append(" ^ ")
        else:
            out.append(char)
    return "".join(out)


def _xmp(content: bytes) -> dict[str, str]:
    """The XMP packet's title, identifiers and publication name, where it has them."""
    try:
        document = PDFDocument(PDFParser(io.BytesIO(content)))
        stream = resolve1(document.catalog.get("Metadata"))
        data = stream.get_data() if stream is not None else b""
    except Exception:  # no catalog, a damaged stream: no XMP
        return {}
    found: dict[str, str] = {}
    for match in _XMP_TAG.finditer(data):
        text = _XML_ELEMENT.sub(" ", match.group("body").decode("utf-8", "replace"))
        for entity, char in _XML_ENTITIES.items():
            text = text.replace(entity, char)
        text = storable(" ".join(text.split()))
        tag = match.group("tag").decode()
        if text and tag not in found:
            found[tag] = text[:MAX_META_CHARS]
    return found


__all__ = ["PdfSignals", "TextLine", "read_signals"]
