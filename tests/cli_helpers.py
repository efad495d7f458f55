"""Running ``shoal`` commands in-process, beside a client of the test's own."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from shoal import Shoal
from shoal.cli import main
from shoal.db.pool import Database


def with_boss(
    db_url: str,
    body: Callable[[Shoal], Awaitable[Any]],
    *,
    max_size: int = 2,
    listen: bool = False,
) -> Any:
    """Run ``body(client)`` on a client of ``db_url`` in an event loop of its own."""

    async def run() -> Any:
        db = await Database(db_url, max_size=max_size).open()
        boss = Shoal(db, listen=listen)
        try:
            return await body(boss)
        finally:
            await boss.close()

    return asyncio.run(run())


def shoal(db_url: str, *argv: str) -> int:
    """``shoal --database-url DB_URL ARGV...`` in this process; its exit code."""
    return main(["--database-url", db_url, *argv])
