"""The console's answers to "which worker runs what", "why hasn't this job run"
and "get rid of this dead letter" (issue 38, items 2, 3 and 7), over a real
database (and a real nats-server for the nats transport's dead letters)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from psycopg import sql

from shoal import FakeClock, Shoal
from shoal.api import create_api
from shoal.batch.service import Batches
from shoal.ingest.message import Message
from shoal.ingest.nats import NatsTransport
from shoal.ingest.pipeline import Pipeline
from shoal.ingest.postgres import PostgresTransport
from shoal.ingest.transport import Transport
from shoal.queue.registry import WorkerRegistry
from shoal.testing import NatsServer

from .conftest import wait_for
from .ingest_helpers import READINGS, Reading, create_schema
from .test_api import KIND, TEST_APP
from .test_console_api import assert_error, client, client_for, dead_letters, topic_messages
from .test_ingest import FAST, running, stopped

__all__ = ["client"]  # the fixture, shared with the console API tests

# -- which worker runs what -----------------------------------------------------


async def stage_running_item(boss: Shoal, task_id: str, ref: str, holder: int) -> None:
    """An item as the guard leaves it when ``holder``'s process claims it (its job is
    taken, not held: the item names the process)."""
    query = sql.SQL(
        "UPDATE {}.item SET status = 'running', attempt = attempt + 1, started_at = now(), "
        "updated_at = now(), holder = %s WHERE task_id = %s AND ref = %s"
    ).format(sql.Identifier(boss.db.schema))

    async def run(conn: Any) -> None:
        cur = await conn.execute(query, (holder, task_id, ref))
        assert cur.rowcount == 1

    await boss.db.run(run)


async def test_a_worker_lists_the_jobs_and_items_it_runs_and_a_job_names_its_worker(
    boss: Shoal,
) -> None:
    batches = TEST_APP.batches(boss)
    api = create_api(boss, batches, token=None)
    other = Shoal(boss.db)  # another process: its claims name another registry row
    here = WorkerRegistry(boss, app="tests.here", queues={"email": 2})
    there = WorkerRegistry(other, app="tests.there", queues={"email": 2})
    await here.register()
    await there.register()
    for to in ("a", "b", "c"):
        await boss.send("email", {"to": f"{to}@example.com"})
    mine = await boss.fetch("email", 2)
    (theirs,) = await other.fetch("email", 1)
    created = await batches.create(KIND, ["r1", "r2"])
    assert here.no is not None
    await stage_running_item(boss, created.task_id, "r2", here.no)

    async with client_for(api) as client:
        r = await client.get(f"/v1/workers/{here.id}")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["app"] == "tests.here" and body["truncated"] is False
        jobs = [w for w in body["running_now"] if w["what"] == "job"]
        (item,) = [w for w in body["running_now"] if w["what"] == "item"]
        assert sorted(j["id"] for j in jobs) == sorted(j.id for j in mine)
        assert all(j["queue"] == "email" and j["lease_expires_at"] for j in jobs)
        assert {j["preview"] for j in jobs} == {f'{{"to": "{j.data["to"]}"}}' for j in mine}
        assert item["queue"] == f"batch.{KIND}" and item["task_id"] == created.task_id
        assert item["ref"] == "r2" and item["attempt"] == 1

        # The other process runs only its own job.
        r = await client.get(f"/v1/workers/{there.id}")
        assert [(w["what"], w["id"]) for w in r.json()["running_now"]] == [("job", theirs.id)]

        # Bounded: a limit cuts the list and says so.
        r = await client.get(f"/v1/workers/{here.id}", params={"limit": 1})
        assert len(r.json()["running_now"]) == 1 and r.json()["truncated"] is True
        assert_error(await client.get(f"/v1/workers/{here.id}", params={"limit": 0}), 422, "limit")

        # A job's page names the process that holds it, and its lease.
        job = (await client.get(f"/v1/jobs/{mine[0].id}")).json()
        assert job["holder"] == here.id and job["reason"] == "running"
        assert job["lease_expires_at"] is not None

        body = assert_error(await client.get("/v1/workers/nope"), 404, "worker_id")
        assert "no worker 'nope'" in body["message"]


# -- why hasn't this job run? ---------------------------------------------------


@pytest.fixture
async def fake_client(fake_boss: Shoal) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(create_api(fake_boss, Batches(fake_boss, {}), token=None)) as c:
        yield c


async def reason(client: httpx.AsyncClient, job_id: int | None) -> dict[str, Any]:
    r = await client.get(f"/v1/jobs/{job_id}")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def test_a_job_says_why_it_has_not_run(
    fake_boss: Shoal, fake_client: httpx.AsyncClient, clock: FakeClock
) -> None:
    boss, client = fake_boss, fake_client
    later = await boss.send("mail", {"n": 1}, start_after=timedelta(hours=1))
    job = await reason(client, later)
    assert job["reason"] == "scheduled" and job["state"] == "created"
    assert job["start_after"] == (clock.now() + timedelta(hours=1)).isoformat()
    assert job["now"] == clock.now().isoformat()

    # Due, but the queue is paused: that is the reason, with when it was paused.
    due = await boss.send("mail", {"n": 2})
    await boss.pause_queue("mail")
    job = await reason(client, due)
    assert job["reason"] == "queue_paused" and job["queue_paused_at"] is not None
    await boss.resume_queue("mail")
    assert (await reason(client, due))["reason"] == "due"

    # A failed attempt waiting out its retry delay: the policy and the next try.
    flaky = await boss.send(
        "flaky", {"n": 3}, retry_limit=3, retry_delay=timedelta(minutes=2), expire_in=60
    )
    (run,) = await boss.fetch("flaky")
    job = await reason(client, flaky)
    assert job["reason"] == "running" and job["expire_in_s"] == 60
    clock.advance(timedelta(seconds=61))
    assert (await reason(client, flaky))["reason"] == "lease_passed"
    await boss.fail(run, "gateway timeout")
    job = await reason(client, flaky)
    assert (job["state"], job["reason"], job["attempt"], job["retry_limit"]) == (
        "retry",
        "retry_wait",
        1,
        3,
    )
    assert job["retry_delay_s"] == 120 and job["retry_delay_max_s"] > 0
    assert job["start_after"] > clock.now().isoformat()
    assert job["errors"][0]["message"] == "gateway timeout"
    clock.advance(timedelta(hours=1))
    assert (await reason(client, flaky))["reason"] == "due"
    assert (await reason(client, later))["reason"] == "due"


# -- discard a dead letter ------------------------------------------------------


async def test_discarding_a_dead_letter_deletes_that_one_only(
    boss: Shoal, client: httpx.AsyncClient
) -> None:
    await dead_letters(boss, "cards", 3)
    page = (await client.get("/v1/topics/cards/dead")).json()["dead"]
    assert page[1]["envelope"]["body"] == {"n": 1}  # the body, for the page to show
    r = await client.delete(f"/v1/topics/cards/dead/{page[1]['id']}")
    assert r.json() == {
        "topic": "cards",
        "id": page[1]["id"],
        "message_id": "m1",
        "discarded": True,
    }
    left = (await client.get("/v1/topics/cards/dead")).json()["dead"]
    assert [d["message_id"] for d in left] == ["m0", "m2"]
    assert (await client.get("/v1/topics")).json()["topics"][0]["dead"] == 2

    # Once gone, or of another topic: 404 naming the letter; nothing changes.
    assert_error(await client.delete(f"/v1/topics/cards/dead/{page[1]['id']}"), 404, "dead_id")
    await dead_letters(boss, "other", 1)
    assert_error(await client.delete(f"/v1/topics/other/dead/{page[0]['id']}"), 404, "dead_id")
    assert_error(await client.delete(f"/v1/topics/nope/dead/{page[0]['id']}"), 404, "name")
    assert_error(await client.delete("/v1/topics/cards/dead/0"), 422, "dead_id")
    assert len((await client.get("/v1/topics/cards/dead")).json()["dead"]) == 2


def transport_of(kind: str, boss: Shoal, server: NatsServer | None) -> Transport:
    if kind == "postgres":
        return PostgresTransport(boss)
    assert server is not None
    return NatsTransport(server.url, monitor_url=server.monitor_url)


async def test_a_dead_letter_is_discarded_on_either_transport_and_never_comes_back(
    boss: Shoal, transport_kind: str, nats: NatsServer | None
) -> None:
    # A message dead-lettered by a real consumer past its retries: on the
    # postgres transport its job is left failed in the topic's queue, which
    # "retry failed" of that queue would deliver again; the discard takes it too.
    await create_schema(boss.db)
    pipeline = Pipeline(boss, transport_of(transport_kind, boss, nats))
    await pipeline.start()
    seen: list[str] = []

    async def failing(message: Message[Reading]) -> None:
        seen.append(message.id)
        raise TimeoutError("gateway")

    try:
        consumer = pipeline.consumer(
            READINGS, failing, concurrency=1, retry_limit=0, ladder=[timedelta(0)], poll=FAST
        )
        handle = await running(consumer)
        await pipeline.publish(READINGS, Reading(card_id=4, amount=1), id="obs-4")
        await wait_for(lambda: _letters(pipeline))
        await stopped(handle)
        (letter,) = await pipeline.store.dead_letters(READINGS.name)

        api = create_api(boss, Batches(boss, {}), token=None)
        async with client_for(api) as client:
            r = await client.delete(f"/v1/topics/{READINGS.name}/dead/{letter.id}")
            assert r.status_code == 200, r.text
            assert r.json()["message_id"] == "obs-4"
        assert await pipeline.store.dead_letters(READINGS.name, include_redriven=True) == []
        # Nothing of the message is left to deliver again.
        assert await topic_messages(boss, READINGS.name) == []
    finally:
        await pipeline.close()
    assert seen == ["obs-4"]


async def _letters(pipeline: Pipeline) -> bool:
    return bool(await pipeline.store.dead_letters(READINGS.name))
