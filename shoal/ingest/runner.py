"""What ``shoal worker`` runs for an app's topics: consumers, sinks and the monitor.

The transport comes from the app (``App.ingest(transport=...)``) or the
environment: ``SHOAL_INGEST_TRANSPORT=postgres`` (the default) or ``nats``
with ``SHOAL_NATS_URL`` (and ``SHOAL_NATS_MONITOR_URL`` for the durability
check at start-up).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from psycopg import sql

from shoal.errors import InvalidInput
from shoal.ingest.consumer import Apply, WriteBatch
from shoal.ingest.message import Topic
from shoal.ingest.monitor import DEFAULT_INTERVAL
from shoal.ingest.pipeline import (
    DEFAULT_CONNECTION_RESERVE,
    DEFAULT_MODE_KEY,
    Pipeline,
    check_connection_budget,
)
from shoal.ingest.postgres import PostgresTransport
from shoal.ingest.transport import Transport
from shoal.queue.client import Shoal

log = logging.getLogger("shoal.ingest")

TransportFactory = Callable[[Shoal], Transport]


@dataclass(frozen=True, slots=True)
class ConsumerSpec:
    topic: Topic[Any]
    apply: Apply[Any]
    options: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SinkSpec:
    topic: Topic[Any]
    write: WriteBatch[Any]
    options: dict[str, Any]


@dataclass(slots=True)
class IngestSettings:
    transport: TransportFactory | None = None
    mode_key: str = DEFAULT_MODE_KEY
    monitor: bool = True
    monitor_interval: timedelta = DEFAULT_INTERVAL
    monitor_options: dict[str, Any] = field(default_factory=dict)
    connection_reserve: int = DEFAULT_CONNECTION_RESERVE


def transport_from_env(boss: Shoal) -> Transport:
    kind = os.environ.get("SHOAL_INGEST_TRANSPORT", "postgres")
    if kind == "postgres":
        return PostgresTransport(boss)
    if kind == "nats":
        from shoal.ingest.nats import NatsTransport

        url = os.environ.get("SHOAL_NATS_URL", "nats://127.0.0.1:4222")
        return NatsTransport(url, monitor_url=os.environ.get("SHOAL_NATS_MONITOR_URL"))
    raise InvalidInput("SHOAL_INGEST_TRANSPORT", f"must be postgres or nats, got {kind!r}")


async def check_commit_durability(boss: Shoal, transport: Transport) -> bool:
    """With a transport outside the database, an acknowledged message must never
    outlive its apply: with ``synchronous_commit`` off, a commit that returned
    can vanish in a database crash after the transport took the ack. ERROR then.
    """
    if isinstance(transport, PostgresTransport):
        return True  # the ack commits with (or after) the apply, in the same database
    rows = await boss.db.fetch(
        sql.Composed([sql.SQL("SELECT current_setting('synchronous_commit')")]), {}
    )
    if rows and rows[0][0] == "off":
        log.error(
            "synchronous_commit is off: with the %s transport, messages whose applies were "
            "acknowledged can be lost when the database crashes; turn it on",
            transport.name,
        )
        return False
    return True


async def start_pipeline(boss: Shoal, settings: IngestSettings) -> Pipeline:
    """The worker's pipeline on the configured transport, started and checked."""
    transport = (settings.transport or transport_from_env)(boss)
    pipeline = Pipeline(boss, transport, mode_key=settings.mode_key)
    await pipeline.start()
    await check_commit_durability(boss, transport)
    return pipeline


async def run_ingest(
    pipeline: Pipeline,
    consumers: list[ConsumerSpec],
    sinks: list[SinkSpec],
    settings: IngestSettings,
    stop: asyncio.Event,
    *,
    grace: timedelta,
) -> None:
    """Run every consumer and sink (and, if leading, the monitor) until ``stop``.

    The pipeline is the caller's (:func:`start_pipeline`), who closes it.
    """
    boss, transport = pipeline.boss, pipeline.transport
    check_connection_budget(
        pool_size=boss.db.max_size,
        consumers=sum(c.options.get("concurrency", 30) for c in consumers),
        writers=sum(s.options.get("writers", 1) for s in sinks),
        reserve=settings.connection_reserve,
    )
    tasks = [
        asyncio.create_task(pipeline.consumer(c.topic, c.apply, **c.options).run(stop, grace=grace))
        for c in consumers
    ] + [
        asyncio.create_task(
            pipeline.batch_consumer(s.topic, s.write, **s.options).run(stop, grace=grace)
        )
        for s in sinks
    ]
    if settings.monitor:
        topics = [(c.topic.name, c.options.get("group", "shoal")) for c in consumers] + [
            (s.topic.name, s.options.get("group", "shoal")) for s in sinks
        ]
        monitor = pipeline.monitor(
            topics, interval=settings.monitor_interval, **settings.monitor_options
        )
        tasks.append(asyncio.create_task(monitor.run(stop)))
    log.info(
        "ingest on %s: %s",
        transport.name,
        ", ".join(c.topic.name for c in consumers) + " " + ", ".join(s.topic.name for s in sinks),
    )
    await asyncio.gather(*tasks)
