"""One plan interval for the poller and every apply: the worker's traffic apply sets the
"flow evaluated" marker from the shared setting the poller wrote, not from its own constant."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from shoal import InvalidInput, Message, Pipeline, Shoal
from shoal_polling.domain import MODE_KEY, OBSERVATIONS, Observation
from shoal_polling.ingest import (
    DEFAULT_PLAN_INTERVAL,
    PLAN_INTERVAL_KEY,
    PollingIngest,
    read_plan_interval,
    share_plan_interval,
)
from tests.polling.rig import scalar

OBSERVED = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)


async def _apply_traffic(boss: Shoal, ingest: PollingIngest, observation_id: str) -> datetime:
    card = await scalar(boss, "SELECT min(id) FROM shoal_polling.card")
    account = await scalar(boss, "SELECT account_id FROM shoal_polling.card WHERE id = %s", (card,))
    observation = Observation(observation_id, card, account, "traffic", OBSERVED, used_kb=10)
    await ingest.apply(Message(observation_id, OBSERVATIONS.name, observation, OBSERVED, 1))
    until = await scalar(
        boss, "SELECT flow_evaluated_until FROM shoal_polling.card WHERE id = %s", (card,)
    )
    assert isinstance(until, datetime)
    return until


async def test_the_workers_apply_follows_the_plan_interval_the_poller_set(polling: Shoal) -> None:
    poller_side = Pipeline(polling, mode_key=MODE_KEY)
    worker_side = Pipeline(polling, mode_key=MODE_KEY)  # another process's pipeline
    try:
        assert await share_plan_interval(poller_side, timedelta(hours=2)) == timedelta(hours=2)
        # Built as the worker's app builds it: no interval of its own.
        ingest = PollingIngest(polling.db, worker_side)
        assert await _apply_traffic(polling, ingest, "obs-1") == OBSERVED + timedelta(hours=2)
    finally:
        await poller_side.close()
        await worker_side.close()


async def test_a_poller_started_without_the_option_reads_the_shared_setting(
    polling: Shoal,
) -> None:
    pipeline = Pipeline(polling, mode_key=MODE_KEY)
    try:
        assert await share_plan_interval(pipeline, None) == DEFAULT_PLAN_INTERVAL
        await pipeline.config.set(PLAN_INTERVAL_KEY, 90)
        assert await share_plan_interval(pipeline, None) == timedelta(seconds=90)
    finally:
        await pipeline.close()


async def test_an_unusable_plan_interval_is_refused_or_falls_back_to_the_default(
    polling: Shoal, caplog: pytest.LogCaptureFixture
) -> None:
    pipeline = Pipeline(polling, mode_key=MODE_KEY)
    try:
        with pytest.raises(InvalidInput, match=PLAN_INTERVAL_KEY):
            await share_plan_interval(pipeline, timedelta(0))
        await pipeline.config.set(PLAN_INTERVAL_KEY, "soon")
        with caplog.at_level(logging.WARNING, logger="shoal_polling.ingest"):
            assert await read_plan_interval(pipeline) == DEFAULT_PLAN_INTERVAL
        assert "'soon'" in caplog.text
    finally:
        await pipeline.close()
