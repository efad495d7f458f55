"""Many small requests, one statement: the batching behind hot-path writes.

Callers ``await coalescer.submit(request)`` and get their own result. While a
flush is running, new requests wait for the next one, so under load each
round trip carries many requests, and when idle a request goes out at once
(no timer, no added latency). A failed flush fails every request in it.

An idle coalescer holds no task: the flusher ends when nothing waits, and the
next request starts another. So a coalescer needs no closing, and one made
for a short-lived object (a service a caller made for one call) leaves
nothing running behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

Request = TypeVar("Request")
Result = TypeVar("Result")

DEFAULT_MAX_BATCH = 500


class Coalescer(Generic[Request, Result]):
    """Runs ``flush(requests) -> results`` (same length, same order) for concurrent submitters."""

    def __init__(
        self,
        flush: Callable[[Sequence[Request]], Awaitable[Sequence[Result]]],
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        name: str = "coalescer",
    ) -> None:
        self._flush = flush
        self._max_batch = max_batch
        self._name = name
        # Written by submit(), drained by the flusher task.
        self._waiting: list[tuple[Request, asyncio.Future[Result]]] = []
        self._task: asyncio.Task[None] | None = None

    async def submit(self, request: Request) -> Result:
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._waiting.append((request, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=self._name)
        # Not shielded: the flush runs in the coalescer's own task, so a
        # cancelled submitter cancels only its own future, which the flush then
        # skips; its request is still written. (A shield per request cost an
        # extra future and callback on every hot-path ack.)
        return await future

    async def _run(self) -> None:
        while self._waiting:
            batch = self._waiting[: self._max_batch]
            del self._waiting[: self._max_batch]
            try:
                results = await self._flush([request for request, _ in batch])
            except BaseException as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
