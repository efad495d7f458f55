"""A producer process for the spool's kill test: ``python -m tests.spool_producer URL NATS DIR N``.

It starts a pipeline with a spool in DIR on the nats transport at NATS,
prints ``ready`` and waits for a line on stdin (the test stops nats-server
meanwhile). Then it submits N readings whose in-place apply fails as if the
database were down, prints ``spooled <id>`` as each ``submit`` returns, and
waits to be killed.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta
from pathlib import Path

from shoal import Message, Pipeline, Shoal, TransientError
from shoal.ingest.nats import NatsTransport
from tests.ingest_helpers import READINGS, Reading


async def database_down(message: Message[Reading]) -> None:
    raise TransientError("no database connection free in time")


async def main(url: str, nats_url: str, spool_dir: str, count: int) -> None:
    boss = await Shoal.connect(url, max_size=2, run_migrations=False)
    transport = NatsTransport(nats_url, request_timeout=timedelta(seconds=1))
    pipeline = Pipeline(boss, transport, spool_dir=Path(spool_dir), spool_after=timedelta(0))
    await pipeline.config.set("ingest.mode", "async")
    await pipeline.start()
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    for i in range(count):
        done = await pipeline.submit(
            READINGS, Reading(card_id=i % 10, amount=1), database_down, id=f"k{i}"
        )
        print(f"{done.route} {done.id}", flush=True)
    await asyncio.Event().wait()  # until SIGKILL


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
