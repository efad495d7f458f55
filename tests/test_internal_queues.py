"""shoal's own queues and schedules (names starting ``shoal.``) stay out of the
lists an operator reads (CLI, ``/v1`` lists, the overview's charts) unless
asked for; a job asked for by id still shows (issue 38, item 4)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest

from shoal import FakeClock, PermanentError, Shoal
from shoal.api import create_api
from shoal.batch.aggregator import AGGREGATOR_QUEUE, AGGREGATOR_SCHEDULE
from shoal.batch.service import Batches
from shoal.internal import is_internal
from shoal.queue.history import FINE_S, HistorySampler
from shoal.queue.job import Job
from shoal.testing import drain
from tests.cli_helpers import shoal, with_boss


async def fail(job: Job) -> None:
    raise PermanentError("no")


async def ok(job: Job) -> None:
    return None


async def busy_cluster(boss: Shoal) -> int:
    """A user's queue beside an earlier release's aggregator jobs and schedule;
    the id of a finished aggregator job."""
    await boss.send("email", {"to": "a"}, retry_limit=0)
    await drain(boss, "email", fail)
    await boss.send("email", {"to": "b"})
    for _ in range(3):
        await boss.send(AGGREGATOR_QUEUE, {}, retry_limit=0)
    await drain(boss, AGGREGATOR_QUEUE, ok)
    await boss.send(AGGREGATOR_QUEUE, {}, retry_limit=0)
    await drain(boss, AGGREGATOR_QUEUE, fail)  # one failed internal job
    await boss.pause_queue(AGGREGATOR_QUEUE)
    await boss.schedule(AGGREGATOR_SCHEDULE, "* * * * * *", {}, queue=AGGREGATOR_QUEUE)
    await boss.schedule("digest", "0 0 * * *", {}, queue="email")
    internal = [j.id for j in await boss.jobs(AGGREGATOR_QUEUE)]
    return internal[0]


def client_for(boss: Shoal) -> httpx.AsyncClient:
    api = create_api(boss, Batches(boss, {}), token=None)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://127.0.0.1")


def test_internal_is_the_shoal_prefix() -> None:
    assert is_internal(AGGREGATOR_QUEUE) and is_internal(AGGREGATOR_SCHEDULE)
    assert not is_internal("email") and not is_internal("shoalish")


async def test_api_lists_hide_shoals_own_queues_unless_asked(boss: Shoal) -> None:
    job_id = await busy_cluster(boss)
    async with client_for(boss) as client:

        async def names(path: str, key: str, field: str, **params: Any) -> set[str]:
            r = await client.get(path, params=params)
            assert r.status_code == 200, r.text
            return {row[field] for row in r.json()[key]}

        assert await names("/v1/queues", "queues", "queue") == {"email"}
        assert AGGREGATOR_QUEUE in await names("/v1/queues", "queues", "queue", internal="true")
        assert await names("/v1/jobs", "jobs", "queue") == {"email"}
        assert AGGREGATOR_QUEUE in await names("/v1/jobs", "jobs", "queue", internal="true")
        # The failed-only list walks another query: it hides them too.
        assert await names("/v1/jobs", "jobs", "queue", state="failed") == {"email"}
        # A queue named explicitly is an explicit ask.
        assert await names("/v1/jobs", "jobs", "queue", queue=AGGREGATOR_QUEUE) == {
            AGGREGATOR_QUEUE
        }
        assert await names("/v1/schedules", "schedules", "name") == {"digest"}
        assert await names("/v1/schedules", "schedules", "name", internal="true") == {
            "digest",
            AGGREGATOR_SCHEDULE,
        }
        counts = (await client.get("/v1/overview")).json()["counts"]
        assert (counts["failed_jobs"], counts["paused_queues"]) == (1, 0)
        r = await client.get("/v1/overview", params={"internal": "true"})
        assert (r.json()["counts"]["failed_jobs"], r.json()["counts"]["paused_queues"]) == (2, 1)

        r = await client.get(f"/v1/jobs/{job_id}")  # asked for by id: shown
        assert r.status_code == 200 and r.json()["queue"] == AGGREGATOR_QUEUE


async def test_overview_chart_of_all_queues_leaves_out_shoals_own(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    await fake_boss.send("email", {}, retry_limit=0)
    for _ in range(5):
        await fake_boss.send(AGGREGATOR_QUEUE, {}, retry_limit=0)
    clock.advance(timedelta(seconds=1))
    await drain(fake_boss, "email", ok)
    await drain(fake_boss, AGGREGATOR_QUEUE, ok)
    await fake_boss.send(AGGREGATOR_QUEUE, {})  # one waiting
    clock.advance(timedelta(seconds=FINE_S))
    await HistorySampler(fake_boss).sample_once()
    async with client_for(fake_boss) as client:
        for params, queue, completed, waiting in [
            ({}, "*", [1], [0]),
            ({"internal": "true"}, "**", [6], [1]),
        ]:
            for path in ("/v1/overview", "/v1/history"):
                body = (await client.get(path, params={"window": "15m", **params})).json()
                chart = body.get("history", body)
                assert chart["queue"] == queue
                assert chart["series"]["completed"] == completed, path
                assert chart["series"]["waiting"] == waiting, path


def test_cli_lists_hide_shoals_own_queues_unless_asked(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with_boss(db_url, busy_cluster)
    capsys.readouterr()
    for argv in (["status"], ["jobs"], ["schedule", "list"]):
        assert shoal(db_url, *argv) == 0
        out = capsys.readouterr().out
        # (a narrow table column may wrap the rest of the name)
        assert "email" in out and "shoal.batch" not in out, argv
        assert shoal(db_url, *argv, "--internal") == 0
        assert "shoal.batch" in capsys.readouterr().out, argv
