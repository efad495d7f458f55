"""A client still sending its body when the API refuses it reads the refusal, never a reset.

The server answers 408 before the body is in, then closes. A socket
closed with request bytes still unread makes the kernel send a reset, which
can overtake the answer: the client reports "connection reset" instead of the
408. The served API closes with a lingering close (``shoal.api.linger``) so the
answer and a clean end of stream always arrive first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI

from shoal import Shoal
from shoal.api import create_api
from shoal.api.server import api_config
from shoal.batch.service import Batches

from .conftest import wait_for
from .test_api import TEST_APP, written

CHUNK = b" " * 64
# Room for what the sender gets through before the deadline (some MB at loopback speed).
BODY_BYTES = 512 * 1024 * 1024


@pytest.fixture
def batches(boss: Shoal) -> Batches:
    return TEST_APP.batches(boss)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield  # pytest keeps its own signal handling


@contextlib.asynccontextmanager
async def served(api: FastAPI) -> AsyncIterator[int]:
    """``api`` served as ``shoal api`` serves it, on a port the OS picked."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = _Server(api_config(api, lifespan="off", log_level="warning"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await wait_for(lambda: server.started, timeout_s=10)
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        await task
        sock.close()


def _stream_until_answered(port: int, head: bytes) -> tuple[bytes, str]:
    """Send ``head``, then body bytes without pause until the server's answer has been read.

    Returns the bytes read and how the connection ended: "eof" or "reset".
    """
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(head)
        answered = threading.Event()

        def send_body() -> None:
            # Without pause: request bytes are arriving at every moment,
            # including the one at which the server closes.
            with contextlib.suppress(OSError):
                while not answered.is_set():
                    s.sendall(CHUNK)

        sender = threading.Thread(target=send_body)
        sender.start()
        chunks = []
        end = "eof"
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            end = "reset"
        finally:
            answered.set()
            sender.join()
        return b"".join(chunks), end


@pytest.mark.parametrize("attempt", range(3))
async def test_a_client_still_sending_its_body_reads_the_408_and_a_clean_end_of_stream(
    boss: Shoal, batches: Batches, db_url: str, attempt: int
) -> None:
    # Over several attempts: without the lingering close the reset comes at most.
    api = create_api(boss, batches, token=None, request_deadline_s=0.5, max_body_bytes=BODY_BYTES)
    head = (
        b"POST /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {BODY_BYTES}\r\n\r\n".encode()
    )
    async with served(api) as port:
        answer, end = await asyncio.to_thread(_stream_until_answered, port, head)
    assert end == "eof", answer
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 408"), answer
    payload = json.loads(rest.partition(b"\r\n\r\n")[2])
    assert payload["error"] == "request_timeout"
    assert payload["field"] == "body"
    assert "not received within 0.5 s" in payload["message"]
    assert written(db_url) == (0, 0, 0)
