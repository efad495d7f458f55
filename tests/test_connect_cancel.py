"""A cancellation that meets a finished connect is not lost.

On Python 3.11, ``asyncio.wait_for`` returns the inner result when the
waiting task is cancelled in the same moment the inner call completes, and
the cancellation is gone. ``Database.connect`` used it: a notifier whose
``stop()`` cancelled its LISTEN task while that task was reconnecting could
get the connection back instead of the cancellation, go on listening, and
``stop()`` then waited for it forever (seen as a test run that sat idle).
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from shoal.db import Database


async def test_a_task_cancelled_as_its_connect_completes_ends_cancelled(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_connect = psycopg.AsyncConnection.connect
    connections: list[psycopg.AsyncConnection[Any]] = []
    caller: list[asyncio.Task[Any]] = []

    async def connect_then_cancel_the_caller(*args: Any, **kwargs: Any) -> Any:
        # A real connection; the caller's cancel lands just as it completes.
        conn = await real_connect(*args, **kwargs)
        connections.append(conn)
        caller[0].cancel()
        return conn

    monkeypatch.setattr(psycopg.AsyncConnection, "connect", connect_then_cancel_the_caller)
    db = Database(db_url)
    task = asyncio.create_task(db.connect())
    caller.append(task)
    try:
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        for conn in connections:
            await conn.close()
