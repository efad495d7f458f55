"""Field accuracy of the rules extractor on the development set of real papers.

    .venv/bin/python -m bench.papers_bench              # prints the figures, writes the record
    .venv/bin/python -m bench.papers_bench --misses     # and every wrong value

Every PDF of ``shared/corpus/papers`` (found among the repository's parents,
or ``SHOAL_PAPERS_DIR``) is parsed as the worker parses it, its fields
extracted by the ``rules`` extractor and checked for evidence as the worker
checks them, and scored against the hand-written ``key.json``
(:mod:`shoal_extract.devset` says how). It prints per field right / wrong /
missing against the issue's targets, the DOI among papers that print one and
DOIs invented where none is printed, wrong values as a share of all fields,
and precision per confidence band, and writes the same figures (no paper
text) to ``bench/runs/<date>-extraction-<commit>.md``.

When the set is absent it says so in one line and exits 0.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from shoal_extract.devset import (
    Scores,
    load_papers,
    papers_dir,
    report_lines,
    score_paper,
    wrong_lines,
)
from shoal_extract.evidence import check_evidence
from shoal_extract.extractors.rules import extract_fields
from shoal_extract.parsing import DocumentFormat, ParseError, parse_document
from shoal_extract.templates import CLINICAL_TRIAL, Template

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = Template(
    name="papers_bench",
    fields=tuple(
        f
        for f in CLINICAL_TRIAL.fields
        if f.name in {"title", "authors", "year", "journal", "doi", "sample_size"}
    ),
)


def run(folder: Path) -> tuple[Scores, float]:
    scores = Scores()
    started = time.process_time()
    for paper in load_papers(folder):
        content = (folder / "pdfs" / paper.file).read_bytes()
        try:
            parsed = parse_document(content, DocumentFormat.PDF)
        except ParseError:
            score_paper(scores, paper, {}, {})
            continue
        extraction = extract_fields(parsed, TEMPLATE)
        evidence = check_evidence(
            parsed, extraction.values, extraction.quotes, extraction.confidence
        )
        score_paper(scores, paper, extraction.values, {k: e.as_dict() for k, e in evidence.items()})
    return scores, time.process_time() - started


def _commit() -> str:
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    return out.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--misses", action="store_true", help="also list every wrong value")
    parser.add_argument("--no-record", action="store_true", help="do not write bench/runs/")
    args = parser.parse_args(argv)
    folder = papers_dir(ROOT)
    if folder is None:
        print("papers bench: no development set (shared/corpus/papers or SHOAL_PAPERS_DIR)")
        return 0
    scores, cpu = run(folder)
    papers = len(load_papers(folder))
    commit = _commit()
    lines = [
        f"# Rules extractor on the development set ({papers} real papers)",
        "",
        f"commit {commit}, {datetime.now(UTC):%Y-%m-%d}, "
        f"parse + extraction + evidence {cpu:.1f} CPU-seconds; "
        "`python -m bench.papers_bench`",
        "",
        *report_lines(scores),
    ]
    print("\n".join(lines))
    if args.misses:
        print("\n".join(["", "wrong values:", *wrong_lines(scores.wrong_list)]))
    if not args.no_record:
        runs = ROOT / "bench" / "runs"
        runs.mkdir(exist_ok=True)
        record = runs / f"{datetime.now(UTC):%Y-%m-%d}-extraction-{commit}.md"
        record.write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"\nrecord: {record.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
