"""An in-process polling rig: the gateway behind an ASGI transport, a pipeline, the poller."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx

from shoal import Pipeline, Shoal
from shoal.ingest.transport import Transport
from shoal_polling.domain import COLLECTION, MODE_KEY, OBSERVATIONS
from shoal_polling.gateway import Gateway, GatewaySettings, build_gateway_app
from shoal_polling.gateway_client import GatewayClient
from shoal_polling.ingest import PollingIngest
from shoal_polling.poller import Poller, PollerSettings

HOUR = timedelta(hours=1)
ONCE = PollerSettings(
    traffic_interval=HOUR,
    card_status_interval=HOUR,
    real_name_interval=HOUR,
    plan_interval=HOUR,
    failure_backoff=HOUR,
)


@dataclass
class Rig:
    boss: Shoal
    gateway: Gateway
    client: GatewayClient
    pipeline: Pipeline
    ingest: PollingIngest
    poller: Poller
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def set_mode(self, mode: str) -> None:
        await self.pipeline.config.set(MODE_KEY, mode)

    def start_consumers(self) -> None:
        fast = {"poll": timedelta(milliseconds=50)}
        self.tasks.append(
            asyncio.create_task(
                self.pipeline.consumer(OBSERVATIONS, self.ingest.apply, **fast).run(self.stop)
            )
        )
        self.tasks.append(
            asyncio.create_task(
                self.pipeline.batch_consumer(
                    COLLECTION,
                    self.ingest.write_batch,
                    max_wait=timedelta(milliseconds=100),
                    **fast,
                ).run(self.stop)
            )
        )

    async def round(self) -> int:
        started = await self.poller.run_once()
        await self.poller.drain()
        return started

    async def close(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.client.close()
        await self.pipeline.close()


async def open_rig(
    boss: Shoal,
    gateway: GatewaySettings | None = None,
    *,
    settings: PollerSettings = ONCE,
    transport: Callable[[Shoal], Transport] | None = None,
) -> Rig:
    sim = Gateway(gateway or GatewaySettings(latency_ms=0.0, rate_limit=0.0))
    client = GatewayClient(
        "http://gateway", transport=httpx.ASGITransport(app=build_gateway_app(sim))
    )
    pipeline = Pipeline(boss, None if transport is None else transport(boss), mode_key=MODE_KEY)
    await pipeline.start()
    ingest = PollingIngest(boss.db, pipeline, plan_interval=settings.plan_interval)
    poller = Poller(boss.db, pipeline, ingest, client, settings=settings)
    return Rig(boss, sim, client, pipeline, ingest, poller)


async def scalar(boss: Shoal, query: str, params: tuple[Any, ...] = ()) -> Any:
    async def run(conn: Any) -> Any:
        cur = await conn.execute(query, params)
        row = await cur.fetchone() if cur.description else None
        return None if row is None else row[0]

    return await boss.db.run(run, transaction=False)
