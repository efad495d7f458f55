"""``POST /v1/tasks`` takes the batch kinds workers stored, not only the API's own.

An API started before a new batch kind was deployed answered 422 ``unknown
batch kind`` for it until restarted, while SQL's ``create_task()`` and
``SyncBatches`` created its tasks from the settings the kind's workers stored
at their start (issue 35, item 10).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from shoal import Shoal
from shoal.api import create_api
from shoal.app import App
from shoal.batch.item import Item
from shoal.db.pool import Database

from .conftest import wait_for

API_KIND = "api.own"
DEPLOYED_KIND = "deployed.later"

# What `shoal api --app` imported: it knows only its own kind.
API_APP = App(name="api-app")
# The App deployed later, run by its own worker; the API never imports it.
WORKER_APP = App(name="worker-app")


@API_APP.batch(API_KIND)
async def own(item: Item) -> None:
    return None


@WORKER_APP.batch(DEPLOYED_KIND, retry_limit=0)
async def deployed(item: Item) -> dict[str, Any]:
    return {"ref": item.ref}


@pytest.fixture
async def other_worker(db_url: str) -> AsyncIterator[None]:
    """WORKER_APP's worker on a client of its own, started (its kinds stored)."""
    db = await Database(db_url, max_size=4).open()
    boss = Shoal(db)
    started = asyncio.Event()

    async def on_start(_: Shoal) -> None:
        started.set()

    WORKER_APP.start_hooks.append(on_start)
    stop = asyncio.Event()
    run = asyncio.create_task(WORKER_APP.run(boss, stop=stop))
    try:
        await asyncio.wait_for(started.wait(), timeout=30)
        yield
    finally:
        WORKER_APP.start_hooks.remove(on_start)
        stop.set()
        await run
        await boss.close()


@pytest.fixture
async def client(boss: Shoal) -> AsyncIterator[httpx.AsyncClient]:
    api = create_api(boss, API_APP.batches(boss), token=None)
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        yield c


async def test_a_kind_a_worker_stored_is_created_by_an_api_that_never_imported_it(
    other_worker: None, client: httpx.AsyncClient
) -> None:
    response = await client.post("/v1/tasks", json={"kind": DEPLOYED_KIND, "items": ["a", "b"]})
    assert response.status_code == 202, response.text
    task_id = response.json()["task_id"]

    # Its items run on the worker of the kind, from the settings it stored.
    async def closed() -> bool:
        view = (await client.get(f"/v1/tasks/{task_id}")).json()
        return bool(view["status"] == "completed")

    await wait_for(closed)
    view = (await client.get(f"/v1/tasks/{task_id}")).json()
    assert view["kind"] == DEPLOYED_KIND and view["queue"] == f"batch.{DEPLOYED_KIND}"
    assert view["outcome"] == "completed" and view["progress"]["completed"] == 2
    # The API's own kind is still its own.
    own_task = await client.post("/v1/tasks", json={"kind": API_KIND, "items": ["x"]})
    assert own_task.status_code == 202, own_task.text


async def test_a_kind_neither_imported_nor_stored_is_422_naming_both(
    other_worker: None, client: httpx.AsyncClient
) -> None:
    response = await client.post("/v1/tasks", json={"kind": "nosuch", "items": ["a"]})
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["field"] == "kind"
    assert body["message"] == (
        f"kind: unknown batch kind 'nosuch'; known: {API_KIND}, {DEPLOYED_KIND}"
    )
    tasks = (await client.get("/v1/tasks")).json()["tasks"]
    assert tasks == []
