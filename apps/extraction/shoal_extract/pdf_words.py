"""A PDF page's characters grouped into the words printed there.

pdfplumber's own grouping ends a word where the gap to the next character
exceeds a fixed 3 points. Tightly set type (8-9 pt sans with word spaces of
1.5 pt) then comes out as ``DougDowney,StefanSchoenmackers``. Here the gap is
measured against the type:

- **Runs.** Characters are read in the order the page draws them; a run is a
  stretch on one line going left to right (a character below or above the
  previous one, or back to its left, starts a new run).
- **Word gaps.** In a run, a gap wider than ``WORD_GAP`` of the font size,
  above the run's own usual letter gap (its median, so letter-spaced headings
  are not cut into letters), ends a word; a space glyph always does.
- **Superscripts.** A character clearly smaller than the run's text and raised
  above its baseline is a marker (a reference, an affiliation): it is written
  as its Unicode superscript (``ago¹``, ``Smithᵃ``), glued to its word, so it
  never reads as a number of the sentence. Unicode NFKC turns it back.
- **Glyphs.** Ligatures (``ﬁ``) become their letters; a ``(cid:N)`` glyph,
  which pdfminer gives for a font without a Unicode map, is asked of
  ``resolve`` (PDFium's reading of the same spot) and dropped if it has none.

Characters not set horizontally (rotated margin lines, vertical stamps) are
grouped the same way along their own line, and flagged ``upright=False``.
"""

from __future__ import annotations

import itertools
import re
import statistics
from collections import Counter
from collections.abc import Callable
from typing import Any

# A word gap is wider than this share of the font size (over the run's usual letter gap).
# Word spaces measured on the development set run from 0.17 em (tight sans) up; letter
# gaps, kerning included, stay under 0.06 em.
WORD_GAP = 0.12
# A run needs this many gaps before its median letter gap is trusted.
MIN_GAPS_FOR_MEDIAN = 8
# A character this much smaller than its run's text, and raised, is a superscript marker.
SUPERSCRIPT_SIZE = 0.85
SUPERSCRIPT_RAISE = 0.15  # share of the run's font size its baseline sits higher, at least
# A superscript marker this close (a share of its word's font size) after a word is the word's.
MARKER_GAP = 0.6
LIGATURES = {
    "\ufb00": "ff",
    "\ufb01": "fi",
    "\ufb02": "fl",
    "\ufb03": "ffi",
    "\ufb04": "ffl",
    "\ufb05": "st",
    "\ufb06": "st",
}
_SUPER = dict(
    zip(
        "0123456789+-\u2013=()abcdefghijklmnoprstuvwxyz",
        "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079\u207a\u207b\u207b"
        "\u207c\u207d\u207e\u1d43\u1d47\u1d9c\u1d48\u1d49\u1da0\u1d4d\u02b0\u2071\u02b2"
        "\u1d4f\u02e1\u1d50\u207f\u1d52\u1d56\u02b3\u02e2\u1d57\u1d58\u1d5b\u02b7\u02e3"
        "\u02b8\u1dbb",
        strict=True,
    )
)
_CID = re.compile(r"^\(cid:\d+\)$")
# A control character or U+FFFD: the font maps the glyph to no text (a ligature often).
_NO_UNICODE = re.compile(r"^[\x00-\x08\x0b\x0c\x0e-\x1f\ufffd]+$")

# Where a glyph without a Unicode map sits (x0, top, x1, bottom) to the text PDFium reads there.
Resolver = Callable[[float, float, float, float], str | None]


def is_horizontal(char: dict[str, Any]) -> bool:
    """Set along the x axis: slanted, or upside down glyph by glyph (Type 3 fonts often are)."""
    matrix = char.get("matrix")
    if matrix is None:
        return bool(char.get("upright", True))
    # The advance (a, b) runs along +x; c, the skew of a slanted (synthetic italic)
    # font, and d, flipped in many Type 3 fonts, do not turn the line.
    a, b = (float(v) for v in matrix[:2])
    return a > 0 and abs(b) <= 0.05 * a


def page_words_from_chars(
    chars: list[dict[str, Any]], *, resolve: Resolver | None = None
) -> list[dict[str, Any]]:
    """Words (pdfplumber's word dictionaries: text, box, size, fontname, upright) of the chars."""
    flat = [c for c in chars if is_horizontal(c)]
    turned = [_turned(c) for c in chars if not is_horizontal(c)]
    words: list[dict[str, Any]] = []
    for run in _runs(flat):
        words.extend(_run_words(run, resolve))
    for run in _runs(turned):
        for word in _run_words(run, resolve, superscripts=False):
            word["upright"] = False
            words.append(word)
    return words


def _turned(char: dict[str, Any]) -> dict[str, Any]:
    """A character of rotated text in a frame where its line runs left to right.

    Text set upwards (a licence line up the margin) or downwards is read along
    its own line; ``_box`` keeps the character's place on the page.
    """
    a, b = (float(v) for v in char.get("matrix", (1, 0))[:2])
    x0, x1 = float(char["x0"]), float(char["x1"])
    top, bottom = float(char["top"]), float(char["bottom"])
    if abs(b) > abs(a) and b > 0:  # upwards: the page's top edge comes last
        frame = {"x0": -bottom, "x1": -top, "top": x0, "bottom": x1}
    elif abs(b) > abs(a):  # downwards
        frame = {"x0": top, "x1": bottom, "top": -x1, "bottom": -x0}
    else:  # upside down or slanted: read right to left along x
        frame = {"x0": -x1, "x1": -x0, "top": -bottom, "bottom": -top}
    return {**char, **frame, "_box": char}


def _blank(text: str) -> bool:
    """A space between words: white space, but not a control character standing for a glyph."""
    return not text or (text.isspace() and not _NO_UNICODE.match(text))


def _glyphs(text: str) -> str:
    return "".join(LIGATURES.get(ch, ch) for ch in text)


def _runs(chars: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Stretches of characters in drawing order on one line, left to right."""
    runs: list[list[dict[str, Any]]] = []
    anchor: dict[str, Any] | None = None  # the run's last printed (not space) character
    for char in chars:
        blank = _blank(str(char["text"]))
        if runs and (anchor is None or _continues(anchor, char) or blank):
            runs[-1].append(char)
        else:
            runs.append([char])
            anchor = None
        if not blank:
            anchor = char
    return runs


def _continues(prev: dict[str, Any], char: dict[str, Any]) -> bool:
    size = max(float(prev["size"]), float(char["size"]), 1.0)
    # On one line: the boxes overlap vertically (a superscript overlaps its base).
    overlap = min(float(prev["bottom"]), float(char["bottom"])) - max(
        float(prev["top"]), float(char["top"])
    )
    if overlap < 0.2 * min(float(prev["size"]), float(char["size"]), size):
        return False
    gap = float(char["x0"]) - float(prev["x1"])
    return -0.5 * size <= gap <= 3.0 * size


def _run_words(
    run: list[dict[str, Any]], resolve: Resolver | None, *, superscripts: bool = True
) -> list[dict[str, Any]]:
    sizes = Counter(round(float(c["size"]), 1) for c in run if not _blank(str(c["text"])))
    if not sizes:
        return []
    size = sizes.most_common(1)[0][0]
    base = statistics.median(float(c["bottom"]) for c in run if round(float(c["size"]), 1) == size)
    gaps = [
        float(b["x0"]) - float(a["x1"])
        for a, b in itertools.pairwise(run)
        if not _blank(str(a["text"])) and not _blank(str(b["text"]))
    ]
    usual = max(0.0, statistics.median(gaps)) if len(gaps) >= MIN_GAPS_FOR_MEDIAN else 0.0
    words: list[dict[str, Any]] = []
    current: list[tuple[dict[str, Any], str, bool]] = []  # (char, text, is superscript)
    prev: dict[str, Any] | None = None
    for char in run:
        text = str(char["text"])
        if _blank(text):
            _close(current, words)
            prev = None
            continue
        csize = float(char["size"])
        raised = superscripts and (
            csize <= size * SUPERSCRIPT_SIZE
            and float(char["bottom"]) < base - size * SUPERSCRIPT_RAISE
        )
        if prev is not None:
            gap = float(char["x0"]) - float(prev["x1"])
            if gap > usual + WORD_GAP * min(max(csize, float(prev["size"])), size):
                _close(current, words)
        if _CID.match(text) or _NO_UNICODE.match(text):
            box = char.get("_box", char)
            spot = (float(box["x0"]), float(box["top"]), float(box["x1"]), float(box["bottom"]))
            found = resolve(*spot) if resolve else None
            text = found.strip() if found else ""
        text = _glyphs(text)
        if raised:
            text = "".join(_SUPER.get(ch, ch) for ch in text)
        if text:
            current.append((char, text, raised))
        prev = char
    _close(current, words)
    return words


def _close(current: list[tuple[dict[str, Any], str, bool]], words: list[dict[str, Any]]) -> None:
    if not current:
        return
    boxes = [c.get("_box", c) for c, _, _ in current]
    body = [c.get("_box", c) for c, _, raised in current if not raised]
    if not body and words:
        # A marker set apart from its word by a space (some house styles do): still its word's.
        last, x0 = words[-1], min(float(c["x0"]) for c in boxes)
        if x0 - float(last["x1"]) <= MARKER_GAP * float(last["size"]):
            last["text"] += "".join(t for _, t, _ in current)
            last["x1"] = max(float(last["x1"]), max(float(c["x1"]) for c in boxes))
            current.clear()
            return
    body = body or boxes
    first = body[0]
    if "_box" in current[0][0]:
        # Rotated text: where the word sits in its own line's frame too, for a page
        # set sideways (a landscape table) that is read in that frame.
        frame = [c for c, _, _ in current]
        extra = {
            "frame": (
                min(float(c["x0"]) for c in frame),
                max(float(c["x1"]) for c in frame),
                min(float(c["top"]) for c in frame),
                max(float(c["bottom"]) for c in frame),
            )
        }
    else:
        extra = {}
    words.append(
        {
            "text": "".join(t for _, t, _ in current),
            "x0": min(float(c["x0"]) for c in boxes),
            "x1": max(float(c["x1"]) for c in boxes),
            "top": min(float(c["top"]) for c in body),
            "bottom": max(float(c["bottom"]) for c in body),
            "doctop": float(first.get("doctop", first["top"])),
            "upright": True,
            "direction": "ltr",
            "size": first["size"],
            "fontname": first["fontname"],
            **extra,
        }
    )
    current.clear()


__all__ = ["LIGATURES", "WORD_GAP", "Resolver", "is_horizontal", "page_words_from_chars"]
