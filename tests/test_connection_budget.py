"""The ingest connection budget: defaults pass their own check; a failing one says what to do.

The reserve was a fixed 20 connections while the default pool is 10, so every
worker with a consumer logged "over the pool of 10 minus a reserve of 20
(= -10)". The reserve is now a quarter of the pool (at least 2), ``shoal
worker`` sizes its default pool to fit the app's consumers, and the ERROR names
the pool size (and the consumer slots) that would fit.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import pytest

from shoal import App, Message, Shoal, Topic
from shoal.cli.serve import worker_pool_size
from shoal.db.pool import DEFAULT_POOL_SIZE
from shoal.ingest.pipeline import check_connection_budget, pool_size_for
from shoal.ingest.postgres import PostgresTransport
from tests.conftest import wait_for

TOPIC: Topic[Any] = Topic("budget.readings")


def budget_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith("connection budget")]


def app_with_consumer(**options: Any) -> App:
    app = App()
    app.ingest_settings.transport = lambda b: PostgresTransport(b)
    app.ingest_settings.monitor = False

    @app.consumer(TOPIC, **options)
    async def apply(message: Message[Any]) -> None:
        pass

    return app


@asynccontextmanager
async def running(app: App, db_url: str, pool_size: int) -> AsyncIterator[None]:
    boss = await Shoal.connect(db_url, max_size=pool_size)
    stop = asyncio.Event()
    task = asyncio.create_task(
        app.run(boss, stop=stop, grace=timedelta(seconds=5), maintenance=False, scheduler=False)
    )
    try:
        yield
    finally:
        stop.set()
        await task
        await boss.close()


def test_the_default_pool_fits_a_few_consumer_slots(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="shoal.ingest")
    assert check_connection_budget(pool_size=DEFAULT_POOL_SIZE, consumers=4, writers=0) is True
    assert [r.levelno for r in budget_records(caplog)] == [logging.INFO]


async def test_a_worker_with_defaults_and_one_consumer_logs_no_budget_error(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="shoal.ingest")
    app = app_with_consumer()  # the consumer's default concurrency (30 applies at once)
    pool_size = worker_pool_size(argparse.Namespace(pool_size=None), app)
    async with running(app, db_url, pool_size):
        await wait_for(lambda: budget_records(caplog), 10)
    assert [r.levelno for r in budget_records(caplog)] == [logging.INFO]


async def test_an_over_budget_worker_logs_an_error_saying_what_to_change(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="shoal.ingest")
    app = app_with_consumer(concurrency=20)
    async with running(app, db_url, 10):
        await wait_for(lambda: budget_records(caplog), 10)
    (record,) = budget_records(caplog)
    assert record.levelno == logging.ERROR
    message = record.getMessage()
    assert "over the pool of 10 minus a reserve of 2 (= 8)" in message
    # 26 is the smallest pool whose quarter-reserve (6) leaves 20 connections.
    assert "Raise the pool to 26 (shoal worker --pool-size or SHOAL_POOL_SIZE" in message
    assert "to 8 in all" in message


def test_an_explicit_pool_size_is_kept_and_the_default_grows_only_for_ingest() -> None:
    app = app_with_consumer(concurrency=20)
    assert worker_pool_size(argparse.Namespace(pool_size=7), app) == 7
    assert worker_pool_size(argparse.Namespace(pool_size=None), app) == 26
    assert worker_pool_size(argparse.Namespace(pool_size=None), App()) == DEFAULT_POOL_SIZE


@pytest.mark.parametrize("need", [0, 1, 8, 9, 30, 31, 100])
def test_the_suggested_pool_is_the_smallest_that_passes(need: int) -> None:
    size = pool_size_for(need)
    assert check_connection_budget(pool_size=size, consumers=need, writers=0)
    assert not check_connection_budget(pool_size=size - 1, consumers=need, writers=0)
    assert pool_size_for(need, reserve=20) == need + 20
