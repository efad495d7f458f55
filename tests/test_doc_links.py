"""Every relative link of the repository's Markdown pages leads somewhere.

A link ``[text](path)`` or ``![alt](path)``, or a reference definition
``[label]: path``, must name a file or folder that exists, relative to the
page; a ``#fragment`` on a Markdown page (the same page or another) must be
one of that page's headings, as GitHub makes their anchors. Links with a
scheme (``https:``, ``mailto:``) are not followed. Code (fenced blocks and
inline spans) is left out. The run records in ``bench/runs/`` are kept as
they were written, so their links are not checked.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
FROZEN = ROOT / "bench" / "runs"
SKIPPED_DIRS = {"build", "dist", "node_modules", "__pycache__"}

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def pages() -> list[Path]:
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(
            d
            for d in dirs
            if not d.startswith(".")
            and d not in SKIPPED_DIRS
            and not d.endswith(".egg-info")
            and Path(folder, d) != FROZEN
        )
        found += [Path(folder, f) for f in sorted(files) if f.endswith(".md")]
    return found


def prose_lines(text: str, spans: bool = False) -> Iterator[tuple[int, str]]:
    """(line number, line) outside fenced code; inline code spans blanked unless ``spans``."""
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        opening = FENCE.match(line)
        if fence is None and opening:
            fence = opening[1]
        elif fence is not None:
            if line.strip().startswith(fence):
                fence = None
        else:
            yield number, line if spans else CODE_SPAN.sub("", line)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(page.read_text(encoding="utf-8"), spans=True):
        match = HEADING.match(line)
        if match is None:
            continue
        base = anchor(match[2])
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> Iterator[tuple[int, str]]:
    for number, line in prose_lines(page.read_text(encoding="utf-8")):
        for match in INLINE.finditer(line):
            yield number, match[1]
        definition = DEFINITION.match(line)
        if definition:
            yield number, definition[1]


def broken(page: Path, root: Path = ROOT) -> list[str]:
    """Each link of ``page`` that leads nowhere, as ``path:line: target (why)``."""
    problems = []
    for number, target in links(page):
        if SCHEME.match(target):
            continue
        path, _, fragment = target.partition("#")
        where = f"{page.relative_to(root)}:{number}: {target}"
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            problems.append(f"{where} (no such file)")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            problems.append(f"{where} (no heading with that anchor)")
    return problems


PAGES = pages()


def test_the_pages_are_found() -> None:
    names = {page.relative_to(ROOT).as_posix() for page in PAGES}
    assert {"README.md", "docs/benchmarks.md", "apps/polling/README.md"} <= names
    assert not any(name.startswith("bench/runs/") for name in names)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_relative_link_of_the_page_resolves(page: Path) -> None:
    assert broken(page) == []


def test_the_check_finds_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# A page\n\n## Its `part` (two)\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "# Here\n\n"
        "[fine](other.md#its-part-two) [self](#here) [web](https://example.com/x.md)\n"
        "[gone](missing.md) [no part](other.md#nowhere)\n"
        "`[code](skipped.md)`\n\n"
        "```\n[fenced](skipped.md)\n```\n\n"
        "[label]: also-missing.md\n",
        encoding="utf-8",
    )
    found = [problem.split(": ", 1)[1] for problem in broken(page, tmp_path)]
    assert found == [
        "missing.md (no such file)",
        "other.md#nowhere (no heading with that anchor)",
        "also-missing.md (no such file)",
    ]
