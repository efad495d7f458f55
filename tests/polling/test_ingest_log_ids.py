"""Log lines of the apply path name the observation and its card (text and attributes)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest

from shoal import Message, Pipeline, Shoal
from shoal_polling.domain import MODE_KEY, OBSERVATIONS, Observation
from shoal_polling.ingest import PollingIngest
from tests.polling.rig import scalar

OBSERVED = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)


async def test_the_applied_line_names_the_observation_and_its_card(
    polling: Shoal, caplog: pytest.LogCaptureFixture
) -> None:
    card = await scalar(polling, "SELECT min(id) FROM shoal_polling.card")
    account = await scalar(
        polling, "SELECT account_id FROM shoal_polling.card WHERE id = %s", (card,)
    )
    pipeline = Pipeline(polling, mode_key=MODE_KEY)
    try:
        ingest = PollingIngest(polling.db, pipeline)
        observation = Observation(
            "obs-log", card, account, "card_status", OBSERVED, status="active"
        )
        with caplog.at_level(logging.DEBUG, logger="shoal_polling.ingest"):
            await ingest.apply(Message("obs-log", OBSERVATIONS.name, observation, OBSERVED, 1))
    finally:
        await pipeline.close()
    (line,) = [r for r in caplog.records if r.name == "shoal_polling.ingest"]
    assert "obs-log" in line.getMessage() and card in line.getMessage()
    assert getattr(line, "observation_id", None) == "obs-log"
    assert getattr(line, "card_id", None) == card
