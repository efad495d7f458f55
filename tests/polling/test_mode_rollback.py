"""Rolling back from async to sync with a backlog on the topic: the consumer keeps
draining what was published, new polls apply in place, and nothing is lost or doubled."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from shoal import Shoal
from shoal_polling.domain import COLLECTION, OBSERVATIONS
from shoal_polling.ingest import PollingIngest
from tests.conftest import wait_for
from tests.polling.conftest import SMALL_FLEET
from tests.polling.rig import Rig, scalar

CARDS = SMALL_FLEET.accounts * SMALL_FLEET.cards_per_account
OBSERVED_PER_ROUND = CARDS * 3  # traffic, card status, real-name
FAST = {"poll": timedelta(milliseconds=50)}


async def _count(boss: Shoal, query: str) -> int:
    return int(await scalar(boss, query))


async def test_switching_back_to_sync_with_a_backlog_drains_it_and_loses_nothing(
    rig: Rig,
) -> None:
    # One slow consumer slot (server time added to each apply), so the switch
    # back lands while most of the backlog is still on the topic.
    slow = PollingIngest(
        rig.boss.db,
        rig.pipeline,
        plan_interval=timedelta(hours=1),
        apply_cost=timedelta(milliseconds=200),
    )
    consumer = rig.pipeline.consumer(OBSERVATIONS, slow.apply, concurrency=1, **FAST)
    sink = rig.pipeline.batch_consumer(
        COLLECTION, slow.write_batch, max_wait=timedelta(milliseconds=100), **FAST
    )
    rig.tasks += [
        asyncio.create_task(consumer.run(rig.stop)),
        asyncio.create_task(sink.run(rig.stop)),
    ]
    await rig.set_mode("async")
    await rig.round()
    assert rig.poller.stats.observations == OBSERVED_PER_ROUND
    await wait_for(lambda: consumer.stats.applied >= 1, 15)

    await rig.set_mode("sync")
    backlog = await rig.pipeline.transport.depth(OBSERVATIONS.name, "shoal")
    assert backlog.total > 0, "the switch must land while messages are still queued"

    # New polls apply in place while the consumer drains the old ones.
    await scalar(rig.boss, "UPDATE shoal_polling.due SET due_at = now()")
    await rig.round()
    assert rig.poller.stats.observations == 2 * OBSERVED_PER_ROUND
    assert rig.ingest.counts.applied == OBSERVED_PER_ROUND  # the second round: in place

    await wait_for(lambda: consumer.stats.applied == OBSERVED_PER_ROUND, 30)
    drained = await rig.pipeline.transport.depth(OBSERVATIONS.name, "shoal")
    assert drained.total == 0
    applied = "SELECT count(*) FROM shoal_polling.applied_observation"
    assert await _count(rig.boss, applied) == 2 * OBSERVED_PER_ROUND
    ok = "SELECT count(*) FROM shoal_polling.collection_record WHERE ok"

    async def recorded() -> bool:
        return await _count(rig.boss, ok) == 2 * OBSERVED_PER_ROUND

    await wait_for(recorded, 15)
    assert consumer.stats.business_errors == 0
    assert consumer.stats.duplicates == 0
