"""The HTTP contract of ``docs/api.md``, route by route and status by status.

Every test runs the real app (``create_api``) over a real database: most talk
to it in-process through httpx's ASGI transport; the slow-body test and the CLI
test talk to a real uvicorn server over TCP on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import psycopg
import pytest
import uvicorn
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from shoal import PermanentError, Shoal
from shoal.api import create_api
from shoal.api.server import api_config
from shoal.app import App
from shoal.batch.aggregator import ZOMBIES_REAPED
from shoal.batch.item import Item
from shoal.batch.item_runner import CANCELLED_SKIPS, PHANTOM_SKIPS
from shoal.batch.service import Batches
from shoal.cli import main as cli_main
from shoal.db.pool import Database

from .conftest import wait_for

KIND = "api.echo"
TOKEN = "s3cret-token"

TEST_APP = App()


@TEST_APP.batch(KIND, concurrency=10, retry_limit=0, retry_delay=timedelta(milliseconds=50))
async def echo(item: Item) -> dict[str, Any]:
    """Returns its ref; ``{"fail": true}`` in the data fails it for good."""
    data = item.data if isinstance(item.data, dict) else {}
    if data.get("fail"):
        raise PermanentError(f"{item.ref}: cannot be processed")
    return {"ref": item.ref}


# -- fixtures -----------------------------------------------------------------


@pytest.fixture
def batches(boss: Shoal) -> Batches:
    return TEST_APP.batches(boss)


def client_for(api: FastAPI, **headers: str) -> httpx.AsyncClient:
    """A client as the API's own page is: on a loopback name, sending X-Shoal-Request."""
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api),
        base_url="http://127.0.0.1",
        headers={"X-Shoal-Request": "1", **headers},
    )


@pytest.fixture
async def client(boss: Shoal, batches: Batches) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(create_api(boss, batches, token=None)) as c:
        yield c


@pytest.fixture
async def worker(boss: Shoal) -> AsyncIterator[None]:
    """TEST_APP's workers and aggregator, running in this event loop."""
    stop = asyncio.Event()
    run = asyncio.create_task(TEST_APP.run(boss, stop=stop, grace=timedelta(seconds=2)))
    try:
        yield
    finally:
        stop.set()
        await run


def rows(db_url: str, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(db_url) as conn:
        return conn.execute(query, params).fetchall()


def written(db_url: str) -> tuple[int, int, int]:
    """Tasks, items and item jobs in the database."""
    ((tasks, items, jobs),) = rows(
        db_url,
        "SELECT (SELECT count(*) FROM shoal.task), (SELECT count(*) FROM shoal.item), "
        f"(SELECT count(*) FROM shoal.job WHERE queue = 'batch.{KIND}')",
    )
    return tasks, items, jobs


def assert_error(response: httpx.Response, status: int, field: str | None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert set(body) == {"error", "message", "field"}
    assert body["field"] == field
    assert body["message"]
    if field is not None:
        assert field in body["message"]
    return body


async def finished(client: httpx.AsyncClient, task_id: str) -> dict[str, Any]:
    """The task once the aggregator has closed it."""
    view: dict[str, Any] = {}

    async def closed() -> bool:
        nonlocal view
        view = (await client.get(f"/v1/tasks/{task_id}")).json()
        return bool(view["status"] != "processing")

    await wait_for(closed, timeout_s=15)
    return view


class _TestServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        # Leave pytest's own signal handling alone.
        yield


@contextlib.asynccontextmanager
async def serving(api: FastAPI) -> AsyncIterator[tuple[str, int]]:
    """A real uvicorn server for ``api`` on 127.0.0.1, on a port the OS picked."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = api_config(api, lifespan="off", log_level="warning", ws="none")
    server = _TestServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await wait_for(lambda: server.started, timeout_s=10)
        yield "127.0.0.1", port
    finally:
        server.should_exit = True
        await task
        sock.close()


# -- POST /v1/tasks -----------------------------------------------------------


async def test_create_answers_202_with_the_task_id_and_writes_task_items_and_jobs(
    client: httpx.AsyncClient, db_url: str
) -> None:
    response = await client.post(
        "/v1/tasks",
        json={
            "kind": KIND,
            "items": ["a", {"ref": "b", "data": {"n": 1}}, {"ref": "c"}],
            "params": {"model": "m1"},
            "deadline_s": 3600,
        },
    )
    assert response.status_code == 202, response.text
    body = response.json()
    assert body == {"task_id": body["task_id"], "created": True}
    assert response.headers["location"] == f"/v1/tasks/{body['task_id']}"
    assert written(db_url) == (1, 3, 3)


async def test_an_idempotent_repeat_answers_200_with_the_same_id(
    client: httpx.AsyncClient, db_url: str
) -> None:
    request = {"kind": KIND, "items": ["a", "b"], "idempotency_key": "order-17"}
    first = await client.post("/v1/tasks", json=request)
    again = await client.post("/v1/tasks", json=request)
    assert first.status_code == 202
    assert again.status_code == 200
    assert again.json() == {"task_id": first.json()["task_id"], "created": False}
    assert written(db_url) == (1, 2, 2)


async def test_the_idempotency_key_may_come_as_a_header(
    client: httpx.AsyncClient, db_url: str
) -> None:
    request = {"kind": KIND, "items": ["a"]}
    first = await client.post("/v1/tasks", json=request, headers={"Idempotency-Key": "h-1"})
    in_body = await client.post("/v1/tasks", json={**request, "idempotency_key": "h-1"})
    assert (first.status_code, in_body.status_code) == (202, 200)
    assert in_body.json()["task_id"] == first.json()["task_id"]
    both = await client.post(
        "/v1/tasks", json={**request, "idempotency_key": "h-2"}, headers={"Idempotency-Key": "h-3"}
    )
    assert_error(both, 422, "idempotency_key")
    assert written(db_url) == (1, 1, 1)


async def test_a_key_reused_for_a_different_request_answers_422_and_writes_nothing(
    client: httpx.AsyncClient, db_url: str
) -> None:
    await client.post("/v1/tasks", json={"kind": KIND, "items": ["a"], "idempotency_key": "k"})
    other = await client.post(
        "/v1/tasks", json={"kind": KIND, "items": ["a", "b"], "idempotency_key": "k"}
    )
    body = assert_error(other, 422, "idempotency_key")
    assert body["error"] == "idempotency_mismatch"
    assert written(db_url) == (1, 1, 1)


async def test_a_key_held_by_a_create_in_flight_answers_409_then_the_retry_succeeds(
    client: httpx.AsyncClient, boss: Shoal, batches: Batches, db_url: str, monkeypatch: Any
) -> None:
    # How long a create waits on a concurrent one before answering 409.
    monkeypatch.setattr("shoal.batch.service.IDEMPOTENCY_WAIT", timedelta(milliseconds=300))
    request = {"kind": KIND, "items": ["a"], "idempotency_key": "slow"}
    holder_inserted = asyncio.Event()
    release = asyncio.Event()

    async def hold_the_key() -> None:
        # The same create, stopped inside its transaction after taking the key.
        store_insert = batches.store.insert_task

        async def insert_and_wait(conn: Any, task: Any, *, now: Any) -> Any:
            await store_insert(conn, task, now=now)
            holder_inserted.set()
            await release.wait()
            raise RuntimeError("the holder gives up")  # rolls its transaction back

        monkeypatch.setattr(batches.store, "insert_task", insert_and_wait)
        with contextlib.suppress(RuntimeError):
            await batches.create(KIND, ["a"], idempotency_key="slow")

    holder = asyncio.create_task(hold_the_key())
    await asyncio.wait_for(holder_inserted.wait(), 5)
    api_batches = TEST_APP.batches(boss)  # a store of its own: its inserts are not held
    async with client_for(create_api(boss, api_batches, token=None)) as api_client:
        busy = await api_client.post("/v1/tasks", json=request)
        body = assert_error(busy, 409, "idempotency_key")
        assert body["error"] == "still_creating"
        assert busy.headers["retry-after"]
        release.set()
        await holder
        retry = await api_client.post("/v1/tasks", json=request)
    assert retry.status_code == 202, retry.text
    assert written(db_url) == (1, 1, 1)


async def test_fifty_concurrent_identical_posts_create_exactly_one_task(
    client: httpx.AsyncClient, db_url: str
) -> None:
    request = {
        "kind": KIND,
        "items": [f"doc-{i}" for i in range(200)],
        "idempotency_key": "burst",
    }
    responses = await asyncio.gather(*(client.post("/v1/tasks", json=request) for _ in range(50)))
    statuses = [r.status_code for r in responses]
    assert statuses.count(202) == 1, statuses
    assert set(statuses) <= {200, 202, 409}, statuses
    ids = {r.json()["task_id"] for r in responses if r.status_code in (200, 202)}
    assert len(ids) == 1
    (task_id,) = ids
    for response in responses:
        if response.status_code == 409:  # the client's retry, as Retry-After says
            assert_error(response, 409, "idempotency_key")
            retry = await client.post("/v1/tasks", json=request)
            assert retry.status_code == 200
            assert retry.json()["task_id"] == task_id
    assert written(db_url) == (1, 200, 200)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"items": ["a"]}, "kind"),
        ({"kind": KIND}, "items"),
        ({"kind": 7, "items": ["a"]}, "kind"),
        ({"kind": "no.such.kind", "items": ["a"]}, "kind"),
        ({"kind": KIND, "items": "a"}, "items"),
        ({"kind": KIND, "items": []}, "items"),
        ({"kind": KIND, "items": ["a", "a"]}, "items[1].ref"),
        ({"kind": KIND, "items": ["a", 5]}, "items[1].ref"),
        ({"kind": KIND, "items": [{"ref": "a", "extra": 1}]}, "items[0]"),
        ({"kind": KIND, "items": [{"ref": "a", "data": "x" * 9000}]}, "items[0].data"),
        ({"kind": KIND, "items": ["a"], "deadline_s": -1}, "deadline_s"),
        ({"kind": KIND, "items": ["a"], "deadline_s": "60"}, "deadline_s"),
        ({"kind": KIND, "items": ["a"], "idempotency_key": ""}, "idempotency_key"),
        ({"kind": KIND, "items": ["a"], "surprise": True}, "surprise"),
        ({"kind": KIND, "items": ["a"], "params": {"blob": "x" * 9000}}, "params"),
    ],
)
async def test_bad_input_answers_422_naming_the_field_and_writes_nothing(
    client: httpx.AsyncClient, db_url: str, body: dict[str, Any], field: str
) -> None:
    assert_error(await client.post("/v1/tasks", json=body), 422, field)
    assert written(db_url) == (0, 0, 0)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": KIND, "items": ["a\x00b"]}, "items[0]"),
        ({"kind": KIND, "items": [{"ref": "a", "data": {"k": "v\x00"}}]}, "items[0].data.k"),
        ({"kind": KIND, "items": [{"ref": "a", "data": {"k\x00": 1}}]}, "items[0].data (a key)"),
        ({"kind": KIND + "\x00", "items": ["a"]}, "kind"),
        ({"kind": KIND, "items": ["a"], "params": ["ok", "n\x00"]}, "params[1]"),
        ({"kind": KIND, "items": ["a"], "idempotency_key": "k\x00"}, "idempotency_key"),
    ],
)
async def test_strings_with_nul_answer_422_naming_the_field_and_write_nothing(
    client: httpx.AsyncClient, db_url: str, body: dict[str, Any], field: str
) -> None:
    assert_error(await client.post("/v1/tasks", json=body), 422, field)
    assert written(db_url) == (0, 0, 0)


async def test_a_lone_surrogate_answers_422_not_500(client: httpx.AsyncClient, db_url: str) -> None:
    raw = b'{"kind": "api.echo", "items": ["a"], "params": {"p": "\\ud800"}}'
    response = await client.post(
        "/v1/tasks", content=raw, headers={"Content-Type": "application/json"}
    )
    assert_error(response, 422, "params.p")
    assert written(db_url) == (0, 0, 0)


async def test_a_body_that_is_not_json_answers_422(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/tasks", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    body = assert_error(response, 422, "body")
    assert "not valid JSON" in body["message"]


async def test_too_many_items_answer_422(boss: Shoal, db_url: str) -> None:
    capped = Batches(boss, TEST_APP.kinds, max_items=3)
    async with client_for(create_api(boss, capped, token=None)) as c:
        response = await c.post("/v1/tasks", json={"kind": KIND, "items": list("abcd")})
    assert_error(response, 422, "items")
    assert written(db_url) == (0, 0, 0)


# -- reading, control, export ---------------------------------------------------


async def test_a_task_reports_status_outcome_and_progress_until_it_completes(
    client: httpx.AsyncClient, worker: None
) -> None:
    created = await client.post(
        "/v1/tasks",
        json={"kind": KIND, "items": ["a", "b", {"ref": "c", "data": {"fail": True}}]},
    )
    task_id = created.json()["task_id"]
    early = (await client.get(f"/v1/tasks/{task_id}")).json()
    assert {
        "task_id",
        "kind",
        "status",
        "outcome",
        "progress",
        "created_at",
        "completed_at",
    } <= set(early)
    assert early["task_id"] == task_id
    assert early["kind"] == KIND
    assert early["progress"]["total"] == 3
    assert {"total", "pending", "running", "completed", "error", "percent"} <= set(
        early["progress"]
    )
    done = await finished(client, task_id)
    assert done["status"] == "completed"
    assert done["outcome"] == "completed_with_errors"
    assert done["completed_at"] is not None
    assert done["progress"] == {
        "total": 3,
        "pending": 0,
        "running": 0,
        "completed": 2,
        "error": 1,
        "cancelled": 0,
        "percent": 100.0,
    }


async def test_tasks_are_listed_newest_first_and_filter_by_status(
    client: httpx.AsyncClient, batches: Batches
) -> None:
    ids = [
        (await client.post("/v1/tasks", json={"kind": KIND, "items": [f"x{i}"]})).json()["task_id"]
        for i in range(3)
    ]
    listed = (await client.get("/v1/tasks")).json()["tasks"]
    assert [t["task_id"] for t in listed] == ids[::-1]
    assert listed[0]["progress"]["total"] == 1
    assert len((await client.get("/v1/tasks?limit=2")).json()["tasks"]) == 2
    await client.post(f"/v1/tasks/{ids[0]}/cancel")
    await batches.aggregator.run_once()
    cancelled = (await client.get("/v1/tasks?status=cancelled")).json()["tasks"]
    assert [t["task_id"] for t in cancelled] == [ids[0]]
    assert_error(await client.get("/v1/tasks?status=bogus"), 422, "status")
    assert_error(await client.get("/v1/tasks?limit=0"), 422, "limit")


async def test_items_page_by_cursor_and_filter_by_status_with_their_errors(
    client: httpx.AsyncClient, worker: None
) -> None:
    items = [{"ref": f"r{i}", "data": {"fail": i % 3 == 0}} for i in range(7)]
    task_id = (await client.post("/v1/tasks", json={"kind": KIND, "items": items})).json()[
        "task_id"
    ]
    await finished(client, task_id)
    first = (await client.get(f"/v1/tasks/{task_id}/items?limit=4")).json()
    assert [i["ref"] for i in first["items"]] == ["r0", "r1", "r2", "r3"]
    assert first["next_cursor"] is not None
    rest = (
        await client.get(f"/v1/tasks/{task_id}/items?limit=4&cursor={first['next_cursor']}")
    ).json()
    assert [i["ref"] for i in rest["items"]] == ["r4", "r5", "r6"]
    assert rest["next_cursor"] is None
    failed = (await client.get(f"/v1/tasks/{task_id}/items?status=error")).json()
    assert [i["ref"] for i in failed["items"]] == ["r0", "r3", "r6"]
    item = failed["items"][0]
    assert {"ref", "status", "attempts", "result", "error", "errors"} <= set(item)
    assert item["status"] == "error"
    assert item["attempts"] == 1
    assert "cannot be processed" in item["error"]
    assert item["errors"][0]["type"] == "PermanentError"
    done = (await client.get(f"/v1/tasks/{task_id}/items?status=completed&limit=1")).json()
    assert done["items"][0]["result"] == {"ref": "r1"}
    assert_error(await client.get(f"/v1/tasks/{task_id}/items?status=nope"), 422, "status")
    assert_error(await client.get(f"/v1/tasks/{task_id}/items?limit=1001"), 422, "limit")
    assert_error(await client.get(f"/v1/tasks/{task_id}/items?cursor=-1"), 422, "cursor")
    huge = await client.get(f"/v1/tasks/{task_id}/items?cursor={2**70}")
    assert_error(huge, 422, "cursor")


async def test_cancel_stops_pending_items_and_retry_failed_undoes_it(
    client: httpx.AsyncClient, batches: Batches
) -> None:
    task_id = (await client.post("/v1/tasks", json={"kind": KIND, "items": ["a", "b"]})).json()[
        "task_id"
    ]
    cancelled = await client.post(f"/v1/tasks/{task_id}/cancel")
    assert cancelled.status_code == 200
    assert cancelled.json()["progress"]["cancelled"] == 2
    await batches.aggregator.run_once()
    view = (await client.get(f"/v1/tasks/{task_id}")).json()
    assert (view["status"], view["outcome"]) == ("cancelled", "cancelled")
    assert_error(await client.post(f"/v1/tasks/{task_id}/cancel"), 409, "task_id")
    # The undo: retry-failed reopens the cancelled items and the task.
    retried = await client.post(f"/v1/tasks/{task_id}/retry-failed")
    assert retried.status_code == 200, retried.text
    body = retried.json()
    assert body["retried"] == 2
    assert (body["task"]["status"], body["task"]["outcome"]) == ("processing", None)
    assert body["task"]["progress"]["pending"] == 2
    pending = (await client.get(f"/v1/tasks/{task_id}/items?status=pending")).json()["items"]
    assert [i["ref"] for i in pending] == ["a", "b"]
    # Reopened, it can be cancelled again.
    assert (await client.post(f"/v1/tasks/{task_id}/cancel")).status_code == 200


async def test_retry_failed_reopens_the_task_and_its_error_items(
    client: httpx.AsyncClient, batches: Batches, worker: None
) -> None:
    task_id = (
        await client.post(
            "/v1/tasks",
            json={"kind": KIND, "items": ["ok", {"ref": "bad", "data": {"fail": True}}]},
        )
    ).json()["task_id"]
    assert (await finished(client, task_id))["outcome"] == "completed_with_errors"
    retried = await client.post(f"/v1/tasks/{task_id}/retry-failed")
    assert retried.status_code == 200, retried.text
    body = retried.json()
    assert body["task_id"] == task_id
    assert body["retried"] == 1
    assert body["task"]["status"] == "processing"
    # It fails for good again: the task closes again, with the same outcome.
    assert (await finished(client, task_id))["outcome"] == "completed_with_errors"
    again = (await client.get(f"/v1/tasks/{task_id}/items?status=error")).json()["items"]
    assert again[0]["attempts"] == 1
    assert len(again[0]["errors"]) == 2


async def test_export_streams_every_item_as_json_lines_and_csv(
    client: httpx.AsyncClient, worker: None
) -> None:
    refs = [f"doc-{i:04}" for i in range(1203)]  # more than one export page
    task_id = (await client.post("/v1/tasks", json={"kind": KIND, "items": refs})).json()["task_id"]
    await finished(client, task_id)
    lines = await client.get(f"/v1/tasks/{task_id}/export")
    assert lines.status_code == 200
    assert lines.headers["content-type"].startswith("application/x-ndjson")
    exported = [json.loads(line) for line in lines.text.splitlines()]
    assert [e["ref"] for e in exported] == refs
    assert exported[5]["result"] == {"ref": "doc-0005"}
    table = await client.get(f"/v1/tasks/{task_id}/export?format=csv")
    assert table.headers["content-type"].startswith("text/csv")
    parsed = list(csv.DictReader(io.StringIO(table.text)))
    assert [r["ref"] for r in parsed] == refs
    assert json.loads(parsed[0]["result"]) == {"ref": "doc-0000"}
    assert_error(await client.get(f"/v1/tasks/{task_id}/export?format=xml"), 422, "format")


@pytest.mark.parametrize(
    "task_id",
    [
        "7b0a4cf6-9b0e-4d8a-9d7e-0d3f1d0c2a11",  # well formed, absent
        "not-a-task",
        "urn:uuid:7b0a4cf6-9b0e-4d8a-9d7e-0d3f1d0c2a11",  # Python takes it, Postgres doesn't
        "+7b0a4cf69b0e4d8a9d7e0d3f1d0c2a1",
    ],
)
async def test_an_unknown_task_answers_404_on_every_route(
    client: httpx.AsyncClient, task_id: str
) -> None:
    for method, path in [
        ("GET", ""),
        ("GET", "/items"),
        ("POST", "/cancel"),
        ("POST", "/retry-failed"),
        ("GET", "/export"),
    ]:
        response = await client.request(method, f"/v1/tasks/{task_id}{path}")
        assert_error(response, 404, "task_id")


async def test_unknown_routes_and_methods_answer_json(client: httpx.AsyncClient) -> None:
    assert_error(await client.get("/v2/tasks"), 404, "path")
    assert_error(await client.delete("/v1/tasks"), 405, "method")


# -- queues, health, metrics ----------------------------------------------------


async def test_queues_report_jobs_per_state(client: httpx.AsyncClient) -> None:
    await client.post("/v1/tasks", json={"kind": KIND, "items": ["a", "b"]})
    queues = (await client.get("/v1/queues")).json()["queues"]
    (queue,) = [q for q in queues if q["queue"] == f"batch.{KIND}"]
    assert queue["counts"]["created"] == 2
    assert queue["counts"]["active"] == 0
    assert queue["oldest_waiting_s"] is not None
    assert queue["paused"] is False


async def test_health_is_open_and_ready_means_the_database_answers(
    client: httpx.AsyncClient,
) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    assert (await client.get("/readyz")).json() == {"status": "ready"}


async def test_ready_and_v1_answer_503_when_the_database_does_not() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    db = Database(
        f"postgresql://shoal@127.0.0.1:{dead_port}/nowhere", deadline=timedelta(seconds=1)
    )
    away = Shoal(await db.open(check=False), listen=False)
    try:
        async with client_for(create_api(away, TEST_APP.batches(away), token=None)) as c:
            assert (await c.get("/healthz")).status_code == 200
            body = assert_error(await c.get("/readyz"), 503, "database")
            assert body["error"] == "not_ready"
            busy = await c.get("/v1/tasks")  # not the client's fault: 503, retry later
            assert assert_error(busy, 503, None)["error"] == "unavailable"
            assert busy.headers["retry-after"]
            assert str(dead_port) not in busy.text  # the cause stays in the server log
    finally:
        await away.close()


async def test_metrics_expose_items_guards_latency_and_queue_depth(
    client: httpx.AsyncClient, boss: Shoal, batches: Batches, worker: None
) -> None:
    done = (await client.post("/v1/tasks", json={"kind": KIND, "items": ["a", "b"]})).json()
    await finished(client, done["task_id"])
    await batches.store.count_event(PHANTOM_SKIPS, 4)
    await batches.store.count_event(ZOMBIES_REAPED, 2)
    await batches.store.count_event(CANCELLED_SKIPS, 3)
    await boss.send("reports")
    text = (await client.get("/metrics")).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    phantom = families["shoal_batch_phantom_skips"]
    assert phantom.type == "counter"
    assert phantom.samples[0].value == 4
    assert families["shoal_batch_zombies_reaped"].samples[0].value == 2
    assert families["shoal_batch_cancelled_skips"].samples[0].value == 3  # not phantoms
    latency = families["shoal_batch_completion_detection_seconds"]
    assert latency.type == "summary"
    quantiles = {s.labels["quantile"]: s.value for s in latency.samples}
    assert set(quantiles) == {"0.5", "0.9", "0.99", "1"}
    assert all(0 <= v < 5 for v in quantiles.values())
    depth = {
        (s.labels["queue"], s.labels["state"]): s.value
        for s in families["shoal_queue_jobs"].samples
    }
    assert depth[("reports", "created")] == 1
    # A taken item job is deleted: the finished task left nothing in its kind's queue.
    assert not any(depth.get((f"batch.{KIND}", state)) for state in ("created", "completed"))
    items = {
        (s.labels["kind"], s.labels["state"]): s.value
        for s in families["shoal_batch_items"].samples
    }
    assert items[(KIND, "pending")] == 0  # the only task is closed


async def test_metrics_count_items_of_unfinished_tasks_by_state(
    client: httpx.AsyncClient,
) -> None:
    await client.post("/v1/tasks", json={"kind": KIND, "items": ["a", "b", "c"]})
    text = (await client.get("/metrics")).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    items = {
        (s.labels["kind"], s.labels["state"]): s.value
        for s in families["shoal_batch_items"].samples
    }
    assert items[(KIND, "pending")] == 3
    assert items[(KIND, "completed")] == 0


# -- auth -------------------------------------------------------------------------


async def test_with_a_token_v1_and_metrics_need_it_and_health_stays_open(
    boss: Shoal, batches: Batches
) -> None:
    api = create_api(boss, batches, token=TOKEN)
    async with client_for(api) as anonymous:
        for path in ["/v1/tasks", "/v1/queues", "/metrics"]:
            missing = await anonymous.get(path)
            assert_error(missing, 401, "authorization")
            assert missing.headers["www-authenticate"].startswith("Bearer")
        creating = await anonymous.post("/v1/tasks", json={"kind": KIND, "items": ["a"]})
        assert_error(creating, 401, "authorization")
        basic = await anonymous.get("/v1/tasks", headers={"Authorization": "Basic dTpw"})
        assert_error(basic, 401, "authorization")
        for path in ["/healthz", "/readyz", "/", "/openapi.json"]:
            assert (await anonymous.get(path)).status_code == 200, path
    async with client_for(api, Authorization="Bearer wrong") as wrong:
        assert_error(await wrong.get("/v1/tasks"), 403, "authorization")
        assert_error(await wrong.get("/metrics"), 403, "authorization")
    async with client_for(api, Authorization=f"Bearer {TOKEN}") as allowed:
        assert (await allowed.get("/v1/tasks")).status_code == 200
        assert (await allowed.get("/metrics")).status_code == 200
        created = await allowed.post("/v1/tasks", json={"kind": KIND, "items": ["a"]})
        assert created.status_code == 202


async def test_the_openapi_document_declares_bearer_auth_when_a_token_is_set(
    boss: Shoal, batches: Batches
) -> None:
    async with client_for(create_api(boss, batches, token=TOKEN)) as c:
        spec = (await c.get("/openapi.json")).json()
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert "/v1/tasks" in spec["paths"]
    assert "/v1/tasks/{task_id}/retry-failed" in spec["paths"]


def test_the_cli_refuses_a_non_loopback_bind_without_a_token(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SHOAL_API_TOKEN", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    assert cli_main(["api", "--app", "shoal.demo:app", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "without a token" in err
    # Checked before anything starts: no embedded server was launched.
    assert "starting embedded" not in err


# -- limits: body size and slow bodies -------------------------------------------


async def test_a_body_over_the_cap_answers_413_by_content_length_and_writes_nothing(
    boss: Shoal, batches: Batches, db_url: str
) -> None:
    api = create_api(boss, batches, token=None, max_body_bytes=1024)
    body = {"kind": KIND, "items": [f"doc-{i}" for i in range(500)]}
    async with client_for(api) as c:
        response = await c.post("/v1/tasks", json=body)
        assert_error(response, 413, "body")
        assert "1024" in response.json()["message"]
        small = await c.post("/v1/tasks", json={"kind": KIND, "items": ["a"]})
        assert small.status_code == 202
    assert written(db_url) == (1, 1, 1)


async def test_a_streamed_body_without_length_is_counted_and_cut_at_the_cap(
    boss: Shoal, batches: Batches, db_url: str
) -> None:
    api = create_api(boss, batches, token=None, max_body_bytes=1024)
    payload = json.dumps({"kind": KIND, "items": [f"doc-{i}" for i in range(500)]}).encode()

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(payload), 256):
            yield payload[start : start + 256]

    async with client_for(api) as c:
        response = await c.post(
            "/v1/tasks", content=chunks(), headers={"Content-Type": "application/json"}
        )
    assert "content-length" not in response.request.headers
    assert_error(response, 413, "body")
    assert written(db_url) == (0, 0, 0)


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_over_tcp_a_refused_big_body_still_reaches_the_client_as_413(
    boss: Shoal, batches: Batches, db_url: str, framing: str
) -> None:
    # Closing a socket with unread request bytes resets the connection and the
    # client never sees the answer; the server reads the rest first.
    api = create_api(boss, batches, token=None, max_body_bytes=64 * 1024)
    payload = json.dumps({"kind": KIND, "items": [f"{i:0500}" for i in range(16_000)]}).encode()

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(payload), 32 * 1024):
            yield payload[start : start + 32 * 1024]

    async with serving(api) as (host, port), httpx.AsyncClient(timeout=20) as c:
        response = await c.post(
            f"http://{host}:{port}/v1/tasks",
            content=payload if framing == "content-length" else chunks(),
            headers={"Content-Type": "application/json"},
        )
    assert_error(response, 413, "body")
    assert written(db_url) == (0, 0, 0)


async def test_a_client_expecting_100_continue_gets_413_before_sending_the_body(
    boss: Shoal, batches: Batches
) -> None:
    api = create_api(boss, batches, token=None, max_body_bytes=1024)
    head = (
        b"POST /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Expect: 100-continue\r\nContent-Length: 5000000\r\n\r\n"
    )
    async with serving(api) as (host, port):
        answer, _ = await _raw_exchange(host, port, head, [], 0)
    assert answer.startswith(b"HTTP/1.1 413"), answer
    assert b"100 Continue" not in answer


async def _raw_exchange(
    host: str, port: int, head: bytes, body_chunks: list[bytes], gap_s: float
) -> tuple[bytes, float]:
    """Send ``head`` then each chunk ``gap_s`` apart; the raw answer and when it came."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection(host, port)
    started = loop.time()
    writer.write(head)
    await writer.drain()

    async def trickle() -> None:
        with contextlib.suppress(ConnectionError):
            for chunk in body_chunks:
                await asyncio.sleep(gap_s)  # noqa: TID251 - a slow client, byte by byte
                writer.write(chunk)
                await writer.drain()

    sender = asyncio.create_task(trickle())
    try:
        answer = await asyncio.wait_for(reader.read(), timeout=20)  # to EOF: the server closes
        return answer, loop.time() - started
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sender
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def test_a_slow_body_is_cut_off_by_the_whole_request_deadline_with_408(
    boss: Shoal, batches: Batches, db_url: str
) -> None:
    api = create_api(boss, batches, token=None, request_deadline_s=1.0)
    body = json.dumps({"kind": KIND, "items": ["a"]}).encode()
    head = (
        b"POST /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
    )
    # One byte every 0.2 s: no single read waits long, the whole body would take 6 s.
    async with serving(api) as (host, port):
        answer, elapsed = await _raw_exchange(host, port, head, [bytes([b]) for b in body], 0.2)
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 408"), answer
    payload = json.loads(rest.partition(b"\r\n\r\n")[2])
    assert payload["field"] == "body"
    assert "not received within 1 s" in payload["message"]
    # Cut off before the whole body was in, however slow the machine: the
    # deadline, not the client, ended it.
    arrived = int(payload["message"].partition("(")[2].partition(" bytes")[0])
    assert arrived < len(body)
    assert elapsed >= 1.0  # not before the deadline (a lower bound: a slow machine only adds)
    assert written(db_url) == (0, 0, 0)


async def test_a_prompt_body_over_tcp_is_served_normally(boss: Shoal, batches: Batches) -> None:
    api = create_api(boss, batches, token=None, request_deadline_s=1.0)
    async with serving(api) as (host, port), httpx.AsyncClient() as c:
        created = await c.post(
            f"http://{host}:{port}/v1/tasks", json={"kind": KIND, "items": ["a"]}
        )
    assert created.status_code == 202


# -- shoal api --------------------------------------------------------------------


async def test_shoal_api_serves_the_demo_app_until_sigterm(db_url: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "shoal.cli", "--database-url", db_url, "api"],
        *["--app", "shoal.demo:app", "--host", "127.0.0.1", "--port", str(port)],
        env={**os.environ, "SHOAL_API_TOKEN": TOKEN},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as c:

            async def up() -> bool:
                assert proc.returncode is None, "shoal api exited early"
                try:
                    return (await c.get(f"{base}/healthz")).status_code == 200
                except httpx.TransportError:
                    return False

            await wait_for(up, timeout_s=30, interval_s=0.1)
            created = await c.post(
                f"{base}/v1/tasks",
                json={"kind": "demo.sleep", "items": [{"ref": "p1", "data": {"sleep_ms": 1}}]},
            )
            assert created.status_code == 202, created.text
            anonymous = await c.get(f"{base}/v1/tasks", headers={"Authorization": ""})
            assert anonymous.status_code == 401
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(proc.communicate(), timeout=20)
    assert proc.returncode == 0, output.decode(errors="replace")
    assert written_kind(db_url, "demo.sleep") == 1


def written_kind(db_url: str, kind: str) -> int:
    ((count,),) = rows(db_url, "SELECT count(*) FROM shoal.task WHERE kind = %s", (kind,))
    return int(count)
