"""Plain ``def`` handlers: run in a thread pool of their own, with the same outcomes.

A coroutine function is used as it is. Any other callable is wrapped so that
each call runs in a thread of a pool sized to the handler's concurrency (so a
``concurrency=10`` handler really runs ten at once, whatever the default
executor's size), in a copy of the caller's context variables. What it returns
is the job's output and what it raises is classified exactly as for an async
handler (``PermanentError`` fails at once, anything else retries).

A thread cannot be interrupted: when a run passes ``expire_in``, a shutdown's
grace ends, or someone cancels the job, the job's outcome is recorded as for
an async handler (expired, handed back, or stopped), while the thread itself
runs on to its end and its result is dropped. Handlers that may hang should
bound their own calls (timeouts on sockets and HTTP clients); long ones check
``job.cancelled`` or call ``job.raise_if_cancelled()`` between steps.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from shoal.errors import InvalidInput

A = TypeVar("A")


def is_async_callable(fn: object) -> bool:
    """True for ``async def`` functions, partials of them, objects with ``async def __call__``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def as_async(
    fn: Callable[[A], Any], *, threads: int, name: str, field: str = "handler"
) -> Callable[[A], Awaitable[Any]]:
    """``fn`` itself if it is async; else a wrapper that runs it in a pool of ``threads``."""
    if not callable(fn):
        raise InvalidInput(field, f"must be a function taking one argument, got {fn!r}")
    if is_async_callable(fn):
        return fn
    pool: ThreadPoolExecutor | None = None

    async def in_thread(arg: A) -> Any:
        nonlocal pool
        if pool is None:  # made on first use: registering a handler starts no threads
            pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"shoal-{name}")
        context = contextvars.copy_context()
        result = await asyncio.get_running_loop().run_in_executor(pool, context.run, fn, arg)
        # A plain function that returns an awaitable (a lambda around a coroutine).
        return await result if inspect.isawaitable(result) else result

    in_thread.__qualname__ = getattr(fn, "__qualname__", in_thread.__qualname__)
    in_thread.__name__ = getattr(fn, "__name__", in_thread.__name__)
    in_thread.__wrapped__ = fn  # type: ignore[attr-defined]
    return in_thread
