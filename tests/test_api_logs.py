"""What ``shoal api`` logs, in the real process: timestamped text lines, the
console's polls at DEBUG, a switch for the access log; and a port that is
taken is one error line and a non-zero exit, with no "serving" said first
(issue 38, item 8)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import sys

import httpx

from .conftest import wait_for
from .test_observe_processes import free_port
from .test_processes import REPO

# shoal.logs.TEXT_FORMAT: "%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"
TIMESTAMPED = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ \S+ \[\d+\] ")


def api_command(db_url: str, port: int, *extra: str) -> list[str]:
    return [
        *[sys.executable, "-m", "shoal.cli", "--database-url", db_url],
        *extra,
        *["api", "--app", "shoal.demo:app", "--port", str(port)],
    ]


def environment() -> dict[str, str]:
    drop = {"SHOAL_API_TOKEN", "SHOAL_LOG_FORMAT", "SHOAL_LOG_LEVEL", "SHOAL_PORT"}
    return {k: v for k, v in os.environ.items() if k not in drop}


async def serve_and_poll(db_url: str, *options: str, before: tuple[str, ...] = ()) -> list[str]:
    """Run ``shoal api``, GET /healthz (a probe) and /v1/queues (a console poll),
    stop it; its output lines (stderr and stdout together)."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        *api_command(db_url, port, *before),
        *options,
        env=environment(),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:

            async def up() -> bool:
                assert proc.returncode is None, "shoal api exited early"
                try:
                    return (await c.get("/healthz")).status_code == 200
                except httpx.TransportError:
                    return False

            await wait_for(up, timeout_s=30, interval_s=0.1)
            assert (await c.get("/v1/queues", headers={"X-Shoal-Request": "1"})).is_success
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(proc.communicate(), timeout=20)
    assert proc.returncode == 0, output.decode(errors="replace")
    return output.decode().splitlines()


def access_lines(lines: list[str], path: str) -> list[str]:
    return [line for line in lines if "uvicorn.access" in line and f"GET {path} " in line]


async def test_text_logs_have_timestamps_and_console_polls_are_debug(db_url: str) -> None:
    lines = await serve_and_poll(db_url)
    logged = [line for line in lines if "uvicorn" in line]
    assert logged and all(TIMESTAMPED.match(line) for line in logged), lines
    (probe,) = access_lines(lines, "/healthz")[-1:]  # a probe stays at INFO
    assert " INFO uvicorn.access " in probe
    assert access_lines(lines, "/v1/queues") == [], lines  # a console poll is not

    verbose = await serve_and_poll(db_url, before=("-v",))
    (poll,) = access_lines(verbose, "/v1/queues")
    assert " DEBUG uvicorn.access " in poll


async def test_no_access_log_switches_the_request_lines_off(db_url: str) -> None:
    lines = await serve_and_poll(db_url, "--no-access-log")
    assert access_lines(lines, "/healthz") == [], lines
    assert any("shoal API and console on" in line for line in lines)


async def test_a_taken_port_is_one_error_line_and_no_announcement(db_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = await asyncio.create_subprocess_exec(
            *api_command(db_url, port),
            env=environment(),
            cwd=REPO,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
    text = output.decode(errors="replace")
    assert proc.returncode == 2, text
    assert text.strip() == (
        f"error: --port: cannot listen on 127.0.0.1:{port}: Address already in use"
    ), text
    assert "shoal API and console on" not in text
