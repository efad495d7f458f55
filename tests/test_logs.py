"""``--log-format json``: one JSON object per line, from shoal's loggers and uvicorn's.

(A worker process's JSON lines, with the queue and job id of a failed job,
are checked in tests/test_observe_processes.py.)
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys

import httpx
import pytest

from shoal.cli import main
from shoal.cli.parse import parser
from shoal.logs import JsonFormatter

from .conftest import wait_for
from .test_observe_processes import free_port
from .test_processes import REPO


def record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("shoal.worker", logging.WARNING, __file__, 1, message, args, None)
    for key, value in extra.items():
        setattr(rec, key, value)
    return rec


def test_a_record_is_one_json_line_with_its_extra_fields() -> None:
    line = JsonFormatter().format(record("job %s failed:\nbadly", 7, queue="email", job_id=7))
    assert "\n" not in line
    fields = json.loads(line)
    assert fields["time"].endswith("+00:00")
    assert (fields["level"], fields["logger"], fields["message"]) == (
        "WARNING",
        "shoal.worker",
        "job 7 failed:\nbadly",
    )
    assert (fields["queue"], fields["job_id"], fields["process"]) == ("email", 7, os.getpid())


def test_an_exception_is_kept_as_its_formatted_traceback() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        rec = logging.LogRecord("shoal", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())
    fields = json.loads(JsonFormatter().format(rec))
    assert fields["exception"].startswith("Traceback") and "ValueError: boom" in fields["exception"]


def test_an_extra_json_cannot_hold_is_written_as_text() -> None:
    fields = json.loads(JsonFormatter().format(record("x", queue=object(), ids=(1, 2))))
    assert fields["queue"].startswith("<object object") and fields["ids"] == [1, 2]


def test_log_format_is_text_or_json_from_the_flag_or_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = parser().parse_args(["worker", "--app", "m:a", "--log-format", "JSON"])
    assert args.log_format == "json"
    with pytest.raises(SystemExit):
        parser().parse_args(["api", "--app", "m:a", "--log-format", "xml"])
    assert "argument --log-format: must be one of text, json" in capsys.readouterr().err
    monkeypatch.setenv("SHOAL_LOG_FORMAT", "yaml")
    assert main(["worker", "--app", "m:a"]) == 2
    assert "SHOAL_LOG_FORMAT" in capsys.readouterr().err


async def test_shoal_api_writes_json_lines_when_asked(db_url: str) -> None:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "shoal.cli", "--database-url", db_url, "api"],
        *["--app", "shoal.demo:app", "--port", str(port)],
        env={k: v for k, v in os.environ.items() if k != "SHOAL_API_TOKEN"}
        | {"SHOAL_LOG_FORMAT": "json"},
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with httpx.AsyncClient() as c:

            async def up() -> bool:
                assert proc.returncode is None, "shoal api exited early"
                try:
                    return (await c.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200
                except httpx.TransportError:
                    return False

            await wait_for(up, timeout_s=30, interval_s=0.1)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(proc.communicate(), timeout=20)
    assert proc.returncode == 0, output.decode(errors="replace")
    records = [json.loads(line) for line in output.decode().splitlines() if line.strip()]
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    loggers = {r["logger"] for r in records}
    assert "shoal.cli" in loggers  # where it serves
    assert "uvicorn.access" in loggers  # the /healthz requests
    assert any(f"127.0.0.1:{port}" in r["message"] for r in records)
