"""The queue worker's own CPU per job, with no database.

    .venv/bin/python -m bench.worker_overhead                 # 100,000 jobs, 3 rounds
    .venv/bin/python -m bench.worker_overhead --n 20000 --rounds 5

An in-memory store hands out claims of up to 500 jobs and takes completions
at once (each claim and each write yields to the event loop once, as a round
trip would). Each claim's rows are read by the same ``lean_claims`` a real
claim uses, from tuples shaped like the lean claim rows psycopg returns. The
handler is a no-op coroutine. What is left is what ``Worker`` itself spends
on a job: its fetcher and prefetch, the buffer, ten runners, the execution
deadlines, the outcomes and the completer's batches. Measured as this
process's CPU (``time.process_time``) from ``start()`` to the last job
recorded, per job, for:

- ``loop``: the floor: ten tasks taking the same claimed jobs from an
  ``asyncio.Queue``, each wrapped in a ``Job`` and awaited with the same
  handler, and their (id, attempt) recorded in batches of 500. Any worker
  running ten handlers at once spends at least this.
- ``Worker``: ``concurrency=10``, every other setting at its default.

The rounds run the two in turn; reported per round and as the median,
lowest and highest ratio to the loop of the same round, the unit that
travels between machines. A real drain adds the driver's work on top:
reading each claim row, sending each completion's arrays, and the event
loop's socket waits (docs/benchmarks.md, "Queue").

This is a measurement script, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from shoal.clock import SystemClock
from shoal.db.pool import Pending
from shoal.queue.fetcher import DEFAULT_MAX_BATCH
from shoal.queue.job import Job
from shoal.queue.rows import LEAN_CLAIM_COLUMNS, ClaimedJob, ClaimedJobs, lean_claims
from shoal.queue.worker import Worker

CONCURRENCY = 10
AT = datetime(2026, 12, 5, tzinfo=UTC).timestamp()
Row = tuple[Any, ...]


def claim_rows(first: int, n: int) -> list[Row]:
    """``n`` lean claim rows as psycopg returns them (LEAN_CLAIM_COLUMNS' order), from ``first``."""
    return [
        (i, f'{{"i": {i}}}', 0, 1, 2, 1.0, True, 60.0, 900.0, None, None, AT, AT)
        for i in range(first, first + n)
    ]


class MemoryDatabase:
    async def run(self, work: Callable[[Any], Awaitable[Any]], *, transaction: bool = True) -> Any:
        await asyncio.sleep(0)  # a round trip's worth of yielding
        return await work(None)


class MemoryStore:
    """The store calls a worker makes on a queue without limits, answered from memory."""

    def __init__(self, n: int) -> None:
        self.db = MemoryDatabase()
        self.left = n
        self.next_id = 1
        self.completed = 0
        self.all_completed = asyncio.Event()
        # No registry row to wait for before the first claim.
        self.holder_known: asyncio.Event | None = None

    async def is_limited(self, queue: str) -> bool:
        return False

    async def claim_with_cost(
        self, queue: str, limit: int, *, now: datetime | None, after: Any = None
    ) -> ClaimedJobs:
        await asyncio.sleep(0)
        take = min(limit, self.left)
        rows = claim_rows(self.next_id, take)
        self.next_id += take
        self.left -= take
        return ClaimedJobs(lean_claims(LEAN_CLAIM_COLUMNS, rows, queue), 0.001)

    async def claim(
        self, queue: str, limit: int, *, now: datetime | None, after: Any = None
    ) -> list[ClaimedJob]:
        return (await self.claim_with_cost(queue, limit, now=now, after=after)).jobs

    def record(self, count: int) -> None:
        self.completed += count
        if self.completed >= self.next_id - 1 and not self.left:
            self.all_completed.set()

    async def send_complete(
        self, conn: Any, done: Sequence[tuple[int, int, Any]], *, now: datetime | None
    ) -> Pending[set[int]]:
        ids = {job_id for job_id, _, _ in done}
        self.record(len(ids))
        return Pending(None, lambda _rows: ids)


async def noop(job: Job) -> None:
    return None


async def run_loop(n: int) -> float:
    store = MemoryStore(n)
    # Bounded as a worker's buffer is: the claims wait for room.
    claimed: asyncio.Queue[ClaimedJob | None] = asyncio.Queue(DEFAULT_MAX_BATCH)
    outcomes: list[tuple[int, int]] = []

    async def runner() -> None:
        while (claim := await claimed.get()) is not None:
            await noop(Job(claim))
            outcomes.append((claim.id, claim.attempt))

    async def write(batch: list[tuple[int, int]]) -> None:
        async def send(conn: Any) -> None:
            pending = await store.send_complete(conn, [(i, a, None) for i, a in batch], now=None)
            await pending.result()

        await store.db.run(send, transaction=False)

    began = time.process_time()
    runners = [asyncio.create_task(runner()) for _ in range(CONCURRENCY)]
    while store.left:
        for claim in (await store.claim_with_cost("bench", DEFAULT_MAX_BATCH, now=None)).jobs:
            await claimed.put(claim)
        if len(outcomes) >= DEFAULT_MAX_BATCH:
            batch, outcomes[:] = outcomes[:], []
            await write(batch)
    for _ in runners:
        await claimed.put(None)
    await asyncio.gather(*runners)
    await write(outcomes)
    return time.process_time() - began


async def run_worker(n: int) -> float:
    store = MemoryStore(n)
    worker = Worker(
        store,  # type: ignore[arg-type]  # the calls a worker makes, answered from memory
        "bench",
        noop,
        concurrency=CONCURRENCY,
        batch_size=None,
        poll_interval=timedelta(seconds=2),
        clock=SystemClock(),
        jitter=random.Random(),
        notifier=None,
        limit_store=store,  # type: ignore[arg-type]  # is_limited, answered from memory
    )
    began = time.process_time()
    worker.start()
    await store.all_completed.wait()
    spent = time.process_time() - began
    await worker.stop()
    return spent


async def bench(n: int, rounds: int) -> None:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"machine: os.cpu_count() = {os.cpu_count()}; load average {load}; N = {n:,}")
    print("CPU microseconds of this process per job (no database)")
    loops: list[float] = []
    workers: list[float] = []
    for r in range(rounds):
        loops.append(await run_loop(n))
        workers.append(await run_worker(n))
        print(
            f"  round {r + 1}: loop {loops[-1] / n * 1e6:.2f}, Worker {workers[-1] / n * 1e6:.2f}"
            f" ({workers[-1] / loops[-1]:.2f}x)"
        )
    ratios = sorted(w / base for w, base in zip(workers, loops, strict=True))
    print(
        f"Worker: {statistics.median(workers) / n * 1e6:.2f} us a job, "
        f"{statistics.median(ratios):.2f}x the loop ({ratios[0]:.2f}x-{ratios[-1]:.2f}x)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=100_000, help="jobs a run (default 100,000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the two (default 3)")
    args = parser.parse_args(argv)
    if args.n < 1 or args.rounds < 1:
        parser.error("--n and --rounds must be at least 1")
    asyncio.run(bench(args.n, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
