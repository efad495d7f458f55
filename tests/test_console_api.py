"""The console's ``/v1`` routes over a real database: each action really changes
state (and a retried job really runs again); bad input changes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from psycopg import sql

from shoal import FakeClock, PermanentError, Shoal
from shoal.api import create_api
from shoal.app import App
from shoal.batch.service import Batches
from shoal.console.topics import TopicInspector
from shoal.ingest.message import new_envelope
from shoal.ingest.store import IngestStore
from shoal.queue.job import Job
from shoal.queue.states import JobId, JobState
from shoal.testing import drain

EMPTY_APP = App()


def client_for(api: FastAPI) -> httpx.AsyncClient:
    """A client as the console page is: on a loopback name, sending X-Shoal-Request."""
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api),
        base_url="http://127.0.0.1",
        headers={"X-Shoal-Request": "1"},
    )


@pytest.fixture
async def client(boss: Shoal) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(create_api(boss, Batches(boss, {}), token=None)) as c:
        yield c


async def fail_job(job: Job) -> None:
    raise PermanentError(f"cannot send to {job.data['to']}")


async def ok(job: Job) -> dict[str, Any]:
    return {"sent": job.data["to"]}


async def failed_jobs(boss: Shoal, queue: str, n: int) -> list[JobId]:
    ids = [await boss.send(queue, {"to": f"u{i}@example.com"}, retry_limit=0) for i in range(n)]
    result = await drain(boss, queue, fail_job)
    assert result.failed == n
    return [i for i in ids if i is not None]


def assert_error(response: httpx.Response, status: int, field: str | None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert set(body) == {"error", "message", "field"}
    assert body["field"] == field, body
    return body


# -- queues ---------------------------------------------------------------------


async def test_queues_list_pause_resume_and_refuse_unknown(
    boss: Shoal, client: httpx.AsyncClient
) -> None:
    await failed_jobs(boss, "email", 2)
    await boss.send("email", {"to": "x"})
    r = await client.get("/v1/queues")
    assert r.status_code == 200
    (email,) = r.json()["queues"]
    assert email["counts"]["failed"] == 2 and email["counts"]["created"] == 1
    assert email["failed_5m"] == 2 and email["paused"] is False

    r = await client.post("/v1/queues/email/pause")
    assert r.json() == {"queue": "email", "paused": True}
    assert await boss.paused_queues() == ["email"]
    assert (await client.get("/v1/queues")).json()["queues"][0]["paused"] is True
    r = await client.post("/v1/queues/email/resume")
    assert r.json() == {"queue": "email", "paused": False}
    assert await boss.paused_queues() == []

    body = assert_error(await client.post("/v1/queues/nosuchqueue/pause"), 404, "name")
    assert "known queues: email" in body["message"]
    assert await boss.paused_queues() == []  # no ghost queue


async def test_retry_failed_of_a_queue_runs_them_again(
    boss: Shoal, client: httpx.AsyncClient
) -> None:
    await failed_jobs(boss, "email", 3)
    r = await client.post("/v1/queues/email/retry-failed")
    assert r.json() == {"queue": "email", "count": 3}
    result = await drain(boss, "email", ok)
    assert result.completed == 3
    r = await client.post("/v1/queues/email/retry-failed")
    assert r.json()["count"] == 0
    assert_error(await client.post("/v1/queues/nope/retry-failed"), 404, "name")


async def test_delete_failed_of_a_queue(boss: Shoal, client: httpx.AsyncClient) -> None:
    await failed_jobs(boss, "email", 2)
    kept = await boss.send("email", {"to": "k"})
    r = await client.post("/v1/queues/email/delete-failed")
    assert r.json() == {"queue": "email", "count": 2}
    assert [j.id for j in await boss.jobs("email")] == [kept]


# -- jobs -----------------------------------------------------------------------


async def test_jobs_list_failed_first_newest_first_keyset_paged(
    boss: Shoal, client: httpx.AsyncClient
) -> None:
    early = [
        await boss.send("mail", {"to": f"w{i}"}, start_after=timedelta(hours=1)) for i in range(2)
    ]
    failed = await failed_jobs(boss, "mail", 3)
    late = [await boss.send("mail", {"to": f"l{i}"}) for i in range(2)]
    await boss.send("other", {"to": "o"})
    expected = [*reversed(failed), *reversed(late), *reversed(early)]

    seen: list[int] = []
    cursor = None
    for _ in range(10):
        params: dict[str, Any] = {"queue": "mail", "limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = (await client.get("/v1/jobs", params=params)).json()
        seen += [j["id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == expected
    assert (await client.get("/v1/jobs", params={"queue": "mail", "limit": 7})).json()[
        "next_cursor"
    ] is None

    only_failed = (await client.get("/v1/jobs", params={"state": "failed"})).json()["jobs"]
    assert [j["id"] for j in only_failed] == list(reversed(failed))
    assert only_failed[0]["error"] == "cannot send to u2@example.com"
    everything = (await client.get("/v1/jobs")).json()["jobs"]
    assert len(everything) == 8


async def test_jobs_search_by_id_and_singleton_key(boss: Shoal, client: httpx.AsyncClient) -> None:
    keyed = await boss.send("mail", {"to": "a"}, singleton_key="order-77")
    other = await boss.send("mail", {"to": "b"})
    found = (await client.get("/v1/jobs", params={"q": "order-77"})).json()["jobs"]
    assert [j["id"] for j in found] == [keyed]
    found = (await client.get("/v1/jobs", params={"q": str(other)})).json()["jobs"]
    assert [j["id"] for j in found] == [other]
    assert (await client.get("/v1/jobs", params={"q": "nothing"})).json()["jobs"] == []
    # A digit that is not an ASCII digit is a key to look for, not an id.
    assert (await client.get("/v1/jobs", params={"q": "²"})).json()["jobs"] == []


async def test_jobs_bad_input_names_the_field(boss: Shoal, client: httpx.AsyncClient) -> None:
    await boss.send("mail", {"to": "a"})
    for params, field in [
        ({"cursor": "bogus"}, "cursor"),
        ({"cursor": "7.12"}, "cursor"),
        ({"state": "exploded"}, "state"),
        ({"limit": "0"}, "limit"),
        ({"limit": "501"}, "limit"),
        # Postgres text cannot hold NUL: refused before the query, not a 500 from it.
        ({"q": "a\x00b"}, "q"),
        ({"state": "failed", "queue": "ma\x00il"}, "queue"),
    ]:
        assert_error(await client.get("/v1/jobs", params=params), 422, field)
    assert_error(await client.get("/v1/topics/t%00/dead"), 422, "name")
    body = assert_error(await client.get("/v1/jobs", params={"queue": "nope"}), 404, "queue")
    assert "known queues: mail" in body["message"]


async def test_job_page_has_payload_output_errors_and_timings(
    boss: Shoal, client: httpx.AsyncClient
) -> None:
    attempts = {"n": 0}

    async def flaky(job: Job) -> dict[str, Any]:
        attempts["n"] += 1
        if attempts["n"] < 3:
            raise RuntimeError(f"smtp down ({attempts['n']})")
        return {"sent": True}

    job_id = await boss.send("mail", {"to": "a"}, retry_limit=5, retry_delay=0)
    assert (await drain(boss, "mail", flaky)).completed == 1
    job = (await client.get(f"/v1/jobs/{job_id}")).json()
    assert job["state"] == "completed" and job["data"] == {"to": "a"}
    assert job["output"] == {"sent": True}
    assert [(e["attempt"], e["type"], e["message"]) for e in job["errors"]] == [
        (1, "RuntimeError", "smtp down (1)"),
        (2, "RuntimeError", "smtp down (2)"),
    ]
    assert all(datetime.fromisoformat(e["at"]) for e in job["errors"])
    assert "RuntimeError" in job["errors"][0]["traceback"]
    assert job["wait_s"] >= 0 and job["run_s"] >= 0 and job["attempt"] == 3

    assert_error(await client.get("/v1/jobs/999999"), 404, "job_id")
    assert_error(await client.get("/v1/jobs/abc"), 422, "job_id")


async def test_retry_cancel_delete_a_job(boss: Shoal, client: httpx.AsyncClient) -> None:
    (failed,) = await failed_jobs(boss, "mail", 1)
    r = await client.post(f"/v1/jobs/{failed}/retry")
    assert r.status_code == 200 and r.json()["state"] == "retry"
    assert (await drain(boss, "mail", ok)).completed == 1
    assert (await boss.get_job(failed)).state is JobState.COMPLETED
    # A completed job cannot be retried or cancelled: 409, unchanged.
    assert_error(await client.post(f"/v1/jobs/{failed}/retry"), 409, "job_id")
    assert_error(await client.post(f"/v1/jobs/{failed}/cancel"), 409, "job_id")
    assert (await boss.get_job(failed)).state is JobState.COMPLETED

    waiting = await boss.send("mail", {"to": "w"})
    assert_error(await client.post(f"/v1/jobs/{waiting}/cancel?by="), 422, "by")
    r = await client.post(f"/v1/jobs/{waiting}/cancel")
    assert r.json()["state"] == "cancelled"
    # Who cancelled it, and when, is on its history (the console sends by=console).
    (note,) = r.json()["errors"]
    assert (note["type"], note["message"]) == ("Cancelled", "cancelled by api") and note["at"]
    r = await client.post(f"/v1/jobs/{waiting}/retry")  # a cancelled job runs again too
    assert r.json()["state"] == "created"
    assert (await drain(boss, "mail", ok)).completed == 1

    r = await client.delete(f"/v1/jobs/{waiting}")
    assert r.json() == {"id": waiting, "deleted": True}
    assert_error(await client.get(f"/v1/jobs/{waiting}"), 404, "job_id")
    assert_error(await client.delete(f"/v1/jobs/{waiting}"), 404, "job_id")

    active = await boss.send("mail", {"to": "a"})
    (claimed,) = await boss.fetch("mail")
    assert claimed.id == active
    assert_error(await client.delete(f"/v1/jobs/{active}"), 409, "job_id")
    assert (await boss.get_job(active)).state is JobState.ACTIVE


# -- schedules ------------------------------------------------------------------


async def test_schedules_list_pause_resume_remove(db_url: str) -> None:
    from shoal.db.pool import Database

    clock = FakeClock(datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC))
    db = await Database(db_url, max_size=4).open()
    boss = Shoal(db, clock=clock, listen=False)
    try:
        await boss.schedule("digest", "*/10 * * * * *", {"kind": "daily"}, queue="mail")
        async with client_for(create_api(boss, Batches(boss, {}), token=None)) as client:
            clock.advance(timedelta(seconds=10))
            ticks, _ = await boss.scheduler().run_once()
            assert len(ticks) == 1
            (s,) = (await client.get("/v1/schedules")).json()["schedules"]
            assert s["name"] == "digest" and s["queue"] == "mail" and s["paused"] is False
            assert s["last_job_state"] == "created" and s["last_job_id"] is not None
            assert datetime.fromisoformat(s["next_run"]) == datetime(
                2026, 1, 1, 12, 0, 20, tzinfo=UTC
            )

            r = await client.post("/v1/schedules/digest/pause")
            assert r.json()["paused"] is True
            clock.advance(timedelta(seconds=30))
            assert (await boss.scheduler().run_once())[0] == []  # paused: no tick
            (s,) = (await client.get("/v1/schedules")).json()["schedules"]
            assert s["paused"] is True and s["next_run"] is None

            await client.post("/v1/schedules/digest/resume")
            assert (await boss.scheduler().run_once())[0] == []  # missed ticks are not sent
            clock.advance(timedelta(seconds=10))
            assert len((await boss.scheduler().run_once())[0]) == 1

            body = assert_error(await client.post("/v1/schedules/nope/pause"), 404, "name")
            assert "known schedules: digest" in body["message"]
            r = await client.delete("/v1/schedules/digest")
            assert r.json()["removed"] is True
            assert (await client.get("/v1/schedules")).json()["schedules"] == []
            assert_error(await client.delete("/v1/schedules/digest"), 404, "name")
    finally:
        await boss.close()


async def test_an_app_removes_the_schedules_it_no_longer_declares(boss: Shoal) -> None:
    import asyncio

    stop = asyncio.Event()
    stop.set()
    before = App(name="billing")
    before.schedule("digest", "0 0 * * *")
    before.schedule("report", "0 3 * * *")
    await before.run(boss, stop=stop, maintenance=False, scheduler=False)
    await boss.schedule("manual", "0 4 * * *")  # declared by no App: never removed
    other = App(name="shipping")
    other.schedule("labels", "0 5 * * *")
    await other.run(boss, stop=stop, maintenance=False, scheduler=False)

    after = App(name="billing")
    after.schedule("report", "0 3 * * *")
    await after.run(boss, stop=stop, maintenance=False, scheduler=False)
    assert sorted(s.name for s in await boss.schedules()) == ["labels", "manual", "report"]


# -- topics ---------------------------------------------------------------------


async def dead_letters(boss: Shoal, topic: str, n: int) -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    letters = [
        (
            f"m{i}",
            new_envelope({"n": i}, published_at=now, id=f"m{i}").encode().decode(),
            f"ValueError: bad row {i}",
            3,
        )
        for i in range(n)
    ]
    await IngestStore(boss.db).dead_letter(topic, "attempts", letters, now=None)


async def topic_messages(boss: Shoal, topic: str) -> list[str]:
    """The message ids the postgres transport holds for ``topic``, in publish order."""
    rows = await boss.db.fetch(
        sql.SQL(
            "SELECT envelope::jsonb ->> 'id' FROM shoal.topic_message WHERE topic = %(t)s"
            " ORDER BY id"
        ).format(),
        {"t": topic},
    )
    return [r[0] for r in rows]


async def test_topics_dead_letters_and_redrive(boss: Shoal, client: httpx.AsyncClient) -> None:
    await dead_letters(boss, "cards", 3)
    (topic,) = (await client.get("/v1/topics")).json()["topics"]
    assert topic["topic"] == "cards" and topic["dead"] == 3

    page = (await client.get("/v1/topics/cards/dead", params={"limit": 2})).json()
    assert [d["message_id"] for d in page["dead"]] == ["m0", "m1"]
    assert page["dead"][0]["error"] == "ValueError: bad row 0"
    rest = (
        await client.get("/v1/topics/cards/dead", params={"cursor": page["next_cursor"]})
    ).json()
    assert [d["message_id"] for d in rest["dead"]] == ["m2"] and rest["next_cursor"] is None

    one = page["dead"][1]["id"]
    r = await client.post("/v1/topics/cards/redrive", json={"ids": [one]})
    assert r.json() == {"topic": "cards", "redriven": 1}
    assert await topic_messages(boss, "cards") == ["m1"]
    r = await client.post("/v1/topics/cards/redrive")
    assert r.json()["redriven"] == 2
    assert sorted(await topic_messages(boss, "cards")) == ["m0", "m1", "m2"]
    assert (await client.get("/v1/topics")).json()["topics"][0]["dead"] == 0

    body = assert_error(await client.get("/v1/topics/nope/dead"), 404, "name")
    assert "known topics: cards" in body["message"]
    assert_error(await client.post("/v1/topics/nope/redrive"), 404, "name")
    assert_error(await client.get("/v1/topics/cards/dead", params={"cursor": "x"}), 422, "cursor")
    assert len(await TopicInspector(boss).topics()) == 1


# -- read-only ------------------------------------------------------------------


async def test_read_only_refuses_every_mutating_route(boss: Shoal) -> None:
    (failed,) = await failed_jobs(boss, "mail", 1)
    await boss.schedule("digest", "0 0 * * *", queue="mail")
    await dead_letters(boss, "cards", 1)
    api = create_api(boss, Batches(boss, {}), token=None, read_only=True)
    mutating = [
        (method.upper(), path)
        for path, operations in api.openapi()["paths"].items()
        if path.startswith("/v1")
        for method in operations
        if method not in ("get", "head")
    ]
    assert len(mutating) >= 14
    fill = {"{name}": "mail", "{job_id}": str(failed), "{task_id}": "x", "{dead_id}": "1"}
    async with client_for(api) as client:
        for method, template in mutating:
            path = template
            for key, value in fill.items():
                path = path.replace(key, value)
            body = assert_error(await client.request(method, path), 403, "method")
            assert body["error"] == "read_only", (method, path)
        assert (await client.get("/v1/jobs")).status_code == 200
    assert (await boss.get_job(failed)).state is JobState.FAILED
    assert await boss.paused_queues() == []
    assert len(await boss.schedules()) == 1


class RecordingTransport:
    """A transport that keeps the connection each publish was given (or fails)."""

    name = "recording"

    def __init__(self, *, in_database: bool, fail: bool = False) -> None:
        self.in_database = in_database
        self.fail = fail
        self.conns: list[object] = []

    async def publish(self, topic: str, envelopes: Any, **kwargs: Any) -> None:
        self.conns.append(kwargs.get("conn"))
        if self.fail:
            raise RuntimeError("publish refused")


@pytest.mark.parametrize("in_database", [True, False])
async def test_a_redrive_publishes_in_its_transaction_when_the_transport_says_it_can(
    boss: Shoal, in_database: bool
) -> None:
    # Any transport whose messages live in the database joins the redrive's
    # transaction (the transport says so, whatever its class); one that does
    # not is never handed a connection it could not use.
    await dead_letters(boss, "cards", 1)
    transport = RecordingTransport(in_database=in_database)
    assert await TopicInspector(boss).redrive("cards", transport) == 1  # type: ignore[arg-type]  # a recording fake of the protocol's one method used
    (conn,) = transport.conns
    assert (conn is not None) is in_database


async def test_a_failed_redrive_publish_leaves_the_dead_letters_waiting(boss: Shoal) -> None:
    await dead_letters(boss, "cards", 2)
    inspector = TopicInspector(boss)
    with pytest.raises(RuntimeError, match="publish refused"):
        await inspector.redrive("cards", RecordingTransport(in_database=True, fail=True))  # type: ignore[arg-type]  # as above
    assert [t.dead for t in await inspector.topics()] == [2]
