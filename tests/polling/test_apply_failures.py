"""An observation whose apply fails for good gets a failure record in the collection
stream, with its error, beside the gateway failures; the log lines about it name the
observation and its card."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shoal import NotFound, Shoal
from shoal_polling.domain import COLLECTION, OBSERVATIONS, Observation
from shoal_polling.ingest import PollingIngest
from tests.conftest import wait_for
from tests.polling.rig import Rig, scalar

OBSERVED = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)
FAST = {"poll": timedelta(milliseconds=50)}


def _observation(observation_id: str, card: str, account: str = "acct-x") -> Observation:
    return Observation(observation_id, card, account, "traffic", OBSERVED, used_kb=5)


async def _failure_record(boss: Shoal, observation_id: str) -> Any:
    return await scalar(
        boss,
        "SELECT error FROM shoal_polling.collection_record"
        " WHERE observation_id = %s AND NOT ok AND observed_at = %s",
        (f"{observation_id}:apply-failed", OBSERVED),
    )


async def _dead_reason(boss: Shoal, message_id: str) -> Any:
    return await scalar(
        boss,
        f"SELECT reason FROM {boss.db.schema}.ingest_dead WHERE message_id = %s",
        (message_id,),
    )


def _lines_about(caplog: pytest.LogCaptureFixture, observation_id: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name.startswith("shoal_polling") and observation_id in r.getMessage()
    ]


async def test_a_business_error_in_the_consumer_is_recorded_as_a_failed_collection_record(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="shoal_polling")
    await rig.pipeline.publish(
        OBSERVATIONS, _observation("obs-gone", "no-such-card"), id="obs-gone"
    )
    rig.start_consumers()
    await wait_for(lambda: _failure_record(rig.boss, "obs-gone"), 10)
    error = await _failure_record(rig.boss, "obs-gone")
    assert "NotFound" in error and "no-such-card" in error
    assert await _dead_reason(rig.boss, "obs-gone") == "business"
    assert rig.ingest.counts.failures_recorded == 1

    lines = _lines_about(caplog, "obs-gone")
    assert lines
    for line in lines:
        assert "no-such-card" in line.getMessage()
        assert getattr(line, "observation_id", None) == "obs-gone"
        assert getattr(line, "card_id", None) == "no-such-card"


async def test_a_business_error_of_a_sync_apply_is_recorded_too(rig: Rig) -> None:
    rig.start_consumers()
    with pytest.raises(NotFound):
        await rig.pipeline.submit(
            OBSERVATIONS, _observation("obs-sync", "no-such-card"), rig.ingest.apply, id="obs-sync"
        )
    await wait_for(lambda: _failure_record(rig.boss, "obs-sync"), 10)


async def test_the_last_allowed_attempt_of_a_retryable_failure_is_recorded(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="shoal_polling")
    card = await scalar(rig.boss, "SELECT min(id) FROM shoal_polling.card")
    account = await scalar(
        rig.boss, "SELECT account_id FROM shoal_polling.card WHERE id = %s", (card,)
    )
    # A serialization failure on every apply of this card: retryable, never succeeding.
    await scalar(
        rig.boss,
        "CREATE FUNCTION shoal_polling.fail_apply() RETURNS trigger LANGUAGE plpgsql AS"
        " $$BEGIN RAISE EXCEPTION 'test: could not serialize' USING ERRCODE = '40001'; END$$",
    )
    await scalar(
        rig.boss,
        "CREATE TRIGGER fail_apply BEFORE INSERT ON shoal_polling.applied_observation"
        " FOR EACH ROW EXECUTE FUNCTION shoal_polling.fail_apply()",
    )
    ingest = PollingIngest(rig.boss.db, rig.pipeline, retry_limit=2)
    consumer = rig.pipeline.consumer(
        OBSERVATIONS, ingest.apply, retry_limit=2, ladder=(timedelta(0),), **FAST
    )
    sink = rig.pipeline.batch_consumer(
        COLLECTION, ingest.write_batch, max_wait=timedelta(milliseconds=100), **FAST
    )
    rig.tasks += [
        asyncio.create_task(consumer.run(rig.stop)),
        asyncio.create_task(sink.run(rig.stop)),
    ]
    await rig.pipeline.publish(
        OBSERVATIONS, _observation("obs-stuck", card, account), id="obs-stuck"
    )
    await wait_for(lambda: _failure_record(rig.boss, "obs-stuck"), 10)
    assert "TransientError" in await _failure_record(rig.boss, "obs-stuck")
    assert await _dead_reason(rig.boss, "obs-stuck") == "attempts"
    assert consumer.stats.redelivered == 2
    # Attempts 1 and 2 were delivered again: only the last one was recorded.
    assert ingest.counts.failures_recorded == 1
    attempts = [r for r in _lines_about(caplog, "obs-stuck") if "apply attempt" in r.getMessage()]
    assert [("final" in r.getMessage()) for r in attempts] == [False, False, True]
    assert all(getattr(r, "card_id", None) == card for r in attempts)
