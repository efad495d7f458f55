"""Usage errors of ``shoal api`` exit 2 with one line, like every other usage error."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from shoal.cli import main
from shoal.cli.parse import parser

ROOT = Path(__file__).parent.parent


def test_a_non_loopback_bind_without_a_token_exits_2_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SHOAL_API_TOKEN", raising=False)
    monkeypatch.delenv("SHOAL_HOST", raising=False)
    monkeypatch.setenv("COLUMNS", "60")  # a narrow terminal must not wrap the error
    assert main(["api", "--app", "shoal.demo:app", "--host", "0.0.0.0"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: --host: refusing to serve on '0.0.0.0' without a token"), line


@pytest.mark.parametrize("value", ["0", "-5", "lots"])
def test_a_max_body_bytes_below_one_is_an_argparse_error(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        parser().parse_args(["api", "--app", "m:a", "--max-body-bytes", value])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --max-body-bytes: must be a whole number >= 1, got '{value}'" in err


def test_h11_which_the_api_server_imports_is_a_dependency_of_the_api_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extra = project["optional-dependencies"]["api"]
    names = [re.split(r"[<>=\[ ]", dep)[0] for dep in extra]
    assert "h11" in names and "uvicorn" in names
