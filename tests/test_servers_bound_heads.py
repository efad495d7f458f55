"""Every HTTP server shoal starts parses heads with the bounded-head protocol of ``shoal api``.

The demo's dashboard, the extraction workbench's server and the polling
gateway built their own ``uvicorn.Config`` without it: no deadline on request
heads, and uvicorn's plain-text answer to a garbled one. Each now answers a
garbled request line with shoal's JSON ``bad_request`` (what only the bounded
protocol sends), which shows the protocol is in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from typing import Any

from rich.console import Console

from shoal import Shoal
from shoal.app import App
from shoal.demo import _serve_api, _servers
from shoal_extract.serve import serving
from shoal_polling.cli import serve_gateway
from shoal_polling.gateway import GatewaySettings
from tests.conftest import wait_for

CEILING_S = 15.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def garbled_request(port: int) -> dict[str, Any]:
    """Send a request line no HTTP parser accepts; the JSON error the server answers."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"NOT A REQUEST\r\n\r\n")
        chunks = []
        async with asyncio.timeout(CEILING_S):
            with contextlib.suppress(ConnectionResetError):
                while chunk := await reader.read(65536):
                    chunks.append(chunk)
    finally:
        writer.close()
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    assert b" 400 " in head.split(b"\r\n")[0], head
    assert b"content-type: application/json" in head.lower(), head
    payload: dict[str, Any] = json.loads(body)
    return payload


def accepts(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


async def test_the_demo_dashboard_bounds_request_heads(boss: Shoal) -> None:
    port = free_port()
    url = await _serve_api(boss, App().batches(boss), port, Console(quiet=True))
    assert url is not None
    try:
        payload = await garbled_request(port)
    finally:
        for server, task in _servers:
            server.should_exit = True
            await task
        _servers.clear()
    assert (payload["error"], payload["field"]) == ("bad_request", "request_line")


async def test_the_extraction_server_bounds_request_heads(boss: Shoal) -> None:
    from shoal.api import create_api

    async with serving(create_api(boss, App().batches(boss), token=None), port=0) as url:
        payload = await garbled_request(int(url.rsplit(":", 1)[1]))
    assert (payload["error"], payload["field"]) == ("bad_request", "request_line")


async def test_the_polling_gateway_bounds_request_heads() -> None:
    port = free_port()
    task = asyncio.create_task(serve_gateway(GatewaySettings(), host="127.0.0.1", port=port))
    try:
        await wait_for(lambda: task.done() or accepts(port), 10)
        payload = await garbled_request(port)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert (payload["error"], payload["field"]) == ("bad_request", "request_line")
