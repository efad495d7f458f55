"""The backlog monitor's wait-time alert: ERROR once a topic's messages wait past
``alert_wait`` (10 minutes), on the fake clock."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from shoal import FakeClock, Shoal
from shoal.ingest.monitor import DEFAULT_ALERT_WAIT
from shoal.ingest.pipeline import Pipeline
from tests.ingest_helpers import READINGS, Reading, create_schema

TOPICS = [(READINGS.name, "shoal")]


@pytest.fixture
async def fake_pipeline(fake_boss: Shoal) -> AsyncIterator[Pipeline]:
    await create_schema(fake_boss.db)
    p = Pipeline(fake_boss)
    await p.start()
    yield p
    await p.close()


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "shoal.ingest.monitor" and r.levelno == logging.ERROR
    ]


async def test_a_message_waiting_past_ten_minutes_raises_the_alert(
    fake_pipeline: Pipeline, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="shoal.ingest.monitor")
    monitor = fake_pipeline.monitor(TOPICS)  # the default alert_depth is far away
    assert monitor.alert_wait == DEFAULT_ALERT_WAIT == timedelta(minutes=10)
    await fake_pipeline.publish(READINGS, Reading(1, 10))

    clock.advance(timedelta(minutes=9, seconds=59))
    (reading,) = await monitor.check()
    assert reading.wait == timedelta(minutes=9, seconds=59)
    assert not reading.alerted
    assert _errors(caplog) == []

    clock.advance(timedelta(seconds=2))
    (reading,) = await monitor.check()
    assert reading.wait == timedelta(minutes=10, seconds=1)
    assert reading.alerted
    (line,) = _errors(caplog)
    assert READINGS.name in line and "wait 601.0s" in line


async def test_the_wait_consumers_report_raises_it_too(
    fake_pipeline: Pipeline, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    # A consumer that just applied a message published 11 minutes ago reports
    # that wait; with a backlog left, the monitor alerts on it even though the
    # oldest message on the topic is young.
    caplog.set_level(logging.INFO, logger="shoal.ingest.monitor")
    monitor = fake_pipeline.monitor(TOPICS)
    await fake_pipeline.publish(READINGS, Reading(1, 10))
    await fake_pipeline.store.record_wait(READINGS.name, timedelta(minutes=11), now=clock.sql_now())
    (reading,) = await monitor.check()
    assert reading.wait == timedelta(minutes=11)
    assert reading.alerted
    assert len(_errors(caplog)) == 1

    # Drained (the messages gone as if applied): no backlog, so the reported wait no longer counts.
    await fake_pipeline.boss.db.run(
        lambda conn: conn.execute(
            f"DELETE FROM {fake_pipeline.boss.db.schema}.topic_message WHERE topic = %s",
            (READINGS.name,),
        )
    )
    (reading,) = await monitor.check()
    assert reading.depth.total == 0
    assert not reading.alerted
