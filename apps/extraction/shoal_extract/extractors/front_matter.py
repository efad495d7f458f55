"""Bibliographic fields from a PDF's front page and metadata (:mod:`shoal_extract.pdf_signals`).

Each field is read from the habit a printed paper follows, never from a
paper or a journal by name:

- **title**: the largest text in the upper part of the front page (a
  running header, a logo word, a label, a date or a citation line is not a
  title); the metadata's title where the page prints the same words, in the
  page's form; a cover page's title on page 2; where nothing is set larger
  than the text, a run of capitals with a row of names under it.
- **authors**: the rows right under the title, in its column (a sidebar is
  not an author), superscript markers, digits, daggers, letter markers and
  degrees dropped.
- **DOI**: anywhere on the front page (header, footer, margin, a
  ``doi.org/`` URL), joined across a line break, and on the second page
  only where labelled; never one from a reference list, a reference line or
  a cross-reference ("see the editorial (doi:...)"). The metadata's DOI and
  the running footers rank the candidates.
- **year** and **journal**: from the citation line (``Journal. 2019;12:3``,
  ``Journal 12 (2019) 45``, ``Journal (2019) 12, 45``, a masthead set line by
  line...), on the front page or in the running headers; else a proceedings'
  or conference's name; the year else from the "Published" line, a
  preprint's posting date, an arXiv stamp or the copyright line; never a
  received, revised or accepted date.

Confidence says how many signals agree: a value the page prints and a second
source confirms (the metadata, a running header) is in the top band; one
signal alone is in the middle band.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from shoal_extract.pdf_signals import PdfSignals, TextLine

# Confidence by agreement: two signals, one purpose-printed signal, one habit.
AGREED, PRINTED, HABIT = 0.97, 0.85, 0.7

MIN_TITLE_WORDS, MAX_TITLE_WORDS = 4, 45
# The title sits in the upper part of the front page.
TITLE_ZONE = 0.6
# A title is set larger than the page's body text by at least this ratio.
TITLE_OVER_BODY = 1.1
SAME_SIZE = 0.06  # sizes within 6% are one style
MAX_AUTHOR_LINES = 4
# More words than this between two separators: names set without one, not one name.
MAX_NAME_WORDS = 4

_HYPHEN_MARKS = re.compile("[\ufffe\x02]\\s*")
_YEAR = r"(?P<year>(?:18|19|20)\d{2})"
_WORD = r"[A-Z][\w.&'\u2019\-]*"
_LINK = r"(?:of|and|the|for|in|on|&|de|la|du|der|und|des)"
_JOURNAL = rf"(?P<journal>{_WORD}(?:\s+(?:{_WORD}|{_LINK}))*?)"
_LEAD_IN = re.compile(
    r"^(?:Cite this(?: article)?|Citation|To cite(?: this article)?|How to cite(?: this article)?|"
    r"Published in final edited form as|Please cite this article as)\s*:\s*",
    re.IGNORECASE,
)
_MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|"
    r"Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\.?"
)
_DAY = r"\d{1,2}(?:st|nd|rd|th)?"
_DAYS = rf"{_DAY}(?:\s*[-\u2013]+\s*{_DAY})?"  # a day, or a conference's days
_DATE = rf"(?:{_DAYS}\s+{_MONTH},?\s+|{_MONTH}\s+(?:{_DAYS},?\s+)?){_YEAR}"
# A citation line: the journal, then year, volume and pages in one of the usual orders.
CITATION_LINES = [
    # Journal. 2019;12(3):45 | Journal 2019, Vol. 12 | Journal, 2019, 12:45 | Journal. 2010 May 1; 3
    # (a volume with its pages or issue after the year: "Smith 2009, 2011" is a text citation)
    re.compile(
        rf"{_JOURNAL}[.,]?\s+{_YEAR}\s*(?:[;,.:]\s*(?:Vol\.?\s*\d|\d{{1,4}}\s*[:(,]\s*(?:[\de]|$))"
        rf"|\s[A-Z][a-z]+\s+\d{{1,2}};)"
    ),
    # Journal (2019) 12, 45
    re.compile(rf"{_JOURNAL}[.,]?\s+\({_YEAR}\)\s*,?\s*\d"),
    # Journal 12 (2019) 45
    re.compile(rf"{_JOURNAL}[.,]?\s+\d+\s*\({_YEAR}\)\s*\d"),
    # Journal 12, 45-67 (2019)
    re.compile(rf"{_JOURNAL}[.,]?\s+\d+,\s*\d+\s*[-\u2013]\s*\d+\s*\({_YEAR}\)"),
    # Journal Vol. 12, pp. 45-67, 2019
    re.compile(rf"{_JOURNAL}\s+Vol\.?\s*\d+,\s*pp\.\s*[\d\u2013-]+,\s*{_YEAR}"),
    # Journal 12:45-67; © 2019
    re.compile(rf"{_JOURNAL}\s+\d+:\s*\d+\s*[-\u2013]\s*\d+;\s*(?:©|\(c\))\s*{_YEAR}"),
    # Journal Vol 4 No 13 November 2019
    re.compile(
        rf"{_JOURNAL}\s+Vol(?:ume)?\.?\s*\d+,?\s*(?:No\.?\s*\d+,?\s*)?(?:[A-Z][a-z]+\s+)?{_YEAR}"
    ),
    # a masthead in capitals after the name as set: "nature physics VOL 3 NOVEMBER 2007"
    re.compile(
        rf"(?P<journal>[A-Za-z][a-z&]+(?:\s+[a-z&]+){{0,4}})\s+VOL(?:UME)?\.?\s*\d+\s+"
        rf"(?:NO\.?\s*\d+\s+)?[A-Z]{{3,9}}\s+{_YEAR}"
    ),
    # a header naming the journal and the date: Journal | Published online 3 May 2019
    re.compile(rf"{_JOURNAL}\s*\|\s*Published(?: online)?:?\s+{_DATE}"),
    # the metadata's form: Journal 2019.12:45
    re.compile(rf"{_JOURNAL}\s+{_YEAR}\.\d+:"),
]
_NOT_JOURNAL = re.compile(
    r"\b(?:Received|Revised|Accepted|Downloaded|Copyright|Published|Submitted|Available|"
    r"Correspond\w*|Email|et al|Table|Figure|Fig)\b|©",
    re.IGNORECASE,
)
# Dates that say when a paper came out, most telling first (each: a label, a date).
PUBLISHED_LINES = [
    re.compile(rf"\bPublished(?: online)?(?: on)?\s*:?\s*{_DATE}", re.IGNORECASE),
    re.compile(rf"\b(?:version posted|Posted(?: Date)?:?|Draft version)\s*:?\s*{_DATE}"),
    re.compile(
        rf"\barXiv:\d{{4}}\.\d{{4,5}}(?:v\d+)?\s*\[[^\]]+\]\s*\d{{1,2}}\s+{_MONTH}\s+{_YEAR}"
    ),
    re.compile(rf"(?:©|\(c\)|Copyright)\s*(?:\d{{4}}[-\u2013])?{_YEAR}\b", re.IGNORECASE),
]
_UNPUBLISHED_DATE = re.compile(r"\b(?:Received|Revised|Accepted|Submitted)\b", re.IGNORECASE)

_DOI_BODY = r"10\.\d{4,9}/[^\s\"<>]+"
DOI_ANY = re.compile(_DOI_BODY)
DOI_LABELLED = re.compile(
    rf"(?:\bdoi\s*:?\s*|https?://(?:dx\.)?doi\.org/|/doi/(?:abs/|full/|pdf/)?)({_DOI_BODY})",
    re.IGNORECASE,
)
# A line of a reference list: "[12] ...", "12. Smith J, ...", or with "et al." and a year.
_REFERENCE_LINE = re.compile(r"^\s*(?:\[\d+\]|\d{1,3}\.\s+[A-Z][\w\u2019'\-]+,?\s+[A-Z])|\bet al\b")
_CROSS_REFERENCE = re.compile(
    r"\b(?:see|comment\w*|editorial|erratum|correction|retraction|linked|related|"
    r"accompany\w*|companion|refers? to|reply to|response to)\b",
    re.IGNORECASE,
)
_REFERENCES = re.compile(r"^\s*(?:References|Bibliography|Literature Cited)\s*$", re.IGNORECASE)

_MARKERS = re.compile(
    r"(?<=[^\W\d_.]),?\s*(?:[\d\u00b9\u00b2\u00b3\u2070-\u2079\u2217*†‡§¶#‖\u204e]+[,\s]*)+"
)
# Letter markers set close: "Lanea,c,*" is Lane with affiliations a and c.
_LETTER_MARKS = re.compile(r"(?<=[a-z])[a-h](?:,\s?[a-h*])+(?=[,\s]|$)")
_LONE_LETTER = re.compile(r"(?<=[^\W\d_]{2})\s+[a-h](?=\s*(?:,|\band\b|$))")
_DEGREES = re.compile(
    r"^(?:MD|PhD|ScD|MHS|MPhil|MMSc|FRCPC|MSc|MS|BSc|BA|MA|MPH|RN|RT|RDMS|DPhil|MBBS|FRCP|DrPH|PharmD|DO|MBA|MB|ChB|"
    r"Jr|Sr|FACC|FESC|FAHA|FRACP|BS|MMed|DSc|Dr)\.?$"
)
_NOT_A_NAME = re.compile(
    r"\b(?:University|Department|Institute|School|Hospital|Cent(?:er|re)|Laborator\w*|College|"
    r"Research|Faculty|Division|Association|Society|Group|Abstract|Article|Journal|Press|"
    r"Science|Sciences|Original|Paper|Trial|Study|Review|Access|Manuscript)\b",
    re.IGNORECASE,
)
_NAME_WORD = re.compile(
    r"^(?:[^\W\d_][^\W\d_'\u2019\-.]*\.?(?:[-'\u2019][^\W\d_]+\.?)*|[^\W\d_]\.(?:-?[^\W\d_]\.)*)$"
)
_PARTICLES = {"van", "von", "de", "del", "der", "den", "da", "di", "du", "le", "la", "dos", "bin"}


@dataclass(frozen=True, slots=True)
class Signal:
    """A value, the passage of the page it was read from, and how sure the reading is."""

    value: object
    quote: str
    confidence: float


def clean(text: str) -> str:
    """PDFium's text on one line: hyphenation marks joined as hyphens, whitespace collapsed."""
    return " ".join(_HYPHEN_MARKS.sub("-", text).split())


def words(text: str) -> list[str]:
    """Letters and digits only, case and accents folded: how two renderings are compared."""
    folded = unicodedata.normalize("NFKD", _HYPHEN_MARKS.sub("", text)).casefold()
    return re.findall(r"[^\W_]+", "".join(c for c in folded if not unicodedata.combining(c)))


def _page_lines(signals: PdfSignals, page: int) -> list[TextLine]:
    return [line for line in signals.lines if line.page == page]


def _body_size(lines: Sequence[TextLine]) -> float:
    weight: dict[float, int] = {}
    for line in lines:
        weight[line.size] = weight.get(line.size, 0) + len(line.text)
    return max(weight, key=lambda s: weight[s]) if weight else 0.0


def _blocks(lines: Sequence[TextLine]) -> list[list[TextLine]]:
    """Lines of one size set one under the other: a title, an author block."""
    blocks: list[list[TextLine]] = []
    for line in sorted(lines, key=lambda ln: (ln.top, ln.x0)):
        for block in blocks:
            last = block[-1]
            same = abs(line.size - last.size) <= SAME_SIZE * max(line.size, last.size)
            near = -0.5 * line.size <= line.top - last.bottom <= 0.9 * line.size
            if same and near and line.x0 < last.x1 and last.x0 < line.x1:
                block.append(line)
                break
        else:
            blocks.append([line])
    return blocks


_LABEL = re.compile(
    r"^\W*(?:Key\s*words?|Index\s+terms|Abstract|Summary|Background|Correspond\w*|Received|Citation|Cite)\b",
    re.IGNORECASE,
)


def _looks_like_furniture(text: str) -> bool:
    return bool(
        _LABEL.match(text)
        or DOI_ANY.search(text)
        or re.search(r"https?://|www\.|arXiv:|©|\bISSN\b|Downloaded|\bVol\.?\s*\d", text)
        or any(p.search(text) for p in CITATION_LINES)
        or re.search(rf"\bet al\b|{_DATE}", text)
        or not text[:1].isalnum()
    )


@dataclass(frozen=True, slots=True)
class TitleBlock:
    text: str
    lines: tuple[TextLine, ...]
    size: float
    by_size: bool = True  # set larger than the text (else: capitals over a row of names)


def _joined_pieces(lines: Sequence[TextLine]) -> list[TextLine]:
    """Pieces of one row set close together in one size, as one line (PDFium can cut a
    line where the text's font or position changes)."""
    out: list[TextLine] = []
    for row in _rows(lines):
        current = row[0]
        for piece in row[1:]:
            gap = piece.x0 - current.x1
            same = abs(piece.size - current.size) <= SAME_SIZE * max(piece.size, current.size)
            if same and -0.1 * piece.size <= gap <= piece.size:
                glue = "" if gap < 0.15 * piece.size else " "
                current = dataclasses.replace(
                    current,
                    text=current.text + glue + piece.text,
                    x1=piece.x1,
                    top=min(current.top, piece.top),
                    bottom=max(current.bottom, piece.bottom),
                    marked="",
                )
            else:
                out.append(current)
                current = piece
        out.append(current)
    return out


def _without_author_list(block: list[TextLine]) -> list[TextLine]:
    """A block cut where a list of "Surname, Given; Surname, Given" begins (a cover page sets
    the authors in the title's style)."""
    for i, line in enumerate(block[1:], start=1):
        if line.text.count(";") >= 2:
            return block[:i]
    return block


def title_block(signals: PdfSignals) -> TitleBlock | None:
    """The largest text in the upper part of the first page that has one."""
    for page in (1, 2) if _is_cover(signals) else (1,):
        lines = _page_lines(signals, page)
        height = signals.page_heights[page - 1] if len(signals.page_heights) >= page else 0.0
        if not lines or not height:
            continue
        body = _body_size(lines)
        best: TitleBlock | None = None
        for block in map(_without_author_list, _blocks(_joined_pieces(lines))):
            text = clean(" ".join(line.text for line in block))
            size = block[0].size
            count = len(text.split())
            if (
                block[0].top > TITLE_ZONE * height
                or size < body * TITLE_OVER_BODY
                or not MIN_TITLE_WORDS <= count <= MAX_TITLE_WORDS
                or _looks_like_furniture(text)
                or (not any(c.islower() for c in text) and count < MIN_TITLE_WORDS + 2)
            ):
                continue
            if best is None or size > best.size:
                best = TitleBlock(text, tuple(block), size)
        if best is not None:
            return best
        caps = _title_in_capitals(signals, lines, body, height)
        if caps is not None:
            return caps
    return None


def _capital_runs(block: list[TextLine]) -> list[list[TextLine]]:
    """The block's runs of consecutive lines without a lower-case letter."""
    runs: list[list[TextLine]] = [[]]
    for line in block:
        if any(c.islower() for c in line.text):
            runs.append([])
        else:
            runs[-1].append(line)
    return [run for run in runs if run]


def _title_in_capitals(
    signals: PdfSignals, lines: Sequence[TextLine], body: float, height: float
) -> TitleBlock | None:
    """A title set in capitals at the text's size: the first such block in the upper page
    that has a row of names right under it (so a capitalised label or header is not taken)."""
    runs = [run for block in _blocks(_joined_pieces(lines)) for run in _capital_runs(block)]
    for block in sorted(runs, key=lambda b: b[0].top):
        text = clean(" ".join(line.text for line in block))
        if (
            block[0].top > TITLE_ZONE * height
            or block[0].size < body * 0.95
            or any(c.islower() for c in text)
            or not MIN_TITLE_WORDS + 2 <= len(text.split()) <= MAX_TITLE_WORDS
            or _looks_like_furniture(text)
        ):
            continue
        candidate = TitleBlock(text, tuple(block), block[0].size, by_size=False)
        rows = _rows_under(signals, candidate)
        if rows and split_names(_row_text(rows[0])):
            return candidate
    return None


def _printed(needle: Iterable[str], haystack: str) -> str | None:
    """The passage of ``haystack`` that prints the words ``needle``, in its own form."""
    tokens = list(needle)
    if not tokens:
        return None
    pattern = r"[\W_\ufffe\x02]*".join(re.escape(t) for t in tokens)
    folded = unicodedata.normalize("NFKC", haystack)
    match = re.search(pattern, folded, re.IGNORECASE)
    return clean(match.group(0)) if match else None


def _metadata_title(signals: PdfSignals) -> str | None:
    for key in ("dc:title", "Title"):
        value = signals.metadata.get(key, "")
        if (
            len(value.split()) >= MIN_TITLE_WORDS - 1
            and not re.search(r"\.(?:pdf|docx?|tex|indd)\b|^(?:doi|pii)\b|untitled", value, re.I)
            and not DOI_ANY.search(value)
        ):
            return value
    return None


def find_title(signals: PdfSignals) -> Signal | None:
    block = title_block(signals)
    meta = _metadata_title(signals)
    if meta is not None:
        meta_words = words(meta)
        if block is not None and words(block.text) == meta_words:
            return Signal(block.text, block.text, AGREED)
        for page in signals.pages[:2]:
            printed = _printed(meta_words, page)
            if printed is not None:
                return Signal(printed, printed, AGREED)
    if block is None:
        return None
    return Signal(block.text, block.text, PRINTED if block.by_size else HABIT)


# Spacing accents some fonts set as a glyph of their own, after the letter.
_SPACING_ACCENTS = {
    "\u00b4": "\u0301",
    "`": "\u0300",
    "\u00a8": "\u0308",
    "\u02dc": "\u0303",
    "\u02c6": "\u0302",
    "\u02c7": "\u030c",
    "\u00b8": "\u0327",
}
_LOOSE_ACCENT = re.compile("([^\\W\\d_])([" + "".join(_SPACING_ACCENTS) + "]) ?(?=[^\\W\\d_]|\\b)")


def _composed(text: str) -> str:
    """ "Jose\u00b4 Lo\u00b4pez" (an accent set as a glyph of its own) as "José López"."""

    def join(match: re.Match[str]) -> str:
        letter = "i" if match.group(1) == "\u0131" else match.group(1)
        return unicodedata.normalize("NFC", letter + _SPACING_ACCENTS[match.group(2)])

    return _LOOSE_ACCENT.sub(join, text)


def split_names(text: str) -> list[str]:
    """Personal names from an author line, markers and degrees dropped; [] if any part is not."""
    text = re.sub(r"\([^)]*\)", " ", _composed(clean(text)))
    text = re.split(r"\bon behalf of\b|\bfor the\b", text, maxsplit=1, flags=re.IGNORECASE)[0]
    text = re.sub(r"\S+@\S+", " ", text)
    text = _LETTER_MARKS.sub(", ", text)
    text = _MARKERS.sub(", ", text)
    text = re.sub(r"(?<![^\W\d_])[*\u2217\u204e\u2020\u2021\u00a7\u00b6#]+", " ", text)
    text = _LONE_LETTER.sub(",", text)
    names: list[str] = []
    for part in re.split(r"\s*(?:,|;|&|\^|\band\b)\s*", text):
        kept = [w for w in part.split() if not _DEGREES.match(w)]
        if not kept:
            continue
        name = " ".join(kept)
        if _NOT_A_NAME.search(name) or not 2 <= len(kept) <= MAX_NAME_WORDS:
            return []
        if not all(_NAME_WORD.match(w) and (w[0].isupper() or w in _PARTICLES) for w in kept):
            return []
        names.append(name)
    return names


def _rows(lines: Iterable[TextLine]) -> list[list[TextLine]]:
    """Pieces of one printed row (a superscript shifts a piece's top), left to right, top down."""
    rows: list[list[TextLine]] = []
    for line in sorted(lines, key=lambda ln: ln.top):
        centre = (line.top + line.bottom) / 2
        last = rows[-1][-1] if rows else None
        if last is not None and abs(centre - (last.top + last.bottom) / 2) < 0.5 * line.size:
            rows[-1].append(line)
        else:
            rows.append([line])
    for row in rows:
        row.sort(key=lambda ln: ln.x0)
    return rows


def _row_text(row: Sequence[TextLine]) -> str:
    """A row's text with superscripts marked; pieces far apart (author groups side by side)
    kept apart by a comma."""
    text = row[0].marked or row[0].text
    for left, right in itertools.pairwise(row):
        glue = " , " if right.x0 - left.x1 > right.size else " "
        text += glue + (right.marked or right.text)
    return text


def title_anchor(signals: PdfSignals) -> TitleBlock | None:
    """The title's lines: those printing the metadata's title where they agree, else the
    largest text of the front page."""
    meta = _metadata_title(signals)
    if meta is not None:
        target = words(meta)
        for page in (1, 2):
            lines = sorted(_page_lines(signals, page), key=lambda ln: (ln.top, ln.x0))
            for i, first in enumerate(lines):
                got: list[str] = []
                for j in range(i, len(lines)):
                    more = words(lines[j].text)
                    if not more or got + more != target[: len(got) + len(more)]:
                        break
                    got += more
                    if got == target:
                        block = tuple(lines[i : j + 1])
                        text = clean(" ".join(ln.text for ln in block))
                        return TitleBlock(text, block, first.size)
    return title_block(signals)


def _rows_under(signals: PdfSignals, block: TitleBlock) -> list[list[TextLine]]:
    """The rows below the title, within its column."""
    left, right = min(ln.x0 for ln in block.lines), max(ln.x1 for ln in block.lines)
    return _rows(
        ln
        for ln in _page_lines(signals, block.lines[0].page)
        if ln.top >= block.lines[-1].bottom - 1 and ln.x1 > left and ln.x0 < right
    )


def find_authors(signals: PdfSignals) -> Signal | None:
    """The names printed under the title (in its column, not a sidebar), before the
    affiliations."""
    block = title_anchor(signals)
    if block is None:
        return None
    below = _rows_under(signals, block)
    names: list[str] = []
    quote = ""
    last_bottom = block.lines[-1].bottom
    for lines, row in enumerate(below):
        # The space under a title is the title's; between author rows, the rows'.
        size = max(ln.size for ln in row) if names else block.size
        if row[0].top - last_bottom > 3 * size or lines == MAX_AUTHOR_LINES:
            break
        found = split_names(_row_text(row))
        if not found:
            if names:
                break
            if re.fullmatch(r"[\W\d\s]*", _row_text(row)):
                continue
            break
        names.extend(found)
        quote = quote or row[0].text
        last_bottom = max(ln.bottom for ln in row)
    if not names:
        return None
    return Signal(", ".join(names), quote, PRINTED)


def _lines_before_references(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        if _REFERENCES.match(line):
            break
        out.append(line)
    return out


def _joined_dois(lines: Sequence[str]) -> list[tuple[str, str, bool]]:
    """(doi, the passage, labelled) for every DOI in ``lines``, one cut by a line break rejoined."""
    found: list[tuple[str, str, bool]] = []
    for i, raw in enumerate(lines):
        line = raw.rstrip("\ufffe\x02")
        if _REFERENCE_LINE.search(line):
            continue
        for match in DOI_ANY.finditer(line):
            doi, passage = match.group(0), line[max(0, match.start() - 40) : match.end()]
            cut = raw.endswith(("\ufffe", "\x02")) or doi.endswith(("-", "/"))
            if match.end() == len(line) and cut and i + 1 < len(lines):
                rest = re.match(r"\s*([^\s\"<>]+)", lines[i + 1])
                if rest:
                    doi += rest.group(1)
                    passage += " " + rest.group(1)
            if _CROSS_REFERENCE.search(line[max(0, match.start() - 60) : match.start()]):
                continue  # "see the editorial comment (doi:...)": another item's DOI
            doi = _trim_doi(doi)
            labelled = bool(DOI_LABELLED.search(line[max(0, match.start() - 30) : match.end()]))
            found.append((doi, clean(passage), labelled))
    return found


def _trim_doi(doi: str) -> str:
    doi = doi.rstrip(".,;:")
    while doi.endswith((")", "]")) and doi.count("(") < doi.count(")") + (doi[-1] == "]"):
        doi = doi[:-1].rstrip(".,;:")
    return doi


def _metadata_dois(signals: PdfSignals) -> set[str]:
    out: set[str] = set()
    for value in signals.metadata.values():
        out.update(_trim_doi(m.group(0)).casefold() for m in DOI_ANY.finditer(value))
    return out


def find_doi(signals: PdfSignals) -> Signal | None:
    """The paper's own DOI: front page anywhere, page 2 only labelled; the most confirmed."""
    if not signals.pages:
        return None
    first = _joined_dois(_lines_before_references(signals.pages[0]))
    second: list[tuple[str, str, bool]] = []
    if len(signals.pages) > 1 and not any(
        _REFERENCES.match(x) for x in signals.pages[0].splitlines()
    ):
        second = [d for d in _joined_dois(_lines_before_references(signals.pages[1])) if d[2]]
    candidates = first + second
    if not candidates:
        return None
    meta = _metadata_dois(signals)
    later = " ".join(signals.pages[1:4]).casefold()

    def rank(entry: tuple[str, str, bool]) -> tuple[int, int, int]:
        doi, _, labelled = entry
        return (doi.casefold() in meta, labelled, doi.casefold() in later)

    best = max(candidates, key=rank)
    others = {d.casefold() for d, _, _ in candidates} - {best[0].casefold()}
    agreed = rank(best)[0] or (rank(best)[1] and rank(best)[2])
    confidence = AGREED if agreed and not others else PRINTED if best[2] else HABIT
    return Signal(best[0], best[1], confidence)


@dataclass(frozen=True, slots=True)
class Citation:
    journal: str
    year: int | None
    quote: str
    confirmed: bool  # printed twice (a running header, the metadata)


def _citation_in(text: str) -> tuple[str, int, str] | None:
    text = _LEAD_IN.sub("", clean(text))
    for pattern in CITATION_LINES:
        for match in pattern.finditer(text):
            journal = match.group("journal").strip(" .,")
            if _NOT_JOURNAL.search(journal) or sum(c.isalpha() for c in journal) < 3:
                continue
            return journal, int(match.group("year")), match.group(0)
    return None


# "Health Psychology © 2012 ..." over "2012, Vol. 31, No. 4, 433-440": the journal a line above.
_YEAR_VOLUME_LINE = re.compile(rf"^{_YEAR},\s*Vol\.?\s*\d+")
_LEADING_NAME = re.compile(rf"^{_JOURNAL}(?=\s*(?:©|\(c\)|\d|$))")
# An APA reference to the paper itself (a repository's cover):
# "... (2019). Title. Journal, 380(16)".
_APA = re.compile(
    rf"\({_YEAR}\)\.\s+[^()]{{10,400}}?\.\s+(?P<journal>[A-Z][\w&.'\u2019 \-]+?),\s+\d+\s*\(\d+\)"
)
# A proceedings' running header: "Proceedings of Machine Learning for Healthcare 2017".
_PROCEEDINGS = re.compile(rf"^(?P<journal>Proceedings of (?:the )?[A-Z][\w&,:\- ]*?\s{_YEAR})\b")
# A conference's short name: "CCS\u201915, October 12-16, 2015, Denver" or "IPAC2018, Vancouver".
_VENUE_CODE = re.compile(
    r"(?:^|(?<=\s))(?P<journal>[A-Z][A-Za-z]{1,9}['\u2019\-]?(?:\d{2}|(?:19|20)\d{2}))(?:,\s+(?P<rest>[A-Z].*))?$"
)


# A masthead set line by line: the name, a publisher, "Vol 4 No 13", "November 2013".
_VOLUME_ONLY = re.compile(
    rf"^Vol(?:ume)?\.?\s*\d+,?(?:\s*(?:No|Issue)\.?\s*\d+)?,?(?:\s+(?:{_MONTH}\s+)?{_YEAR})?$"
)
_MONTH_YEAR = re.compile(rf"^(?:{_MONTH}\s+)?{_YEAR}$")
MASTHEAD_LINES = 3


def _masthead(lines: Sequence[str], i: int) -> tuple[str, int, str] | None:
    volume = _VOLUME_ONLY.match(clean(lines[i]))
    assert volume is not None
    year = volume.group("year")
    if year is None and i + 1 < len(lines):
        after = _MONTH_YEAR.match(clean(lines[i + 1]))
        year = after.group("year") if after else None
    if year is None:
        return None
    for above in reversed(lines[max(0, i - MASTHEAD_LINES) : i]):
        name = re.fullmatch(_JOURNAL, clean(above))
        if name and len(name.group(0).split()) >= 2 and not _NOT_JOURNAL.search(name.group(0)):
            return name.group(0), int(year), clean(lines[i])
    return None


def _citation_near(lines: Sequence[str], i: int) -> tuple[str, int, str] | None:
    """A citation line at ``lines[i]``, or one its neighbours complete."""
    found = _citation_in(lines[i])
    if found is not None:
        return found
    line = clean(lines[i])
    if i > 0 and _YEAR_VOLUME_LINE.match(line):
        name = _LEADING_NAME.match(clean(lines[i - 1]))
        if name and not _NOT_JOURNAL.search(name.group("journal")):
            return name.group("journal").strip(" .,"), int(line[:4]), line
    if _VOLUME_ONLY.match(line):
        found = _masthead(lines, i)
        if found is not None:
            return found
    if "(" in line:
        joined = clean(" ".join(lines[i : i + 4]))
        apa = _APA.search(joined)
        if apa and _APA.search(clean(" ".join(lines[i + 1 : i + 4]))) is None:
            return apa.group("journal").strip(" .,"), int(apa.group("year")), apa.group(0)
    return None


def _citations(signals: PdfSignals) -> Iterable[tuple[str, int, str]]:
    """Citation lines of the front page, then of the running headers and footers after it."""
    pages = signals.pages[:2] if _is_cover(signals) else signals.pages[:1]
    for page in pages:
        lines = _lines_before_references(page)
        for i, line in enumerate(lines):
            if not _UNPUBLISHED_DATE.search(line):
                found = _citation_near(lines, i)
                if found is not None:
                    yield found
    for page in signals.pages[len(pages) : len(pages) + 2]:
        lines = page.splitlines()
        for line in lines[:3] + lines[-3:]:
            found = _citation_in(line)
            if found is not None:
                yield found


def find_citation(signals: PdfSignals) -> Citation | None:
    """The paper's citation line (or the metadata's), with its journal and year."""
    if not signals.pages:
        return None
    later = [words(p) for p in signals.pages[1:4]]
    meta = [
        _citation_in(v) for k, v in signals.metadata.items() if k in ("Subject", "dc:identifier")
    ]
    meta_found = [m for m in meta if m is not None]
    for journal, year, quote in _citations(signals):
        key = words(journal)
        again = any(_contains(p, key) for p in later)
        in_meta = any(m[1] == year and words(m[0]) == key for m in meta_found)
        return Citation(journal, year, quote, again or in_meta)
    pages = signals.pages[:2] if _is_cover(signals) else signals.pages[:1]
    for journal, year, _ in meta_found:
        for page in pages:
            printed = _printed(words(journal), page)
            if printed and str(year) in page:
                return Citation(printed, year, printed, False)
    return find_venue(signals)


def find_venue(signals: PdfSignals) -> Citation | None:
    """A proceedings' or a conference's name where no citation line is printed.

    A conference's short name counts when it opens a line that gives the
    conference's dates ("CCS'15, October 12-16, 2015, Denver"), or on a line
    the running headers repeat ("... IPAC2018, Vancouver, BC, Canada"): a
    name-like word with digits in a sentence ("COVID-19, March 11, 2020") is
    neither. A two-digit year gives no year.
    """
    pages = signals.pages[:2] if _is_cover(signals) else signals.pages[:1]
    later = [{clean(x) for x in p.splitlines()} for p in signals.pages[1:4]]
    for page in pages:
        for raw in _lines_before_references(page):
            line = clean(raw)
            match = _PROCEEDINGS.match(line)
            if match:
                return Citation(
                    match.group("journal"), int(match.group("year")), match.group(0), False
                )
            code = _VENUE_CODE.search(line)
            if code is None:
                continue
            repeated = sum(line in p for p in later) >= 1
            date = re.search(_DATE, code.group("rest") or "") if code.start() == 0 else None
            if not (repeated or date):
                continue
            journal = code.group("journal")
            year = int(date.group("year")) if date else _four_digit_year(journal)
            return Citation(journal, year, line, repeated)
    return None


def _four_digit_year(code: str) -> int | None:
    match = re.search(r"(?:19|20)\d{2}$", code)
    return int(match.group(0)) if match else None


def _contains(haystack: list[str], needle: list[str]) -> bool:
    if not needle:
        return False
    n = len(needle)
    return any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def _is_cover(signals: PdfSignals) -> bool:
    """A front page that only announces the paper (a repository's or a preprint's cover)."""
    first = signals.pages[0] if signals.pages else ""
    return len(first.split()) < 250 and not re.search(r"\bAbstract\b|\bIntroduction\b", first)


def find_year(signals: PdfSignals) -> Signal | None:
    citation = find_citation(signals)
    if citation is not None and citation.year is not None:
        return Signal(citation.year, citation.quote, AGREED if citation.confirmed else PRINTED)
    pages = signals.pages[:2] if _is_cover(signals) else signals.pages[:1]
    for rank, pattern in enumerate(PUBLISHED_LINES):
        for page in pages:
            for line in _lines_before_references(page):
                if _UNPUBLISHED_DATE.search(line):
                    continue
                match = pattern.search(clean(line))
                if match:
                    return Signal(
                        int(match.group("year")), match.group(0), PRINTED if rank < 2 else HABIT
                    )
    return None


def find_journal(signals: PdfSignals) -> Signal | None:
    citation = find_citation(signals)
    if citation is None:
        return None
    return Signal(citation.journal, citation.quote, AGREED if citation.confirmed else PRINTED)


__all__ = [
    "Signal",
    "find_authors",
    "find_citation",
    "find_doi",
    "find_journal",
    "find_title",
    "find_year",
    "split_names",
    "title_block",
    "words",
]
