"""A bad ``--app`` is one line naming what was not found; a bug inside the app keeps its traceback.

``--app nomod:app`` used to print a 31-line traceback and ``--app mod:nope``
said "not a shoal.App (got NoneType)". A module that exists but fails to import
something of its own is the user's bug, and its traceback must still show.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

MODULES = {
    "edgeapp.py": "from shoal import App\napp = App()\nnumber = 1\n",
    "edgebroken.py": "import shoal_nosuch_dependency\nfrom shoal import App\napp = App()\n",
}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for name, text in MODULES.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def shoal_cli(*args: str, cwd: Path, db_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shoal.cli", "--database-url", db_url, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "60"},  # a narrow terminal must not wrap the error
        cwd=cwd,
        timeout=120,
    )


@pytest.mark.parametrize("command", ["worker", "api"])
@pytest.mark.parametrize(
    ("spec", "line"),
    [
        ("nomod:app", "error: --app nomod:app: no module named 'nomod'"),
        ("nopkg.sub:app", "error: --app nopkg.sub:app: no module named 'nopkg'"),
        ("edgeapp.sub:app", "error: --app edgeapp.sub:app: no module named 'edgeapp.sub'"),
        ("edgeapp:nope", "error: --app edgeapp:nope: module 'edgeapp' has no attribute 'nope'"),
        ("edgeapp:app.nope", "error: --app edgeapp:app.nope: App 'app' has no attribute 'nope'"),
        ("edgeapp:number", "error: --app edgeapp:number: is not a shoal.App (it is of type int)"),
        (
            "edgeapp",
            "error: --app edgeapp: expected the form module:attribute, e.g. myproject.tasks:app",
        ),
        (
            "edgeapp:",
            "error: --app edgeapp:: expected the form module:attribute, e.g. myproject.tasks:app",
        ),
    ],
)
def test_a_bad_app_spec_is_one_line_naming_what_is_missing(
    project: Path, db_url: str, command: str, spec: str, line: str
) -> None:
    result = shoal_cli(command, "--app", spec, cwd=project, db_url=db_url)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [line]


def test_an_import_error_inside_the_app_module_keeps_its_traceback(
    project: Path, db_url: str
) -> None:
    result = shoal_cli("worker", "--app", "edgebroken:app", cwd=project, db_url=db_url)
    assert result.returncode == 1, result.stderr
    assert "Traceback" in result.stderr
    assert 'edgebroken.py", line 1' in result.stderr
    assert "No module named 'shoal_nosuch_dependency'" in result.stderr
