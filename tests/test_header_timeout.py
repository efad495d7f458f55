"""Request heads are bounded in time, and a head h11 refuses gets shoal's JSON 400.

A real uvicorn server runs ``shoal api``'s protocol (``bounded_head_protocol``)
on 127.0.0.1 and raw sockets play the clients. These tests must use wall-clock
time: the bound is a server-side timer on a real socket. They never assert an
elapsed time: the bound is set short (0.5 s) and each test asserts that the
server closed the connection (EOF, a 408, or a reset) before a generous
ceiling, which only keeps a broken server from hanging the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from shoal import Shoal
from shoal.api import create_api
from shoal.api.defaults import MAX_HEAD_BYTES
from shoal.api.server import DEFAULT_HEADER_TIMEOUT_S, bounded_head_protocol
from shoal.app import App
from shoal.batch.item import Item
from shoal.cli.parse import parser

from .conftest import wait_for

BOUND_S = 0.5
CEILING_S = 15.0
# Slower than nothing, faster than the bound: each byte alone would keep a
# per-read timer happy, so only a deadline on the whole head stops the client.
TRICKLE_S = 0.1
KIND = "head.echo"
ROOT = Path(__file__).parent.parent
PARTIAL_HEAD = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "

APP = App()


@APP.batch(KIND)
async def echo(item: Item) -> dict[str, Any]:
    return {"ref": item.ref}


class _TestServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        # Leave pytest's own signal handling alone.
        yield


@contextlib.asynccontextmanager
async def serving(api: FastAPI, header_timeout_s: float = BOUND_S) -> AsyncIterator[int]:
    """``api`` on 127.0.0.1 behind the protocol ``shoal api`` uses; yields the port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    config = uvicorn.Config(
        api,
        lifespan="off",
        log_level="warning",
        ws="none",
        http=bounded_head_protocol(header_timeout_s),
    )
    server = _TestServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await wait_for(lambda: server.started, timeout_s=10)
        yield port
    finally:
        server.should_exit = True
        await task
        sock.close()


@pytest.fixture
def api(boss: Shoal) -> FastAPI:
    return create_api(boss, APP.batches(boss), token=None, request_deadline_s=10.0)


async def read_until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes; fails the test past the ceiling."""
    chunks = []
    async with asyncio.timeout(CEILING_S):
        with contextlib.suppress(ConnectionResetError):
            while chunk := await reader.read(65536):
                chunks.append(chunk)
    return b"".join(chunks)


async def trickle(writer: asyncio.StreamWriter, first: bytes, stop: asyncio.Event) -> None:
    """Send ``first``, then one more header byte every TRICKLE_S until ``stop``."""
    with contextlib.suppress(ConnectionError):
        writer.write(first)
        await writer.drain()
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TRICKLE_S):
                    await stop.wait()
            if not stop.is_set():
                writer.write(b"a")
                await writer.drain()


async def slow_head(port: int, *, before: bytes = b"") -> bytes:
    """Open a connection, send ``before`` whole, then a head that never ends; the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    stop = asyncio.Event()
    try:
        if before:
            writer.write(before)
            await writer.drain()
            await read_response(reader)
        sender = asyncio.create_task(trickle(writer, PARTIAL_HEAD, stop))
        try:
            return await read_until_closed(reader)
        finally:
            stop.set()
            await sender
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response with a Content-Length from a kept-alive connection."""
    async with asyncio.timeout(CEILING_S):
        head = await reader.readuntil(b"\r\n\r\n")
        status, headers = parse_head(head)
        body = await reader.readexactly(int(headers["content-length"]))
    return status, headers, body


def parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers


def assert_error(answer: bytes, status: int, code: str, field: str) -> dict[str, Any]:
    head, _, body = answer.partition(b"\r\n\r\n")
    got, headers = parse_head(head + b"\r\n\r\n")
    assert got == status, answer
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    payload: dict[str, Any] = json.loads(body)
    assert payload["error"] == code
    assert payload["field"] == field
    assert payload["message"].startswith(f"{field}: ")
    return payload


async def test_a_head_trickling_in_is_answered_408_and_closed_at_the_bound(api: FastAPI) -> None:
    async with serving(api) as port:
        answer = await slow_head(port)
    payload = assert_error(answer, 408, "request_timeout", "headers")
    assert f"within {BOUND_S:g} s" in payload["message"]


async def test_many_slow_heads_at_once_are_all_closed(api: FastAPI) -> None:
    async with serving(api) as port:
        answers = await asyncio.gather(*(slow_head(port) for _ in range(50)))
        # Every connection was closed by the server; each one that got an
        # answer got the 408 (a reset may beat the answer to a client that
        # was still sending).
        for answer in answers:
            if answer:
                assert_error(answer, 408, "request_timeout", "headers")
        assert sum(1 for answer in answers if answer) >= 40
        async with httpx.AsyncClient() as c:
            assert (await c.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200


async def test_a_connection_that_sends_nothing_is_closed_quietly(api: FastAPI) -> None:
    async with serving(api) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            assert await read_until_closed(reader) == b""
        finally:
            writer.close()


async def test_the_next_head_on_a_kept_alive_connection_is_bounded_too(api: FastAPI) -> None:
    first = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    async with serving(api) as port:
        answer = await slow_head(port, before=first)
    assert_error(answer, 408, "request_timeout", "headers")


async def test_normal_requests_are_served_and_a_slow_body_is_the_body_deadlines_to_judge(
    api: FastAPI,
) -> None:
    body = json.dumps({"kind": KIND, "items": ["a", "b"]}).encode()
    head = (
        b"POST /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
    )
    async with serving(api) as port:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
            assert (await c.get("/healthz")).status_code == 200
            created = await c.post("/v1/tasks", json={"kind": KIND, "items": ["x"]})
            assert created.status_code == 202, created.text
        # The head arrives at once; the body takes several bounds to arrive
        # (in ten pieces, TRICKLE_S apart), well within the body deadline.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(head)
            step = len(body) // 10 + 1
            for start in range(0, len(body), step):
                # The client is slow on purpose: the body's pieces span several head bounds.
                await asyncio.sleep(TRICKLE_S)  # noqa: TID251
                writer.write(body[start : start + step])
                await writer.drain()
            status, _, answer = await read_response(reader)
        finally:
            writer.close()
    assert status == 202, answer


@pytest.mark.parametrize(
    ("header_lines", "field", "reason"),
    [
        (b"Content-Length: 12abc\r\n", "content-length", "bad Content-Length"),
        (b"Content-Length: -1\r\n", "content-length", "bad Content-Length"),
        (b"Content-Length: \xb2\r\n", "content-length", "bad Content-Length"),
        (b"Content-Length: 2\r\nContent-Length: 3\r\n", "content-length", "conflicting"),
        (b"Transfer-Encoding: gzip\r\n", "transfer-encoding", "Transfer-Encoding"),
        (b"Bad Name: x\r\n", "headers", "illegal header line"),
    ],
)
async def test_a_head_h11_refuses_gets_the_json_bad_request_naming_the_header(
    api: FastAPI, header_lines: bytes, field: str, reason: str
) -> None:
    request = (
        b"POST /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + header_lines
        + b"\r\n"
    )
    async with serving(api) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(request)
            await writer.drain()
            answer = await read_until_closed(reader)
        finally:
            writer.close()
    payload = assert_error(answer, 400, "bad_request", field)
    assert reason in payload["message"]


async def test_a_garbled_request_line_gets_the_json_bad_request(api: FastAPI) -> None:
    async with serving(api) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"NOT A REQUEST\r\n\r\n")
            answer = await read_until_closed(reader)
        finally:
            writer.close()
    assert_error(answer, 400, "bad_request", "request_line")


def test_the_header_timeout_is_an_option_of_shoal_api_with_its_default_in_the_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["api", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--header-timeout" in help_text
    assert f"(default: {DEFAULT_HEADER_TIMEOUT_S:g})" in help_text
    for option in ("--header-timeout", "--request-deadline"):
        for bad in ("0", "-1", "soon", "nan"):
            with pytest.raises(SystemExit) as refused:
                parser().parse_args(["api", "--app", "m:a", option, bad])
            assert refused.value.code == 2
        assert f"argument {option}: " in capsys.readouterr().err


async def test_shoal_api_bounds_heads_by_its_header_timeout_option(db_url: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "shoal.cli", "--database-url", db_url, "api"],
        *["--app", "shoal.demo:app", "--port", str(port), "--header-timeout", str(BOUND_S)],
        env={k: v for k, v in os.environ.items() if k != "SHOAL_API_TOKEN"},
        cwd=ROOT,
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
        answer = await slow_head(port)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(proc.communicate(), timeout=20)
    assert proc.returncode == 0, output.decode(errors="replace")
    assert_error(answer, 408, "request_timeout", "headers")


def head_of(size: int, *, pipelined_after: bytes = b"") -> bytes:
    """A complete ``GET /healthz`` head of exactly ``size`` bytes (padded by one header)."""
    start = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: "
    end = b"\r\nConnection: close\r\n\r\n"
    return pipelined_after + start + b"a" * (size - len(start) - len(end)) + end


@pytest.mark.parametrize("size", [MAX_HEAD_BYTES + 1, 64 * 1024])
async def test_a_complete_head_over_the_cap_is_answered_431_and_closed(
    api: FastAPI, size: int
) -> None:
    # h11 bounds only a head still incomplete after a read; one that arrives
    # whole in a single read went through at any size.
    async with serving(api) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(head_of(size))
            await writer.drain()
            answer = await read_until_closed(reader)
        finally:
            writer.close()
    payload = assert_error(answer, 431, "headers_too_large", "headers")
    assert f"{MAX_HEAD_BYTES} bytes" in payload["message"]


async def test_a_head_over_the_cap_arriving_in_pieces_is_answered_431(api: FastAPI) -> None:
    head = head_of(64 * 1024)
    async with serving(api) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for start in range(0, len(head), 1000):
                with contextlib.suppress(ConnectionError):
                    writer.write(head[start : start + 1000])
                    await writer.drain()
            answer = await read_until_closed(reader)
        finally:
            writer.close()
    assert_error(answer, 431, "headers_too_large", "headers")


async def test_a_pipelined_head_over_the_cap_is_answered_431_after_the_first_answer(
    api: FastAPI,
) -> None:
    first = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    async with serving(api) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(head_of(64 * 1024, pipelined_after=first))
            await writer.drain()
            status, _, _ = await read_response(reader)
            answer = await read_until_closed(reader)
        finally:
            writer.close()
    assert status == 200
    assert_error(answer, 431, "headers_too_large", "headers")


async def test_a_head_at_the_cap_is_served(api: FastAPI) -> None:
    async with serving(api) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(head_of(MAX_HEAD_BYTES))
            await writer.drain()
            status, _, body = await read_response(reader)
        finally:
            writer.close()
    assert (status, json.loads(body)["status"]) == (200, "ok")
