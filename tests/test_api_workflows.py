"""``/v1/workflows``: start, list, inspect, cancel and retry runs, send events (issue 39).

The real app over a real database, through httpx's ASGI transport, with the
workflows of tests/wfopsapp.py run by workers in this event loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest

from shoal import Shoal
from shoal.api import create_api
from shoal.workflow import RunStatus, Workflows

from . import wfopsapp
from .conftest import wait_for
from .test_api import assert_error, client_for


@pytest.fixture
async def workflows(boss: Shoal) -> AsyncIterator[Workflows]:
    wfopsapp.broken["reserve"] = True
    api = wfopsapp.app.workflows(boss)
    for name in api.specs:
        api.work(name)
    yield api
    await boss.stop_workers(timedelta(seconds=5))


@pytest.fixture
async def client(boss: Shoal, workflows: Workflows) -> AsyncIterator[httpx.AsyncClient]:
    api = create_api(boss, wfopsapp.app.batches(boss), token=None, workflows=workflows)
    async with client_for(api) as c:
        yield c


async def settled(client: httpx.AsyncClient, run_id: str, *statuses: str) -> dict[str, Any]:
    want = set(statuses) or {"completed", "failed", "cancelled"}
    seen: dict[str, Any] = {}

    async def done() -> bool:
        answer = await client.get(f"/v1/workflows/runs/{run_id}")
        seen.update(answer.json())
        return seen.get("status") in want

    await wait_for(done)
    return seen


async def test_a_start_answers_201_with_the_run_and_200_for_the_same_id(
    client: httpx.AsyncClient,
) -> None:
    body = {"name": "ops.nap", "input": {"n": 1}, "id": "nap-1"}
    first = await client.post("/v1/workflows/runs", json=body)
    again = await client.post("/v1/workflows/runs", json={**body, "input": {"n": 2}})
    assert first.status_code == 201, first.text
    assert first.json() == {"id": "nap-1", "created": True}
    assert first.headers["location"] == "/v1/workflows/runs/nap-1"
    assert again.status_code == 200 and again.json() == {"id": "nap-1", "created": False}
    run = await settled(client, "nap-1", "sleeping")
    assert run["input"] == {"n": 1}
    generated = await client.post("/v1/workflows/runs", json={"name": "ops.nap"})
    assert generated.status_code == 201 and len(generated.json()["id"]) == 36


async def test_a_bad_start_is_refused_naming_the_field_and_starts_nothing(
    client: httpx.AsyncClient,
) -> None:
    unknown = assert_error(
        await client.post("/v1/workflows/runs", json={"name": "ops.nope"}), 422, "name"
    )
    assert "ops.order" in unknown["message"]  # the declared ones are named
    assert_error(
        await client.post("/v1/workflows/runs", json={"name": "ops.nap", "input": "a\x00"}),
        422,
        "input",
    )
    assert_error(
        await client.post("/v1/workflows/runs", json={"name": "ops.nap", "id": ""}), 422, "id"
    )
    assert_error(
        await client.post("/v1/workflows/runs", json={"name": "ops.nap", "extra": 1}),
        422,
        "extra",
    )
    assert (await client.get("/v1/workflows/runs")).json()["runs"] == []


async def test_a_failed_run_shows_its_steps_and_error_and_retry_resumes_at_that_step(
    client: httpx.AsyncClient,
) -> None:
    started = await client.post(
        "/v1/workflows/runs", json={"name": "ops.order", "input": {"sku": "A-1"}, "id": "o-1"}
    )
    assert started.status_code == 201
    run = await settled(client, "o-1")
    assert run["status"] == "failed"
    assert "inventory service refused A-1" in run["error"]
    steps = run["steps"]
    assert [(s["seq"], s["name"], s["kind"], s["status"]) for s in steps] == [
        (1, "check stock", "step", "completed"),
        (2, "reserve", "step", "failed"),
    ]
    assert steps[0]["result"] == 3 and steps[0]["finished_at"] is not None
    assert "Traceback" in steps[1]["error"] and "RuntimeError" in steps[1]["error"]

    wfopsapp.broken["reserve"] = False
    retried = await client.post("/v1/workflows/runs/o-1/retry")
    assert retried.status_code == 200, retried.text
    assert retried.json()["status"] in ("pending", "running", "completed")
    run = await settled(client, "o-1")
    assert run["status"] == "completed"
    assert run["result"] == {"stock": 3, "reservation": "reserved A-1"}
    assert [s["status"] for s in run["steps"]] == ["completed", "completed"]
    again = assert_error(await client.post("/v1/workflows/runs/o-1/retry"), 409, "run_id")
    assert "completed" in again["message"]


async def test_cancel_ends_a_sleeping_run_and_a_second_cancel_is_a_conflict(
    client: httpx.AsyncClient, boss: Shoal
) -> None:
    await client.post("/v1/workflows/runs", json={"name": "ops.nap", "id": "nap-c"})
    run = await settled(client, "nap-c", "sleeping")
    sleep = run["steps"][1]
    assert (sleep["kind"], sleep["status"]) == ("sleep", "waiting")
    assert sleep["until"] is not None and sleep["until"] > sleep["started_at"]
    cancelled = await client.post("/v1/workflows/runs/nap-c/cancel")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    # Its wake job is cancelled with it: nothing is left to resume the run.
    assert await boss.jobs("workflow.ops.nap", state="created") == []
    assert_error(await client.post("/v1/workflows/runs/nap-c/cancel"), 409, "run_id")


async def test_an_unknown_run_is_a_404_naming_the_run_id(client: httpx.AsyncClient) -> None:
    for answer in [
        await client.get("/v1/workflows/runs/no-such-run"),
        await client.post("/v1/workflows/runs/no-such-run/cancel"),
        await client.post("/v1/workflows/runs/no-such-run/retry"),
    ]:
        assert_error(answer, 404, "run_id")
    assert_error(await client.get("/v1/workflows/runs/" + "x" * 257), 422, "run_id")


async def test_a_run_id_with_a_slash_is_reached_encoded_or_not(client: httpx.AsyncClient) -> None:
    await client.post("/v1/workflows/runs", json={"name": "ops.nap", "id": "orders/7"})
    await settled(client, "orders/7", "sleeping")
    encoded = await client.get("/v1/workflows/runs/orders%2F7")
    assert encoded.status_code == 200 and encoded.json()["id"] == "orders/7"
    cancelled = await client.post("/v1/workflows/runs/orders/7/cancel")
    assert cancelled.json()["status"] == "cancelled"
    odd = await client.post("/v1/workflows/runs", json={"name": "ops.nap", "id": "café 7?#"})
    assert odd.status_code == 201, odd.text
    location = odd.headers["location"]
    assert location == "/v1/workflows/runs/caf%C3%A9%207%3F%23"
    assert (await client.get(location)).json()["id"] == "café 7?#"


async def test_runs_are_listed_newest_first_by_name_and_status_a_page_at_a_time(
    client: httpx.AsyncClient,
) -> None:
    for n in range(5):
        await client.post("/v1/workflows/runs", json={"name": "ops.nap", "id": f"nap-{n}"})
    await client.post(
        "/v1/workflows/runs", json={"name": "ops.order", "input": {"sku": "B"}, "id": "o-b"}
    )
    await settled(client, "o-b")
    first = (await client.get("/v1/workflows/runs", params={"name": "ops.nap", "limit": 3})).json()
    assert [r["id"] for r in first["runs"]] == ["nap-4", "nap-3", "nap-2"]
    assert first["next_cursor"] is not None
    second = (
        await client.get(
            "/v1/workflows/runs",
            params={"name": "ops.nap", "limit": 3, "cursor": first["next_cursor"]},
        )
    ).json()
    assert [r["id"] for r in second["runs"]] == ["nap-1", "nap-0"]
    assert second["next_cursor"] is None
    failed = (await client.get("/v1/workflows/runs", params={"status": "failed"})).json()
    assert [r["id"] for r in failed["runs"]] == ["o-b"]
    assert_error(await client.get("/v1/workflows/runs", params={"status": "odd"}), 422, "status")
    assert_error(await client.get("/v1/workflows/runs", params={"limit": 501}), 422, "limit")
    assert_error(await client.get("/v1/workflows/runs", params={"cursor": "zzz"}), 422, "cursor")
    names = (await client.get("/v1/workflows")).json()
    assert names == {
        "workflows": ["ops.approval", "ops.flaky", "ops.nap", "ops.order", "ops.parent"]
    }


async def test_an_event_resumes_the_run_waiting_for_its_key(client: httpx.AsyncClient) -> None:
    await client.post(
        "/v1/workflows/runs", json={"name": "ops.approval", "input": {"doc": 9}, "id": "ap-9"}
    )
    waiting = await settled(client, "ap-9", "waiting")
    assert waiting["wait_key"] == "approve:9"
    assert waiting["steps"][0]["until"] is not None  # its timeout's deadline
    sent = await client.post(
        "/v1/workflows/events", json={"key": "approve:9", "payload": {"ok": True}}
    )
    assert sent.status_code == 201, sent.text
    assert sent.json()["key"] == "approve:9" and sent.json()["id"] >= 1
    run = await settled(client, "ap-9")
    assert run["status"] == "completed" and run["result"] == {"ok": True}
    assert_error(await client.post("/v1/workflows/events", json={"key": ""}), 422, "key")


async def test_without_the_apps_workflows_runs_are_read_and_none_is_started(
    boss: Shoal, workflows: Workflows
) -> None:
    await workflows.start("ops.nap", id="plain")
    api = create_api(boss, wfopsapp.app.batches(boss), token=None)
    async with client_for(api) as c:
        assert (await c.get("/v1/workflows/runs/plain")).json()["name"] == "ops.nap"
        refused = await c.post("/v1/workflows/runs", json={"name": "ops.nap"})
    assert "none" in assert_error(refused, 422, "name")["message"]


async def test_a_read_only_api_refuses_workflow_writes(boss: Shoal, workflows: Workflows) -> None:
    await workflows.start("ops.nap", id="ro")
    api = create_api(boss, wfopsapp.app.batches(boss), token=None, read_only=True)
    async with client_for(api) as c:
        for path in ["/v1/workflows/runs/ro/cancel", "/v1/workflows/runs/ro/retry"]:
            assert assert_error(await c.post(path), 403, "method")["error"] == "read_only"
        refused = await c.post("/v1/workflows/runs", json={"name": "ops.nap"})
        assert assert_error(refused, 403, "method")["error"] == "read_only"
        sent = await c.post("/v1/workflows/events", json={"key": "k"})
        assert assert_error(sent, 403, "method")["error"] == "read_only"
        assert (await c.get("/v1/workflows/runs/ro")).status_code == 200
    assert (await workflows.get("ro")).status is not RunStatus.CANCELLED
