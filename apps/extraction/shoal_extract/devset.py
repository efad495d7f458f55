"""Scoring the rules extractor on the development set of real papers.

The set (``shared/corpus/papers``: ``pdfs/`` and ``key.json``) is not part of
the repository: its papers are not openly licensed. It is found through
``SHOAL_PAPERS_DIR`` or as ``shared/corpus/papers`` in a parent of a given
folder (the repository root); :func:`papers_dir` returns None when it is
absent, and the bench and the test then say so and stop.

Scoring is per field, against the key's hand-written values:

- **title**: the same words in the same order (case, punctuation and
  whitespace aside: a subtitle printed on its own line matches "Title:
  Subtitle");
- **first author**: the first name of the authors value ends with the key's
  ``first_author`` surname;
- **year**, **DOI**, **sample size**: equal (DOI case-insensitively); a DOI is
  right as "not found" exactly when the paper prints none;
- **journal**: the key's journal or one of its ``journal_variants``
  (abbreviations as printed), or "not found" where the key has none.

Every value is right, wrong or missing; a miss is better than a wrong value.
Precision per confidence band counts right and wrong values by the
confidence their evidence was given.
"""

from __future__ import annotations

import json
import os
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoal_extract.evaluate import normalize

PAPERS_ENV = "SHOAL_PAPERS_DIR"
PAPERS_SUBDIR = Path("shared/corpus/papers")
FIELDS = ("title", "first_author", "year", "journal", "doi", "sample_size")
# Confidence bands, highest first: a value's band is the first whose floor it reaches.
BANDS: tuple[tuple[str, float], ...] = (
    ("top (>= 0.9)", 0.9),
    ("middle (0.5-0.9)", 0.5),
    ("low (< 0.5)", 0.0),
)


def papers_dir(start: Path) -> Path | None:
    """The development set's folder (with ``key.json``), or None when it is absent."""
    env = os.environ.get(PAPERS_ENV)
    if env:
        path = Path(env)
        return path if (path / "key.json").is_file() else None
    for parent in (start, *start.parents):
        candidate = parent / PAPERS_SUBDIR
        if (candidate / "key.json").is_file():
            return candidate
    return None


@dataclass(frozen=True, slots=True)
class Paper:
    """One entry of the key: the file and what each scored field should be."""

    file: str
    group: str
    truth: Mapping[str, Any]
    journal_variants: tuple[str, ...] = ()


def load_papers(folder: Path) -> list[Paper]:
    raw = json.loads((folder / "key.json").read_text(encoding="utf-8"))
    papers = []
    for doc in raw["documents"]:
        truth = dict(doc["fields"])
        truth["first_author"] = doc.get("first_author")
        papers.append(
            Paper(
                file=doc["file"],
                group=doc.get("group", ""),
                truth=truth,
                journal_variants=tuple(doc.get("journal_variants") or ()),
            )
        )
    return papers


def _words(text: str) -> list[str]:
    folded = unicodedata.normalize("NFKD", str(text)).casefold()
    folded = "".join(c for c in folded if not unicodedata.combining(c))
    return re.findall(r"[^\W_]+", folded)


def first_author(authors: Any) -> str | None:
    """The first name of an authors value ("A. Smith, B. Jones" -> "A. Smith")."""
    if not authors:
        return None
    first = re.split(r",\s*|;\s*|\s+and\s+", str(authors))[0]
    return first.strip() or None


def verdict(name: str, paper: Paper, got: Any) -> str:
    """``right``, ``wrong`` or ``missing`` for one field's value."""
    expected = paper.truth.get(name)
    if got is None:
        return "right" if expected is None and name != "first_author" else "missing"
    if name == "first_author":
        surname, printed = _words(expected or ""), _words(got)
        ok = bool(surname) and printed[-len(surname) :] == surname
    elif name == "title":
        ok = _words(got) == _words(expected or "")
    elif name == "journal":
        accepted = [expected, *paper.journal_variants] if expected else []
        ok = any(_words(got) == _words(a) for a in accepted)
    elif name == "doi":
        ok = expected is not None and str(got).casefold() == str(expected).casefold()
    else:
        ok = expected is not None and normalize(got) == normalize(expected)
    return "right" if ok else "wrong"


@dataclass(slots=True)
class Tally:
    right: int = 0
    wrong: int = 0
    missing: int = 0

    @property
    def total(self) -> int:
        return self.right + self.wrong + self.missing

    def add(self, outcome: str) -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)


@dataclass(slots=True)
class Scores:
    fields: dict[str, Tally] = field(default_factory=lambda: {n: Tally() for n in FIELDS})
    bands: dict[str, Tally] = field(default_factory=lambda: {b: Tally() for b, _ in BANDS})
    doi_printed: Tally = field(default_factory=Tally)
    doi_invented: int = 0  # a DOI given for a paper that prints none
    doi_absent: int = 0
    unverified: Tally = field(default_factory=Tally)  # values flagged: right or wrong
    wrong_list: list[tuple[str, str, Any, Any]] = field(default_factory=list)

    @property
    def all_fields(self) -> Tally:
        total = Tally()
        for tally in self.fields.values():
            total.right += tally.right
            total.wrong += tally.wrong
            total.missing += tally.missing
        return total


def band_of(confidence: float) -> str:
    return next(name for name, floor in BANDS if confidence >= floor)


def score_paper(
    scores: Scores,
    paper: Paper,
    values: Mapping[str, Any],
    evidence: Mapping[str, Mapping[str, Any]],
) -> None:
    """Add one paper's values (and their evidence: confidence, verified) to ``scores``."""
    got = dict(values)
    got["first_author"] = first_author(values.get("authors"))
    for name in FIELDS:
        if name == "sample_size" and paper.group != "trial":
            continue
        outcome = verdict(name, paper, got.get(name))
        scores.fields[name].add(outcome)
        source = "authors" if name == "first_author" else name
        proof = evidence.get(source)
        if got.get(name) is not None and proof is not None:
            scores.bands[band_of(float(proof["confidence"]))].add(outcome)
            if not proof["verified"]:
                scores.unverified.add(outcome)
        if outcome == "wrong":
            scores.wrong_list.append((paper.file, name, paper.truth.get(name), got.get(name)))
    if paper.truth.get("doi") is not None:
        scores.doi_printed.add(verdict("doi", paper, got.get("doi")))
    else:
        scores.doi_absent += 1
        scores.doi_invented += got.get("doi") is not None


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


# The targets: share of right values per field.
TARGETS = {
    "title": 0.95,
    "first_author": 0.90,
    "year": 0.90,
    "journal": 0.85,
    "sample_size": 0.75,
}
DOI_TARGET = 0.95
MAX_WRONG_SHARE = 0.02
TOP_BAND_PRECISION = 0.98


def report_lines(scores: Scores) -> list[str]:
    """The figures as Markdown: per field, DOI, wrong share, confidence bands."""
    out = ["| field | right | wrong | missing | accuracy | target |", "|---|---|---|---|---|---|"]
    for name, tally in scores.fields.items():
        target = TARGETS.get(name)
        out.append(
            f"| {name} | {tally.right} | {tally.wrong} | {tally.missing} | "
            f"{_pct(tally.right, tally.total)} | {'-' if target is None else f'{target:.0%}'} |"
        )
    printed = scores.doi_printed
    total = scores.all_fields
    out += [
        "",
        f"DOI: {printed.right} of {printed.total} printed DOIs right "
        f"({_pct(printed.right, printed.total)}, target {DOI_TARGET:.0%}), "
        f"{printed.wrong} wrong; {scores.doi_invented} invented for the "
        f"{scores.doi_absent} papers that print none (target 0)",
        f"wrong values: {total.wrong} of {total.total} fields "
        f"({_pct(total.wrong, total.total)}, target at most {MAX_WRONG_SHARE:.0%})",
        f"flagged (quote not found in pdfium's text of the page): "
        f"{scores.unverified.right} right, {scores.unverified.wrong} wrong",
        "",
        "| confidence band | right | wrong | precision |",
        "|---|---|---|---|",
    ]
    for name, tally in scores.bands.items():
        decided = tally.right + tally.wrong
        out.append(f"| {name} | {tally.right} | {tally.wrong} | {_pct(tally.right, decided)} |")
    return out


def wrong_lines(wrong: Iterable[tuple[str, str, Any, Any]]) -> list[str]:
    return [
        f"- {file} {name}: expected {exp!r:.70}, got {got!r:.70}" for file, name, exp, got in wrong
    ]


def summary(scores: Scores) -> dict[str, float]:
    """Accuracy per field, DOI share of printed, wrong share, top band precision."""
    out = {n: t.right / t.total for n, t in scores.fields.items() if t.total}
    printed = scores.doi_printed
    out["doi_printed"] = printed.right / printed.total if printed.total else 1.0
    total = scores.all_fields
    out["wrong_share"] = total.wrong / total.total if total.total else 0.0
    top = scores.bands[BANDS[0][0]]
    out["top_band_precision"] = (
        top.right / (top.right + top.wrong) if top.right + top.wrong else 1.0
    )
    return out


__all__: Sequence[str] = [
    "BANDS",
    "FIELDS",
    "Paper",
    "Scores",
    "load_papers",
    "papers_dir",
    "report_lines",
    "score_paper",
    "summary",
    "verdict",
]
