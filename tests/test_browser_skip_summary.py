"""A run whose browser tests were skipped says so in one loud line at its end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .conftest import BROWSER_SKIP, PROGRAM_SKIP, REQUIRE_PROGRAMS

ROOT = Path(__file__).resolve().parent.parent


def _run_pytest(tmp_path: Path, tests: str, env: dict[str, str] | None = None) -> list[str]:
    """pytest on ``tests`` with this suite's summary hook; its output lines."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_terminal_summary  # noqa: F401\n"
    )
    (tmp_path / "test_pages.py").write_text(tests)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.stdout.splitlines()


def test_skipped_browser_tests_are_named_in_one_line_just_above_the_result(
    tmp_path: Path,
) -> None:
    skip = f"pytest.skip({BROWSER_SKIP + '/usr/bin/chromium is missing'!r})"
    lines = _run_pytest(
        tmp_path,
        "import pytest\n"
        "def test_other(): pass\n"
        f"def test_dashboard(): {skip}\n"
        f"def test_workbench(): {skip}\n",
    )
    assert lines[-2] == (
        "BROWSER TESTS SKIPPED (2): /usr/bin/chromium is missing (README: Browser tests)"
    ), lines
    assert lines[-1].startswith("1 passed, 2 skipped"), lines


def test_a_run_with_no_browser_test_skipped_prints_no_such_line(tmp_path: Path) -> None:
    lines = _run_pytest(
        tmp_path,
        "import pytest\ndef test_other(): pass\ndef test_slow(): pytest.skip('other reason')\n",
    )
    assert not any("BROWSER TESTS SKIPPED" in line for line in lines), lines
    assert lines[-1].startswith("1 passed, 1 skipped"), lines


PROGRAM_TESTS = (
    "from tests.conftest import require_program\n"
    "def test_other(): pass\n"
    "def test_rules(): require_program('no-such-promtool', 'prometheus')\n"
    "def test_rules_again(): require_program('no-such-promtool', 'prometheus')\n"
)


def test_tests_skipped_for_a_missing_program_are_named_in_one_line(tmp_path: Path) -> None:
    lines = _run_pytest(tmp_path, PROGRAM_TESTS)
    assert lines[-2] == (
        "TESTS SKIPPED FOR MISSING PROGRAMS (2): no-such-promtool is missing: install it with "
        "`apt-get install -y prometheus` (README: Set-up)"
    ), lines
    assert any(PROGRAM_SKIP in line for line in lines), lines
    assert lines[-1].startswith("1 passed, 2 skipped"), lines


def test_where_the_packages_are_required_a_missing_program_fails(tmp_path: Path) -> None:
    lines = _run_pytest(tmp_path, PROGRAM_TESTS, env={REQUIRE_PROGRAMS: "1"})
    assert lines[-1].startswith("2 failed, 1 passed"), lines
    assert not any("TESTS SKIPPED FOR MISSING PROGRAMS" in line for line in lines), lines
