"""``shoal api`` refuses a whitespace-only token with one line naming where it came from."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
CLI = [sys.executable, "-m", "shoal.cli"]


def shoal_api(*args: str, db_url: str, token_env: str | None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "60"}  # a narrow terminal must not wrap the error
    env.pop("SHOAL_API_TOKEN", None)
    if token_env is not None:
        env["SHOAL_API_TOKEN"] = token_env
    return subprocess.run(
        [*CLI, "--database-url", db_url, "api", "--app", "shoal.demo:app", "--port", "1", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("args", "token_env", "setting"),
    [
        ((), "  ", "SHOAL_API_TOKEN"),
        ((), "\t", "SHOAL_API_TOKEN"),
        (("--host", "0.0.0.0"), "   ", "SHOAL_API_TOKEN"),
        (("--token", "  "), None, "--token"),
        (("--token", " ", "--host", "0.0.0.0"), "real-token", "--token"),
    ],
)
def test_a_whitespace_token_is_refused_with_one_line_naming_the_setting(
    db_url: str, args: tuple[str, ...], token_env: str | None, setting: str
) -> None:
    result = shoal_api(*args, db_url=db_url, token_env=token_env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: {setting}: the bearer token is only whitespace"), lines[0]
    assert "Traceback" not in result.stderr
