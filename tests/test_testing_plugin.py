"""shoal.testing.pytest_plugin, used as an application's suite uses it.

Each test writes a small project (its conftest.py and test files) with
pytester and runs pytest on it in a subprocess, as a user's ``pytest`` would:
the files of docs/testing.md's "pytest fixtures" section, as written there,
and a suite that checks the databases are the tests' own.
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

pytest_plugins = ["pytester"]

TESTING_MD = Path(__file__).parent.parent / "docs" / "testing.md"
CONFTEST = 'pytest_plugins = ["shoal.testing.pytest_plugin"]\n'


def files_of_the_docs() -> dict[str, str]:
    """The Python blocks of docs/testing.md that start with ``# NAME.py``: a file each."""
    text = TESTING_MD.read_text(encoding="utf-8")
    files = {}
    for block in re.findall(r"^```python\n(.*?)^```$", text, re.M | re.S):
        first, _, rest = block.partition("\n")
        named = re.fullmatch(r"# (\w+\.py)", first)
        if named:
            files[named[1]] = rest
    return files


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    # The project's own settings, not shoal's pyproject.toml: strict asyncio mode,
    # warnings as pytest's defaults, no xdist.
    pytester.makeini(
        "[pytest]\nasyncio_mode = strict\nasyncio_default_fixture_loop_scope = function\n"
    )
    return pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:xdist", *args)


def test_the_docs_example_passes_with_the_fixtures(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, pg_server: str
) -> None:
    files = files_of_the_docs()
    assert set(files) == {"conftest.py", "test_welcome.py"}
    assert files["conftest.py"] == CONFTEST
    monkeypatch.setenv("DATABASE_URL", pg_server)
    for name, text in files.items():
        pytester.makepyfile(**{name.removesuffix(".py"): text})
    result = run(pytester)
    result.assert_outcomes(passed=1)


ISOLATION = """
from pathlib import Path

import pytest

from shoal import FakeClock, Shoal
from shoal.testing import assert_enqueued, refute_enqueued

SEEN = Path(__file__).parent / "databases.txt"


@pytest.mark.asyncio
@pytest.mark.parametrize("run", [1, 2])
async def test_each_test_starts_on_an_empty_migrated_database(
    run: int,
    shoal_client: Shoal,
    shoal_clock: FakeClock,
    shoal_database_url: str,
    shoal_template_database: str,
) -> None:
    with SEEN.open("a") as seen:
        seen.write(f"{shoal_database_url}\\t{shoal_template_database}\\n")
    await refute_enqueued(shoal_client, "email")  # the other run's job is not here
    await shoal_client.send("email", {"run": run})
    await assert_enqueued(shoal_client, "email", {"run": run})
    assert shoal_client.clock is shoal_clock
"""


def test_each_test_gets_a_database_of_its_own_dropped_after_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, pg_server: str
) -> None:
    monkeypatch.setenv("DATABASE_URL", pg_server)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_isolation=ISOLATION)
    result = run(pytester)
    result.assert_outcomes(passed=2)
    seen = (pytester.path / "databases.txt").read_text().splitlines()
    lines = [line.split("\t") for line in seen]
    names = {conninfo_to_dict(url)["dbname"] for url, _ in lines}
    templates = {template for _, template in lines}
    assert len(names) == 2 and len(templates) == 1  # migrated once, cloned per test
    with psycopg.connect(pg_server, autocommit=True) as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE datname = ANY(%s)", [[*names, *templates]]
        ).fetchall()
    assert left == []  # the tests' databases and the template are gone


def test_without_database_url_the_fixtures_say_what_is_missing(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_url="def test_url(shoal_database_url):\n    pass\n")
    result = run(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*set DATABASE_URL to a PostgreSQL server*"])
