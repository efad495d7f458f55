"""Evidence for every extracted value: its page, the quoted passage, a confidence, a check.

An extractor says where it read each value (``Extraction.quotes``); this
module finds that passage in the parsed text, which gives its page, and flags
the value when the passage is not there. A model can quote a sentence the
paper does not contain (or a rule a passage it rebuilt); such a value is kept
for a person to judge but marked ``verified: false``, reported as a field
error, and its confidence is capped at :data:`UNVERIFIED_CONFIDENCE`. It is
never kept silently.

Matching ignores case and runs of whitespace, and re-joins a word hyphenated
at a line end ("low-\\nsodium" matches "low-sodium"): the passage must be the
paper's words in the paper's order, nothing looser.

An extractor that gives no quote for a value has the value itself looked
for; when found there, that occurrence is the evidence, with the confidence
the extractor gave (or :data:`DEFAULT_CONFIDENCE`).

**Verified against an independent extraction.** The parse is the
workbench's own reading of the page, and a quote found in it proves only that
the parse produced it (words it glued, a margin it mixed in). A PDF's
evidence is therefore verified against PDFium's text of the cited page
(``ParsedText.signals.pages``, read apart from pdfplumber's parse): the quote
must be there, compared with whitespace, hyphens (a word broken at a line
end), PDFium's hyphenation marks, ligatures (NFKC) and case set aside. A
quote the parse has but PDFium's page does not is flagged. A quote PDFium's
text has but the parse lost (a margin, a footer) is verified, on PDFium's
page. A page read by OCR has no second extraction: its parse is the check.
A text or Markdown document is its own source.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shoal_extract.parsing import ParsedText

# A value whose passage is not in the paper is worth this much at most.
UNVERIFIED_CONFIDENCE = 0.1
# What a found value is worth when the extractor says nothing about it.
DEFAULT_CONFIDENCE = 0.6
# Quotes are stored and exported up to this length.
MAX_QUOTE_CHARS = 600
FLAG = "quote not found in the source text"
_HYPHEN_BREAK = re.compile(r"(?<=[^\W\d_])- (?=[^\W\d_])")


@dataclass(frozen=True, slots=True)
class Evidence:
    page: int | None
    quote: str | None
    confidence: float
    verified: bool  # the quote was found in the source (a PDF's: PDFium's text of the page)

    def as_dict(self) -> dict[str, Any]:
        return {
            "page": self.page,
            "quote": self.quote,
            "confidence": round(self.confidence, 3),
            "verified": self.verified,
        }


class SourceText:
    """A document's text normalised for matching, with a map back to its offsets."""

    def __init__(self, document: ParsedText) -> None:
        self.document = document
        self.flat, self.offsets = _normalise(document.text)
        signals = document.signals
        pages = signals.pages if signals is not None else ()
        # PDFium's text of each page, or None where there is no second extraction.
        self.independent: list[str | None] = [
            None
            if not pages or number in document.ocr_pages or number > len(pages)
            else _compact(pages[number - 1])
            for number in range(1, document.pages + 1)
        ]

    def find(self, quote: str) -> int | None:
        """The 1-based page where ``quote`` starts in the parsed text, or None."""
        needle, _ = _normalise(quote)
        if not needle:
            return None
        at = self.flat.find(needle)
        return None if at < 0 else self.document.page_at(self.offsets[at])

    def locate(self, quote: str) -> tuple[int | None, bool]:
        """The quote's page and whether it is verified (see the module's docstring)."""
        page = self.find(quote)
        if not any(text is not None for text in self.independent):
            return page, page is not None
        needle = _compact(quote)
        if not needle:
            return page, False
        if page is not None:
            on_page = self.independent[page - 1]
            if on_page is None:
                return page, True  # an OCR page: the parse is the only extraction
            if needle in on_page:
                return page, True
        for number, text in enumerate(self.independent, start=1):
            if text is not None and needle in text:
                return number, True
        return page, False


def _normalise(text: str) -> tuple[str, list[int]]:
    """Lower case, whitespace runs as one space, hyphenated line breaks re-joined."""
    chars: list[str] = []
    offsets: list[int] = []
    for i, char in enumerate(text):
        if char.isspace():
            if chars and chars[-1] != " ":
                chars.append(" ")
                offsets.append(i)
            continue
        lowered = char.lower()
        chars.append(lowered if len(lowered) == 1 else char)
        offsets.append(i)
    if chars and chars[-1] == " ":
        chars.pop()
        offsets.pop()
    flat = "".join(chars)
    # Drop the space of "low- sodium", keeping the offsets of the kept characters.
    drop = {m.start() + 1 for m in _HYPHEN_BREAK.finditer(flat)}
    if drop:
        flat = "".join(c for i, c in enumerate(flat) if i not in drop)
        offsets = [o for i, o in enumerate(offsets) if i not in drop]
    return flat, offsets


_HYPHENS = re.compile("[\\-\u00ad\u2010\u2011\ufffe\x02]")


def _compact(text: str) -> str:
    """Text for the independent check: NFKC, case folded, no whitespace and no hyphens."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return "".join(_HYPHENS.sub("", folded).split())


def check_evidence(
    document: ParsedText | SourceText,
    values: Mapping[str, Any],
    quotes: Mapping[str, str],
    confidence: Mapping[str, float],
) -> dict[str, Evidence]:
    """Evidence for every field with a value; fields without one have none."""
    source = document if isinstance(document, SourceText) else SourceText(document)
    out: dict[str, Evidence] = {}
    for name, value in values.items():
        if value is None:
            continue
        sure = confidence.get(name, DEFAULT_CONFIDENCE)
        quote = quotes.get(name)
        if not quote:
            page, verified = source.locate(str(value))
            quote = str(value) if verified else None
        else:
            page, verified = source.locate(quote)
        quote = None if quote is None else " ".join(quote.split())[:MAX_QUOTE_CHARS]
        out[name] = Evidence(
            page=page,
            quote=quote,
            confidence=sure if verified else min(sure, UNVERIFIED_CONFIDENCE),
            verified=verified,
        )
    return out


__all__ = ["FLAG", "Evidence", "SourceText", "check_evidence"]
