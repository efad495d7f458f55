"""The development set's papers, each parsed once per test run.

Two tests read every paper of the set (the parse's words, the fields'
figures); a parse costs seconds a paper, so they share one, cached by file.
"""

from __future__ import annotations

import functools
from pathlib import Path

from shoal_extract.parsing import DocumentFormat, ParsedText, parse_document


def parsed_paper(path: Path) -> ParsedText:
    """``path``'s PDF parsed as the workbench parses it (the same object for the same file)."""
    return _parsed(path.resolve())


@functools.cache
def _parsed(path: Path) -> ParsedText:
    return parse_document(path.read_bytes(), DocumentFormat.PDF)
