"""Page furniture: what a publisher prints around the paper, not the paper.

Running headers and footers (a journal's name, the authors' short names, a
"Downloaded from" stamp), page numbers and rotated margin lines (arXiv's id, a
licence line, a download stamp set vertically) become titles, authors and
abstract sentences when read as text. They are recognised by the habits of
their layout, never by their words:

- **Position and repetition.** A line in the top or bottom band of a page
  (``BAND`` of its height) whose text, digits aside, recurs in the same band
  on another page of the document (on two others in a document of six pages
  or more) is a running header or footer.
- **Page numbers.** A line in those bands that is only a number (``12``,
  ``Page 3``, ``3 of 14``, ``S12``).
- **Rotation.** Text not set horizontally is a margin stamp.

Furniture is kept, set after the page's body and marked, so reading order,
fields and chunks can leave it out while a reviewer still finds it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

# The top and bottom bands of a page, as a share of its height, where furniture sits.
BAND = 0.09
# A running line recurs on at least this many pages (the page it is on included); in a
# document of LONG_DOCUMENT pages or more, on MIN_PAGES_LONG: a table note or a
# footnote repeated on two pages of a long paper is the paper's text.
MIN_PAGES = 2
MIN_PAGES_LONG = 3
LONG_DOCUMENT = 6
_DIGITS = re.compile(r"\d+")
_SPACE = re.compile(r"\s+")
_PAGE_NUMBER = re.compile(r"^(page|p\.?|s)?#((of|/)#)?$")

Row = list[dict[str, Any]]


def signature(text: str) -> str:
    """A line's text with its numbers and spaces taken out, case-folded: a page's own
    number or date then does not hide that the line recurs."""
    return _SPACE.sub("", _DIGITS.sub("#", text.casefold()))


def band(row: Row, height: float) -> str | None:
    """``top`` or ``bottom`` when the row sits in that band of the page, else None."""
    if height <= 0:
        return None
    top = min(float(w["top"]) for w in row)
    bottom = max(float(w["bottom"]) for w in row)
    if bottom <= height * BAND:
        return "top"
    if top >= height * (1 - BAND):
        return "bottom"
    return None


def _row_text(row: Row) -> str:
    return " ".join(str(w["text"]) for w in sorted(row, key=lambda w: float(w["x0"])))


def banded_signatures(rows: Iterable[Row], height: float) -> set[tuple[str, str]]:
    """The (band, signature) of every row of one page in its top or bottom band."""
    found = set()
    for row in rows:
        where = band(row, height)
        if where:
            found.add((where, signature(_row_text(row))))
    return found


def running_lines(pages: Sequence[set[tuple[str, str]]]) -> frozenset[tuple[str, str]]:
    """The banded signatures that recur on ``MIN_PAGES`` pages or more (``MIN_PAGES_LONG``
    in a long document)."""
    least = MIN_PAGES if len(pages) < LONG_DOCUMENT else MIN_PAGES_LONG
    counts: Counter[tuple[str, str]] = Counter()
    for page in pages:
        counts.update(page)
    return frozenset(s for s, n in counts.items() if n >= least and s[1])


def is_furniture(row: Row, height: float, running: frozenset[tuple[str, str]]) -> bool:
    """Whether one row of a page is furniture (see the module docstring)."""
    where = band(row, height)
    if where is None:
        return False
    key = signature(_row_text(row))
    return (where, key) in running or bool(_PAGE_NUMBER.match(key))


__all__ = ["BAND", "banded_signatures", "is_furniture", "running_lines", "signature"]
