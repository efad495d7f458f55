"""The ingest side of ``shoal worker``: starts consumers, sinks and monitor; restarts them.

The transport comes from the app (``app.ingest_settings.transport``), else from
the caller of :func:`start_pipeline` (``shoal worker`` builds it with
:func:`transport_factory` from its environment), else it is postgres.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from psycopg import sql

from shoal.clock import Clock
from shoal.errors import InvalidInput, TransientError
from shoal.extras import require
from shoal.ingest.batch_consumer import BatchConsumer
from shoal.ingest.consumer import DEFAULT_CONCURRENCY, Apply, Consumer, WriteBatch
from shoal.ingest.consumer_base import sleep_or_stop
from shoal.ingest.message import Topic
from shoal.ingest.monitor import DEFAULT_INTERVAL
from shoal.ingest.pipeline import (
    DEFAULT_MODE_KEY,
    Pipeline,
    check_connection_budget,
)
from shoal.ingest.postgres import PostgresTransport
from shoal.ingest.transport import Transport
from shoal.queue.client import Shoal

log = logging.getLogger("shoal.ingest")

TransportFactory = Callable[[Shoal], Transport]
# Before a consumer that ended on an error runs again (see _keep_running).
RESTART_PAUSE = timedelta(seconds=1)
# A worker whose transport cannot be reached at start tries again after these
# pauses, doubling (start_pipeline). The cap keeps a worker that waited long
# for its broker at most 30 s behind it once it is back.
START_RETRY_FIRST = timedelta(seconds=1)
START_RETRY_MAX = timedelta(seconds=30)
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"


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
    # None: a quarter of the pool, at least 2 (pipeline.default_connection_reserve).
    connection_reserve: int | None = None


def transport_factory(
    kind: str = "postgres",
    *,
    nats_url: str = DEFAULT_NATS_URL,
    nats_monitor_url: str | None = None,
    nats_replicas: int = 1,
) -> TransportFactory:
    """What builds the ``kind`` transport (``postgres`` or ``nats``) for a client.

    ``nats_url`` is the server to connect to, ``nats_monitor_url`` its
    monitoring endpoint for the durability check at start-up; for a cluster,
    each is a comma-separated list of every server's. ``nats_replicas`` is
    the replicas of each topic's stream.
    """
    if kind == "postgres":
        return PostgresTransport
    if kind == "nats":
        require("nats", "the nats transport")  # here, before a worker starts

        def nats(_: Shoal) -> Transport:
            from shoal.ingest.nats import NatsTransport

            return NatsTransport(
                _url_list(nats_url),
                monitor_url=_url_list(nats_monitor_url or ""),
                replicas=nats_replicas,
            )

        return nats
    raise InvalidInput("kind", f"must be postgres or nats, got {kind!r}")


def _url_list(urls: str) -> list[str]:
    """``"nats://a:4222, nats://b:4222"`` -> both URLs."""
    return [url.strip() for url in urls.split(",") if url.strip()]


async def check_commit_durability(boss: Shoal, transport: Transport) -> bool:
    """With a transport outside the database, an acknowledged message must never
    outlive its apply: with ``synchronous_commit`` off, a commit that returned
    can vanish in a database crash after the transport took the ack. ERROR then.
    """
    if transport.in_database:
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


async def start_pipeline(
    boss: Shoal,
    settings: IngestSettings,
    *,
    stop: asyncio.Event,
    default_transport: TransportFactory = PostgresTransport,
) -> Pipeline | None:
    """The worker's pipeline on the app's transport, else ``default_transport``'s, started
    and checked.

    A transport that cannot be reached yet (a worker started a moment before
    its nats-server) is tried again, with a WARN each time, after pauses that
    double from :data:`START_RETRY_FIRST` to :data:`START_RETRY_MAX`, for as
    long as it takes: the consumers wait the same way for a broker that goes
    away later. Returns None when ``stop`` is set before it could start. A
    refusal that waiting cannot cure (:class:`~shoal.ingest.nats.UnsafeDurability`,
    a conflicting stream) is raised at once.
    """
    transport = (settings.transport or default_transport)(boss)
    pipeline = Pipeline(boss, transport, mode_key=settings.mode_key)
    try:
        started = await _start_waiting(pipeline, stop, boss.clock)
        if started:
            await check_commit_durability(boss, transport)
    except BaseException:
        # A stream refused after the transport connected, a database error
        # or a cancellation: an open connection would go on reconnecting
        # (and logging) in this process for good.
        await pipeline.close()
        raise
    if not started:
        await pipeline.close()
        return None
    return pipeline


async def _start_waiting(pipeline: Pipeline, stop: asyncio.Event, clock: Clock) -> bool:
    """Start ``pipeline``, trying again while its transport cannot be reached;
    False when ``stop`` is set first."""
    name = pipeline.transport.name
    pause = START_RETRY_FIRST
    tries = 0
    while True:
        tries += 1
        try:
            await pipeline.start()
            break
        except TransientError as exc:
            log.warning(
                "ingest: the %s transport cannot be reached yet (try %d: %s); trying again in %g s",
                name,
                tries,
                exc,
                pause.total_seconds(),
            )
        await sleep_or_stop(stop, pause.total_seconds(), clock)
        if stop.is_set():
            return False
        pause = min(pause * 2, START_RETRY_MAX)
    if tries > 1:
        log.info("ingest: the %s transport is reachable after %d tries", name, tries)
    return True


def consumer_slots(consumers: list[ConsumerSpec]) -> int:
    """Connections the consumers may hold at once: one per apply in flight."""
    return sum(c.options.get("concurrency", DEFAULT_CONCURRENCY) for c in consumers)


def sink_writers(sinks: list[SinkSpec]) -> int:
    return sum(s.options.get("writers", 1) for s in sinks)


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
        consumers=consumer_slots(consumers),
        writers=sink_writers(sinks),
        reserve=settings.connection_reserve,
    )
    runs: list[tuple[str, Consumer[Any] | BatchConsumer[Any]]] = [
        (f"consumer of {c.topic.name}", pipeline.consumer(c.topic, c.apply, **c.options))
        for c in consumers
    ] + [
        (f"sink of {s.topic.name}", pipeline.batch_consumer(s.topic, s.write, **s.options))
        for s in sinks
    ]
    tasks = [
        asyncio.create_task(_keep_running(what, c, stop, grace=grace, clock=pipeline.clock))
        for what, c in runs
    ]
    if settings.monitor:
        topics = [(c.topic.name, c.options.get("group", "shoal")) for c in consumers] + [
            (s.topic.name, s.options.get("group", "shoal")) for s in sinks
        ]
        # The worker's elector: one connection leads every duty of this process.
        monitor = pipeline.monitor(
            topics,
            interval=settings.monitor_interval,
            elector=boss.elector(),
            **settings.monitor_options,
        )
        tasks.append(asyncio.create_task(monitor.run(stop)))
    log.info(
        "ingest on %s: %s",
        transport.name,
        ", ".join(c.topic.name for c in consumers) + " " + ", ".join(s.topic.name for s in sinks),
    )
    await asyncio.gather(*tasks)


async def _keep_running(
    what: str,
    consumer: Consumer[Any] | BatchConsumer[Any],
    stop: asyncio.Event,
    *,
    grace: timedelta,
    clock: Clock,
) -> None:
    """Run ``consumer`` until ``stop``; should it end on an error, log it and run it again.

    A consumer keeps itself going through broker and database outages; this
    is the last guard, for a bug. Without it the worker would live on with
    that topic unconsumed and nothing in its log until shutdown.
    """
    while True:
        try:
            await consumer.run(stop, grace=grace)
            return
        except Exception:
            if stop.is_set():
                raise
            log.exception(
                "ingest: the %s stopped on an error; starting it again in %g s",
                what,
                RESTART_PAUSE.total_seconds(),
            )
        await sleep_or_stop(stop, RESTART_PAUSE.total_seconds(), clock)
        if stop.is_set():
            return
