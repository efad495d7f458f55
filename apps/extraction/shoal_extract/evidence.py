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
"""

from __future__ import annotations

import re
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
    verified: bool  # the quote was found in the parsed text

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

    def find(self, quote: str) -> int | None:
        """The 1-based page where ``quote`` starts in the document, or None."""
        needle, _ = _normalise(quote)
        if not needle:
            return None
        at = self.flat.find(needle)
        return None if at < 0 else self.document.page_at(self.offsets[at])


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
            page = source.find(str(value))
            quote = str(value) if page is not None else None
        else:
            page = source.find(quote)
        quote = None if quote is None else " ".join(quote.split())[:MAX_QUOTE_CHARS]
        verified = page is not None
        out[name] = Evidence(
            page=page,
            quote=quote,
            confidence=sure if verified else min(sure, UNVERIFIED_CONFIDENCE),
            verified=verified,
        )
    return out


__all__ = ["FLAG", "Evidence", "SourceText", "check_evidence"]
