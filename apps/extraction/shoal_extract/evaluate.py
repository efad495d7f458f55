"""Accuracy against a key file: per field, how many documents got the true value.

The key (``key.json``, written by the corpus generator) lists every file by
the SHA-256 of its bytes, with the status it should end in and the true
value of each field (``null`` where the paper does not state one). A result
is matched to its truth by that hash, so renaming a file changes nothing.

A value counts as right when it equals the truth after normalising case,
whitespace, dashes and a trailing full stop; author lists compare name by
name. "Not found" is right exactly when the truth is ``null``. A document
that should have been extracted but ended in error counts as wrong for every
field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoal import InvalidInput


@dataclass(frozen=True, slots=True)
class KeyEntry:
    file: str
    sha256: str
    expected: str  # completed | error
    fields: Mapping[str, Any] | None
    layout: str | None = None  # the hard corpus: which layout the paper is in
    held_out: bool = False  # a layout the rules were not written against


@dataclass(frozen=True, slots=True)
class ResultRow:
    """What one item produced, as far as scoring cares."""

    sha256: str
    file: str
    status: str
    values: Mapping[str, Any] | None


@dataclass(frozen=True, slots=True)
class FieldScore:
    name: str
    correct: int
    total: int

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 1.0


@dataclass(frozen=True, slots=True)
class Miss:
    file: str
    field: str
    expected: Any
    got: Any


@dataclass(frozen=True, slots=True)
class Report:
    fields: tuple[FieldScore, ...]
    documents: int  # results matched to the key
    unmatched: int  # results whose file is not in the key
    status_right: int  # ended as the key says (completed, or error for a broken file)
    misses: tuple[Miss, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        return {
            "documents": self.documents,
            "unmatched": self.unmatched,
            "status_right": self.status_right,
            "fields": {
                f.name: {"correct": f.correct, "total": f.total, "accuracy": round(f.accuracy, 4)}
                for f in self.fields
            },
            "misses": [_miss(m) for m in self.misses],
        }


def _miss(miss: Miss) -> dict[str, Any]:
    return {"file": miss.file, "field": miss.field, "expected": miss.expected, "got": miss.got}


def load_key(path: Path) -> dict[str, KeyEntry]:
    """The key file's entries by SHA-256."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidInput("key", f"cannot read the key file {str(path)!r}: {exc}") from None
    docs = raw.get("documents") if isinstance(raw, dict) else None
    if not isinstance(docs, list):
        raise InvalidInput("key", f"{path}: expected an object with a 'documents' list")
    entries = {}
    for i, doc in enumerate(docs):
        try:
            entries[doc["sha256"]] = KeyEntry(
                file=doc["file"],
                sha256=doc["sha256"],
                expected=doc["expected"],
                fields=doc["fields"],
                layout=doc.get("layout"),
                held_out=bool(doc.get("held_out", False)),
            )
        except (KeyError, TypeError):
            raise InvalidInput(
                f"key.documents[{i}]", "needs file, sha256, expected and fields"
            ) from None
    return entries


_DASHES = re.compile("[\u2010\u2011\u2012\u2013\u2014\u2212]")  # hyphens, dashes, minus


def normalize(value: Any) -> Any:
    """The form two values are compared in."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value
    text = _DASHES.sub("-", str(value)).casefold()
    text = " ".join(text.split()).strip().strip("\"'“”").rstrip(".").strip()
    return text


def _names(value: Any) -> list[str] | None:
    if value is None:
        return None
    return [normalize(n) for n in re.split(r",\s*(?:and\s+)?|\s+and\s+|;\s*", str(value)) if n]


def is_right(name: str, expected: Any, got: Any) -> bool:
    if name == "authors":
        return _names(expected) == _names(got)
    if isinstance(expected, int) and isinstance(got, str) and got.strip().isdigit():
        return expected == int(got.strip())
    return bool(normalize(expected) == normalize(got))


SEEN = "layouts the rules were written against"
HELD_OUT = "held-out layouts (the rules never saw them)"


def split_key(key: Mapping[str, KeyEntry]) -> dict[str, dict[str, KeyEntry]]:
    """The key as one part, or as seen and held-out layouts when it has held-out ones.

    Accuracy on the held-out layouts is the honest number: the rules were
    written against the others, so they score those well by construction.
    """
    held = {sha: e for sha, e in key.items() if e.held_out}
    if not held:
        return {"": dict(key)}
    return {SEEN: {sha: e for sha, e in key.items() if not e.held_out}, HELD_OUT: held}


def score(
    results: Iterable[ResultRow], key: Mapping[str, KeyEntry], fields: Sequence[str]
) -> Report:
    """Per-field accuracy of ``results`` against ``key``, over the fields the key knows."""
    correct = dict.fromkeys(fields, 0)
    total = dict.fromkeys(fields, 0)
    misses: list[Miss] = []
    documents = unmatched = status_right = 0
    for row in results:
        entry = key.get(row.sha256)
        if entry is None:
            unmatched += 1
            continue
        documents += 1
        status_right += row.status == entry.expected
        if entry.fields is None:
            continue
        for name in fields:
            if name not in entry.fields:
                continue
            total[name] += 1
            expected = entry.fields[name]
            got = (row.values or {}).get(name) if row.status == "completed" else None
            if row.status == "completed" and is_right(name, expected, got):
                correct[name] += 1
            else:
                misses.append(
                    Miss(row.file, name, expected, got if row.status == "completed" else row.status)
                )
    scores = tuple(FieldScore(n, correct[n], total[n]) for n in fields if total[n])
    return Report(scores, documents, unmatched, status_right, tuple(misses))


__all__ = [
    "HELD_OUT",
    "SEEN",
    "KeyEntry",
    "Report",
    "ResultRow",
    "is_right",
    "load_key",
    "normalize",
    "score",
    "split_key",
]
