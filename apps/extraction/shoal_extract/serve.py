"""Serving shoal's API with the workbench mounted, in the caller's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator, Sequence

import uvicorn
from fastapi import FastAPI

from shoal import Batches, Shoal
from shoal.api import api_config, create_api
from shoal_extract.api import mount_workbench
from shoal_extract.workbench import Workbench

START_TIMEOUT_S = 10.0


def build_api(
    boss: Shoal,
    batches: Batches,
    workbench: Workbench,
    *,
    token: str | None,
    token_name: str | None = None,
    read_only: bool = False,
    allowed_hosts: Sequence[str] = (),
) -> FastAPI:
    """shoal's API (``/v1``, dashboard at ``/``) with the workbench's routes and page.

    The workbench's routes sit behind shoal's refusal of cross-site writes and
    foreign ``Host`` names (docs/api.md); ``allowed_hosts`` are further names.
    """
    return mount_workbench(
        create_api(boss, batches, token=token, read_only=read_only, allowed_hosts=allowed_hosts),
        workbench,
        token=token,
        token_name=token_name,
    )


class _QuietServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the caller owns SIGINT/SIGTERM (it stops workers and the server together)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``port``, or on a free port when that one is taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.bind((host, 0))
    return sock


@contextlib.asynccontextmanager
async def serving(api: FastAPI, *, host: str = "127.0.0.1", port: int = 8000) -> AsyncIterator[str]:
    """Serve ``api`` while the block runs; yields its base URL (``http://host:port``)."""
    sock = bind(host, port)
    server = _QuietServer(api_config(api, lifespan="off", log_level="warning", server_header=False))
    task = asyncio.create_task(server.serve(sockets=[sock]), name="shoal-extract-api")
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_S
        while not server.started:
            if task.done() or loop.time() > deadline:
                raise RuntimeError(f"the API did not start on {host}:{sock.getsockname()[1]}")
            await asyncio.sleep(0.02)
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await task
        sock.close()


__all__ = ["bind", "build_api", "serving"]
