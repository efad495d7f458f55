"""The console and the tasks page served under a path prefix, in a real Chromium.

Two ways a user puts the API under a prefix: ``app.mount("/ops", create_api(...))``
in a FastAPI app of their own, and a proxy (an ingress) that strips ``/ops``
before the request reaches a server started with ``root_path="/ops"``. Either
way every view of both pages, the links between them, the token prompt and a
write must reach the API under the prefix: no request may answer 404.

Same set-up as tests/test_dashboard.py (real uvicorn servers, Debian's chromium).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request, Response

from shoal import Shoal
from shoal.api import create_api
from shoal.batch.kinds import BatchKind
from shoal.batch.service import Batches

from .conftest import wait_for
from .test_dashboard import UI_TIMEOUT_MS, _TestServer, browser, serving

__all__ = ["browser"]

TOKEN = "mount-token"
PREFIX = "/ops"
IDLE = "mount.idle"  # no worker runs it: its task stays open until cancelled
NAV = ("#/overview", "#/queues", "#/jobs", "#/schedules", "#/topics", "#/workers")


async def _never(item: Any) -> None:  # pragma: no cover - no worker runs the idle kind
    raise AssertionError("the idle kind has no worker")


def _api(boss: Shoal) -> FastAPI:
    return create_api(
        boss, Batches(boss, {IDLE: BatchKind(name=IDLE, handler=_never)}), token=TOKEN
    )


@contextlib.asynccontextmanager
async def _behind_root_path(api: FastAPI) -> AsyncIterator[str]:
    """``api`` served with ``root_path=PREFIX`` behind a proxy that strips PREFIX
    (as an ingress does); yields the proxy's address."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = _TestServer(
        uvicorn.Config(
            api, lifespan="off", log_level="warning", ws="none", http="h11", root_path=PREFIX
        )
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    proxy = FastAPI()
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as upstream:

        @proxy.api_route(PREFIX + "/{path:path}", methods=["GET", "POST", "DELETE"])
        async def forward(path: str, request: Request) -> Response:
            # The Host and Origin the browser sent go on, as a proxy that keeps them.
            headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
            answer = await upstream.request(
                request.method,
                "/" + path,
                params=request.query_params,
                headers=headers,
                content=await request.body(),
            )
            kept = {
                k: v
                for k, v in answer.headers.items()
                if k.lower() not in ("content-length", "content-encoding", "transfer-encoding")
            }
            return Response(answer.content, status_code=answer.status_code, headers=kept)

        try:
            await wait_for(lambda: server.started, timeout_s=10)
            async with serving(proxy) as base:
                yield base
        finally:
            server.should_exit = True
            await task
            sock.close()


async def _click_through(browser: Any, base: str, client: httpx.AsyncClient) -> None:
    """Every view of both pages, reached by their own links, under ``base + PREFIX``."""
    from playwright.async_api import expect

    task = await client.post(f"{PREFIX}/v1/tasks", json={"kind": IDLE, "items": ["a", "b"]})
    assert task.status_code == 202, task.text
    task_id = task.json()["task_id"]
    # Where the task is, under the prefix.
    assert task.headers["Location"] == f"{PREFIX}/v1/tasks/{task_id}"
    assert (await client.get(task.headers["Location"])).status_code == 200
    # A redirect (a trailing slash dropped) stays under the prefix.
    slash = await client.get(f"{PREFIX}/tasks/", follow_redirects=True)
    assert (slash.status_code, str(slash.url)) == (200, f"{base}{PREFIX}/tasks")

    page = await browser.new_page()
    failures: list[str] = []
    page.on(
        "response",
        lambda r: failures.append(f"{r.status} {r.url}") if r.status in (404, 405) else None,
    )
    page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
    try:
        await page.goto(base + PREFIX + "/")
        await expect(page.locator("#auth")).to_be_visible(timeout=UI_TIMEOUT_MS)
        await page.fill("#token", TOKEN)
        await page.click("#auth button[type=submit]")
        await expect(page.locator('[data-tile="open tasks"] b')).to_have_text(
            "1", timeout=UI_TIMEOUT_MS
        )
        for href in NAV:
            await page.click(f'nav a[href="{href}"]')
            await expect(page.locator("#view")).to_have_attribute(
                "data-view", href[2:], timeout=UI_TIMEOUT_MS
            )
            await expect(page.locator("#status")).to_contain_text("updated", timeout=UI_TIMEOUT_MS)
        # The overview's tile and the nav both lead to the tasks page under the prefix.
        await page.click('nav a[href="#/overview"]')
        await page.click('[data-tile="open tasks"]')
        await page.wait_for_url(base + PREFIX + "/tasks", timeout=UI_TIMEOUT_MS)
        card = page.locator(f'section.task[data-task-id="{task_id}"]')
        await expect(card.locator(".badge")).to_have_text("processing", timeout=UI_TIMEOUT_MS)
        # A write from the tasks page (confirmed in its dialog).
        await card.get_by_role("button", name="Cancel").click()
        await expect(card.locator('[data-count="cancelled"]')).to_have_text(
            "2 cancelled", timeout=UI_TIMEOUT_MS
        )
        # The tasks page's nav leads back to each console view under the prefix.
        for href in NAV:
            await page.click(f'nav a[href="{PREFIX}/{href}"]')
            await expect(page.locator("#view")).to_have_attribute(
                "data-view", href[2:], timeout=UI_TIMEOUT_MS
            )
            assert page.url == base + PREFIX + "/" + href
            await page.click(f'nav a[href="{PREFIX}/tasks"]')
            await expect(card).to_be_visible(timeout=UI_TIMEOUT_MS)
        assert failures == []
    finally:
        await page.close()


@pytest.fixture
async def mounted(boss: Shoal) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    outer = FastAPI()
    outer.mount(PREFIX, _api(boss))
    async with (
        serving(outer) as base,
        httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}) as client,
    ):
        yield base, client


async def test_console_and_tasks_page_work_mounted_under_a_prefix(
    browser: Any, mounted: tuple[str, httpx.AsyncClient], boss: Shoal
) -> None:
    base, client = mounted
    await boss.send("mount.mail", {"to": "a@example.com"})
    # The prefix without its slash is sent to the console's page.
    bare = await client.get(PREFIX, follow_redirects=True)
    assert bare.status_code == 200 and str(bare.url) == base + PREFIX + "/"
    await _click_through(browser, base, client)


async def test_console_works_behind_a_proxy_that_strips_the_prefix(
    browser: Any, boss: Shoal
) -> None:
    async with (
        _behind_root_path(_api(boss)) as base,
        httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}) as client,
    ):
        await _click_through(browser, base, client)
