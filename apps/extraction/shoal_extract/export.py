"""A task's results as CSV (one column per field) or JSON Lines (one object per document).

CSV is for a spreadsheet: ``file, status, <each field>, field_errors, error,
tokens, cost_usd, flagged, corrected``, then each field's evidence:
``<field>.page``, ``<field>.confidence``, ``<field>.quote``, ``<field>.source``
(the extractor the value came from: ``rules`` or ``llm``), and its review:
``<field>.review`` (accepted or corrected), ``<field>.original`` (what was
extracted), ``<field>.reviewer``, ``<field>.reviewed_at``. A field's column
holds the value a reviewer stands by (the extracted one when nobody corrected
it); ``corrected`` lists the fields a person corrected. A field not found is an
empty cell and says why in ``field_errors``; ``flagged`` lists the fields
whose quote is not in the source text. JSON Lines keeps types (numbers stay
numbers, not-found is ``null``, evidence and reviews are objects per field)
and is the format to feed another program.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from shoal_extract.workbench import ResultLine, ResultsPage

ExportFormat = Literal["csv", "jsonl"]
FORMATS: tuple[ExportFormat, ...] = ("csv", "jsonl")
EVIDENCE_PARTS = ("page", "confidence", "quote", "source")
REVIEW_PARTS = ("review", "original", "reviewer", "reviewed_at")
MEDIA_TYPES = {"csv": "text/csv; charset=utf-8", "jsonl": "application/x-ndjson"}


def csv_header(fields: tuple[str, ...]) -> list[str]:
    return [
        "document_id",
        "file",
        "sha256",
        "status",
        "attempts",
        *fields,
        "field_errors",
        "error",
        "tokens",
        "cost_usd",
        "flagged",
        "corrected",
        *(f"{name}.{part}" for name in fields for part in EVIDENCE_PARTS),
        *(f"{name}.{part}" for name in fields for part in REVIEW_PARTS),
    ]


def _csv_row(line: ResultLine, fields: tuple[str, ...]) -> list[object]:
    values = ["" if line.fields.get(f) is None else line.fields[f] for f in fields]
    errors = "; ".join(f"{name}: {why}" for name, why in line.field_errors.items())
    return [
        "" if line.document_id is None else line.document_id,
        line.file,
        line.sha256,
        line.status,
        line.attempts,
        *values,
        errors,
        line.error or "",
        line.usage.tokens,
        f"{line.usage.cost_usd:.6f}",
        " ".join(line.flagged),
        " ".join(line.corrected),
        *(
            _cell(line.evidence.get(name, {}).get(part))
            for name in fields
            for part in EVIDENCE_PARTS
        ),
        *(cell for name in fields for cell in _review_cells(line, name)),
    ]


def _review_cells(line: ResultLine, name: str) -> list[object]:
    review = line.reviews.get(name)
    if review is None:
        return ["", "", "", ""]
    return [review.action, _cell(review.original), review.reviewer, review.at.isoformat()]


def _cell(value: object) -> object:
    return "" if value is None else value


def _csv_line(row: list[object]) -> str:
    out = io.StringIO()
    csv.writer(out).writerow(row)
    return out.getvalue()


def export_lines(page: ResultsPage, fmt: ExportFormat) -> Iterator[str]:
    """The export, line by line."""
    if fmt == "csv":
        yield _csv_line(list(csv_header(page.fields)))
        for line in page.lines:
            yield _csv_line(_csv_row(line, page.fields))
    else:
        for line in page.lines:
            yield json.dumps(line.as_dict(), ensure_ascii=False) + "\n"


def write_export(page: ResultsPage, fmt: ExportFormat, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as out:
        out.writelines(export_lines(page, fmt))
    return path


__all__ = ["FORMATS", "MEDIA_TYPES", "ExportFormat", "export_lines", "write_export"]
