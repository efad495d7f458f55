"""A poller holds off while the backlog monitor pauses the collection topic, not only
the observation topic: every poll publishes its collection record."""

from __future__ import annotations

from shoal_polling.domain import COLLECTION, OBSERVATIONS
from tests.conftest import wait_for
from tests.polling.conftest import SMALL_FLEET
from tests.polling.rig import Rig, scalar

CARDS = SMALL_FLEET.accounts * SMALL_FLEET.cards_per_account


async def test_a_poller_holds_off_while_the_collection_topic_is_paused(rig: Rig) -> None:
    # Sync mode: the observations are applied in place, their records pile up on
    # the collection topic (no sink runs here).
    await rig.round()
    monitor = rig.pipeline.monitor(
        [(OBSERVATIONS.name, "shoal"), (COLLECTION.name, "shoal")], pause_depth=CARDS
    )
    observations, collection = await monitor.check()
    assert not observations.paused
    assert collection.paused
    await scalar(rig.boss, "UPDATE shoal_polling.due SET due_at = now()")
    rig.pipeline._admit.clear()  # the producers' 1 s cache of the flag
    assert await rig.poller.run_once() == 0
    assert rig.poller.stats.paused_rounds == 1
    assert rig.poller.stats.polls == CARDS * 4  # the first round's only


async def test_a_poller_resumes_once_the_collection_backlog_is_written(rig: Rig) -> None:
    await rig.round()
    monitor = rig.pipeline.monitor([(COLLECTION.name, "shoal")], pause_depth=CARDS)
    (reading,) = await monitor.check()
    assert reading.paused
    rig.start_consumers()  # the sink writes the backlog

    async def drained() -> bool:
        (again,) = await monitor.check()
        return not again.paused

    await wait_for(drained, 10)
    await scalar(rig.boss, "UPDATE shoal_polling.due SET due_at = now()")
    rig.pipeline._admit.clear()
    assert await rig.poller.run_once() > 0
