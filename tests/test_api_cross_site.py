"""What a web page on another site makes a browser send is refused, on every route.

The default ``shoal api`` (loopback, no token) took form posts from a foreign
``Origin``: queue pause, job cancel, delete-failed and schedule pause all
changed state. And a page whose name was pointed at 127.0.0.1 (DNS
rebinding) could read every route: its requests say ``Host: evil.example``.

Every write route of the app (listed from the app's own OpenAPI document, so a
new route cannot escape) is sent a simulated cross-site form post against real
targets, and the whole database must be unchanged; every route is sent a
rebinding ``Host``. The same requests the API's own page sends still work,
and a real ``shoal api`` process over a real socket refuses the same.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from fastapi import FastAPI, WebSocket
from psycopg import sql
from rich.console import Console

from shoal import Shoal
from shoal.api import create_api
from shoal.api.auth import READ_METHODS
from shoal.api.cross_site import CrossSiteGuard
from shoal.app import App
from shoal.batch.service import Batches
from shoal.demo import _serve_api, _servers
from shoal.errors import InvalidInput
from shoal.ingest.store import IngestStore
from shoal.queue.states import JobId

from . import wfopsapp
from .conftest import wait_for
from .test_api import KIND, TEST_APP
from .test_console_api import dead_letters, failed_jobs

ROOT = Path(__file__).parent.parent
# What a form on http://evil.example posting to the API makes a browser send.
CROSS_SITE_FORM = {
    "Content-Type": "application/x-www-form-urlencoded",
    "Origin": "http://evil.example",
    "Sec-Fetch-Site": "cross-site",
    "Sec-Fetch-Mode": "navigate",
}
# What the console page sends (same origin: Host and Origin agree).
OWN_PAGE = {"X-Shoal-Request": "1", "Origin": "http://127.0.0.1", "Sec-Fetch-Site": "same-origin"}
REBOUND_HOST = "evil.example:8000"
FORM_BODY = "kind=api.echo&items=a"


def route_list(api: FastAPI) -> list[tuple[str, str]]:
    """(method, path) of every operation the app serves, from its OpenAPI document."""
    return sorted(
        (method.upper(), path)
        for path, operations in api.openapi()["paths"].items()
        for method in operations
    )


def write_routes(api: FastAPI) -> list[tuple[str, str]]:
    return [(m, p) for m, p in route_list(api) if m not in READ_METHODS]


class Targets:
    """Real rows for each write to act on: each write would change one of them."""

    def __init__(
        self,
        task_id: str,
        failed_job: JobId,
        waiting_job: JobId,
        dead_letter: int,
        run_id: str,
    ) -> None:
        self.values = {
            "task_id": task_id,
            "run_id": run_id,  # a pending workflow run: a cancel would end it
            "job_id": str(failed_job),
            "dead_id": str(dead_letter),
            "worker_id": "any-worker",  # read only: refused before it is looked up
            "queue": "email",
            "schedule": "digest",
            "topic": "cards",
        }
        self.waiting_job = str(waiting_job)

    def url(self, method: str, path: str) -> str:
        """``path`` with its parameters filled; fails naming one no target is known for."""
        kind = path.split("/")[2] if path.startswith("/v1/") else ""
        name = {"queues": "queue", "schedules": "schedule", "topics": "topic"}.get(kind, "")

        def fill(match: re.Match[str]) -> str:
            param = match.group(1)
            if param == "name":
                param = name
            if param == "job_id" and path.endswith("/cancel"):
                return self.waiting_job  # only a waiting job can be cancelled
            assert param in self.values, f"no target for {{{match.group(1)}}} in {method} {path}"
            return self.values[param]

        return re.sub(r"\{(\w+)\}", fill, path)


@pytest.fixture
async def targets(boss: Shoal, batches: Batches) -> Targets:
    failed = await failed_jobs(boss, "email", 2)
    waiting = await boss.send("email", {"to": "w@example.com"})
    assert waiting is not None
    await boss.schedule("digest", "0 0 * * *", {"kind": "daily"}, queue="email")
    await dead_letters(boss, "cards", 2)
    letter = (await IngestStore(boss.db).dead_letters("cards"))[0]
    created = await batches.create(KIND, ["a", "b"])
    run = await wfopsapp.app.workflows(boss).start("ops.nap")
    return Targets(created.task_id, failed[0], waiting, letter.id, run.id)


@pytest.fixture
def batches(boss: Shoal) -> Batches:
    return TEST_APP.batches(boss)


@pytest.fixture
def api(boss: Shoal, batches: Batches) -> FastAPI:
    return create_api(boss, batches, token=None, workflows=wfopsapp.app.workflows(boss))


def client_for(api: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://127.0.0.1")


async def fingerprint(db_url: str) -> dict[str, str]:
    """Every table of the database, each as a digest of all its rows."""
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        tables = await conn.execute(
            "SELECT table_schema, table_name FROM information_schema.tables"
            " WHERE table_type = 'BASE TABLE'"
            " AND table_schema NOT IN ('pg_catalog', 'information_schema')"
        )
        found = {}
        for schema, table in await tables.fetchall():
            digest = await conn.execute(
                sql.SQL(
                    "SELECT count(*) || ':' || coalesce(md5(string_agg(t::text, '|'"
                    " ORDER BY t::text)), '') FROM {}.{} t"
                ).format(sql.Identifier(schema), sql.Identifier(table))
            )
            row = await digest.fetchone()
            assert row is not None
            found[f"{schema}.{table}"] = row[0]
        return found


def assert_refused(response: httpx.Response, status: int, field: str) -> None:
    assert response.status_code == status, (response.request.url, response.text)
    body = response.json()
    assert body["field"] == field, body
    assert body["message"].startswith(f"{field}: "), body
    assert response.headers["connection"] == "close"


# -- every route ------------------------------------------------------------------


def test_the_app_has_the_write_routes_the_issue_names(api: FastAPI) -> None:
    writes = write_routes(api)
    for route in [
        ("POST", "/v1/queues/{name}/pause"),
        ("POST", "/v1/jobs/{job_id}/cancel"),
        ("POST", "/v1/queues/{name}/delete-failed"),
        ("POST", "/v1/schedules/{name}/pause"),
        ("POST", "/v1/tasks"),
        ("POST", "/v1/workflows/runs/{run_id}/cancel"),
        ("POST", "/v1/workflows/events"),
    ]:
        assert route in writes
    assert len(writes) >= 14


async def test_a_cross_site_form_post_to_any_write_route_is_refused_and_changes_nothing(
    api: FastAPI, targets: Targets, db_url: str
) -> None:
    before = await fingerprint(db_url)
    async with client_for(api) as c:
        for method, path in write_routes(api):
            url = targets.url(method, path)
            answer = await c.request(method, url, headers=CROSS_SITE_FORM, content=FORM_BODY)
            assert_refused(answer, 403, "sec-fetch-site")
            # A browser that sends no Sec-Fetch-Site still sends the Origin...
            only_origin = {k: v for k, v in CROSS_SITE_FORM.items() if k != "Sec-Fetch-Site"}
            answer = await c.request(method, url, headers=only_origin, content=FORM_BODY)
            assert_refused(answer, 403, "origin")
            # ...and one that sends neither still cannot make a form send JSON.
            bare = {"Content-Type": "application/x-www-form-urlencoded"}
            answer = await c.request(method, url, headers=bare, content=FORM_BODY)
            assert_refused(answer, 403, "content-type")
            answer = await c.request(method, url)  # bodiless, as a no-cors fetch can be
            assert_refused(answer, 403, "content-type")
    assert await fingerprint(db_url) == before


async def test_a_rebinding_host_is_refused_on_every_route(
    api: FastAPI, targets: Targets, db_url: str
) -> None:
    before = await fingerprint(db_url)
    # The routes the OpenAPI document leaves out: the pages and the document itself.
    pages = [("GET", "/"), ("GET", "/tasks"), ("GET", "/docs"), ("GET", "/openapi.json")]
    async with client_for(api) as c:
        for method, path in [*route_list(api), *pages]:
            headers = {**OWN_PAGE, "Host": REBOUND_HOST, "Origin": f"http://{REBOUND_HOST}"}
            answer = await c.request(method, targets.url(method, path), headers=headers)
            assert_refused(answer, 421, "host")
            assert answer.json()["error"] == "misdirected_request"
            assert "--allowed-host" in answer.json()["message"]
    assert await fingerprint(db_url) == before


async def test_the_own_pages_requests_still_change_what_they_should(
    api: FastAPI, targets: Targets, boss: Shoal
) -> None:
    # The bodiless writes the issue names, with only the header a script can set.
    script = {"X-Shoal-Request": "1"}
    async with client_for(api) as c:
        paused = await c.post("/v1/queues/email/pause", headers=script)
        schedule = await c.post("/v1/schedules/digest/pause", headers=script)
        cancelled = await c.post(f"/v1/jobs/{targets.waiting_job}/cancel", headers=script)
        deleted = await c.post("/v1/queues/email/delete-failed", headers=script)
    assert paused.json() == {"queue": "email", "paused": True}
    assert await boss.paused_queues() == ["email"]
    assert schedule.json()["paused"] is True
    assert cancelled.status_code == 200, cancelled.text
    assert deleted.json() == {"queue": "email", "count": 2}
    # And no write route refuses what the page sends.
    async with client_for(api) as c:
        for method, path in write_routes(api):
            answer = await c.request(method, targets.url(method, path), headers=OWN_PAGE)
            assert answer.status_code not in (403, 421), (method, path, answer.text)


async def test_json_writes_and_bearer_clients_need_no_extra_header(
    boss: Shoal, batches: Batches, targets: Targets
) -> None:
    async with client_for(create_api(boss, batches, token=None)) as c:
        created = await c.post("/v1/tasks", json={"kind": KIND, "items": ["x"]})
    assert created.status_code == 202, created.text
    async with client_for(create_api(boss, batches, token="t0k")) as c:
        paused = await c.post("/v1/queues/email/pause", headers={"Authorization": "Bearer t0k"})
    assert paused.json() == {"queue": "email", "paused": True}


async def test_reads_from_the_api_s_own_names_are_served(api: FastAPI, targets: Targets) -> None:
    async with client_for(api) as c:
        for host in ["127.0.0.1:8000", "localhost:8000", "[::1]:8000", "LOCALHOST"]:
            answer = await c.get("/v1/queues", headers={"Host": host})
            assert answer.status_code == 200, (host, answer.text)


async def test_a_same_site_page_on_another_port_cannot_write(api: FastAPI) -> None:
    # http://localhost:3000 (another local app) is same-site with the API.
    headers = {"X-Shoal-Request": "1", "Sec-Fetch-Site": "same-site"}
    async with client_for(api) as c:
        assert_refused(
            await c.post("/v1/queues/email/pause", headers=headers), 403, "sec-fetch-site"
        )
        headers = {"X-Shoal-Request": "1", "Origin": "http://127.0.0.1:3000"}
        assert_refused(await c.post("/v1/queues/email/pause", headers=headers), 403, "origin")
        headers = {"X-Shoal-Request": "1", "Origin": "null"}
        assert_refused(await c.post("/v1/queues/email/pause", headers=headers), 403, "origin")


async def test_configured_names_are_served_and_may_be_the_pages_origin(
    boss: Shoal, batches: Batches, targets: Targets
) -> None:
    api = create_api(boss, batches, token=None, allowed_hosts=["Shoal.Example.com"])
    async with client_for(api) as c:
        read = await c.get("/v1/queues", headers={"Host": "shoal.example.com"})
        # Behind a proxy that rewrites Host, the page's origin is still the name.
        proxied = {"X-Shoal-Request": "1", "Origin": "https://shoal.example.com"}
        write = await c.post("/v1/queues/email/pause", headers=proxied)
        other = await c.get("/v1/queues", headers={"Host": "evil.example"})
    assert read.status_code == 200
    assert write.json() == {"queue": "email", "paused": True}
    assert_refused(other, 421, "host")


@pytest.mark.parametrize(
    "names",
    [["http://shoal.example.com"], ["shoal.example.com:8000"], [""], ["*.example.com"], "a.b"],
)
def test_a_bad_allowed_host_is_refused_naming_the_option(
    boss: Shoal, batches: Batches, names: Any
) -> None:
    with pytest.raises(InvalidInput) as refused:
        create_api(boss, batches, token=None, allowed_hosts=names)
    assert refused.value.field == "allowed_hosts"


async def test_an_applications_own_routes_are_guarded_too(api: FastAPI) -> None:
    calls = []

    @api.post("/mine/act", include_in_schema=False)
    async def act() -> dict[str, bool]:
        calls.append(1)
        return {"done": True}

    async with client_for(api) as c:
        refused = await c.post("/mine/act", headers=CROSS_SITE_FORM, content=FORM_BODY)
        served = await c.post("/mine/act", headers=OWN_PAGE)
    assert_refused(refused, 403, "sec-fetch-site")
    assert served.json() == {"done": True} and calls == [1]


async def test_the_guard_holds_when_the_api_is_mounted_in_another_app(api: FastAPI) -> None:
    outer = FastAPI()
    outer.mount("/shoal", api)
    async with client_for(outer) as c:
        refused = await c.post("/shoal/v1/queues/email/pause", headers=CROSS_SITE_FORM)
        rebound = await c.get("/shoal/v1/queues", headers={"Host": REBOUND_HOST})
        served = await c.get("/shoal/v1/queues")
    assert_refused(refused, 403, "sec-fetch-site")
    assert_refused(rebound, 421, "host")
    assert served.status_code == 200


# -- real servers -------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_shoal_api_refuses_cross_site_writes_and_rebinding_over_a_socket(
    db_url: str, boss: Shoal
) -> None:
    await boss.send("email", {"to": "x@example.com"})
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "shoal.cli", "--database-url", db_url, "api"],
        *["--app", "shoal.demo:app", "--port", str(port), "--allowed-host", "shoal.test"],
        env={k: v for k, v in os.environ.items() if not k.startswith("SHOAL_API_")},
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with httpx.AsyncClient(base_url=base) as c:

            async def up() -> bool:
                assert proc.returncode is None, "shoal api exited early"
                try:
                    return (await c.get("/healthz")).status_code == 200
                except httpx.TransportError:
                    return False

            await wait_for(up, timeout_s=30, interval_s=0.1)
            form = await c.post("/v1/queues/email/pause", headers=CROSS_SITE_FORM, content="")
            bare = await c.post("/v1/queues/email/pause")
            rebound = await c.get("/v1/queues", headers={"Host": f"evil.example:{port}"})
            paused_before = await boss.paused_queues()
            named = await c.get("/v1/queues", headers={"Host": f"shoal.test:{port}"})
            own = {**OWN_PAGE, "Origin": base}
            paused = await c.post("/v1/queues/email/pause", headers=own)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(proc.communicate(), timeout=20)
    assert proc.returncode == 0, output.decode(errors="replace")
    assert_refused(form, 403, "sec-fetch-site")
    assert_refused(bare, 403, "content-type")
    assert_refused(rebound, 421, "host")
    assert paused_before == []
    assert named.status_code == 200
    assert paused.json() == {"queue": "email", "paused": True}


async def test_the_demo_refuses_cross_site_writes_and_rebinding(boss: Shoal) -> None:
    await boss.send("email", {"to": "x@example.com"})
    port = free_port()
    url = await _serve_api(boss, App().batches(boss), port, Console(quiet=True))
    assert url is not None
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
            form = await c.post("/v1/queues/email/pause", headers=CROSS_SITE_FORM, content="")
            rebound = await c.get("/v1/queues", headers={"Host": f"evil.example:{port}"})
    finally:
        for server, task in _servers:
            server.should_exit = True
            await task
        _servers.clear()
    assert_refused(form, 403, "sec-fetch-site")
    assert_refused(rebound, 421, "host")
    assert await boss.paused_queues() == []


async def websocket_handshake(api: FastAPI, origin: str) -> list[dict[str, Any]]:
    """Open ``/mine/ws`` over ASGI as a browser would from ``origin``; what the app sent."""
    scope = {
        "type": "websocket",
        "asgi": {"version": "3.0"},
        "scheme": "ws",
        "path": "/mine/ws",
        "raw_path": b"/mine/ws",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1:8000"), (b"origin", origin.encode())],
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 50000),
        "subprotocols": [],
    }
    incoming: list[MutableMapping[str, Any]] = [
        {"type": "websocket.connect"},
        {"type": "websocket.disconnect", "code": 1000},
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> MutableMapping[str, Any]:
        return incoming.pop(0)

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    await api(scope, receive, send)
    return sent


async def test_a_websocket_from_another_origin_is_refused_before_it_opens(api: FastAPI) -> None:
    @api.websocket("/mine/ws")
    async def hello(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text("hi")
        await websocket.close()

    refused = await websocket_handshake(api, "http://evil.example")
    served = await websocket_handshake(api, "http://127.0.0.1:8000")
    assert [m["type"] for m in refused] == ["websocket.close"]
    assert refused[0]["code"] == 1008
    assert [m["type"] for m in served] == ["websocket.accept", "websocket.send", "websocket.close"]


def test_a_request_without_a_host_header_is_no_rebinding() -> None:
    # HTTP/1.0 allows it; no browser sends one, so no page can be behind it.
    async def never(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        raise AssertionError("judge() never calls the app")

    guard = CrossSiteGuard(never)
    scope: dict[str, Any] = {
        "type": "http",
        "method": "GET",
        "headers": [],
        "server": ("10.0.0.5", 8000),
    }
    assert guard.judge(scope) is None
    scope["headers"] = [(b"host", b"10.0.0.5:8000")]
    assert guard.judge(scope) is None  # the address the connection arrived on
    dual_stack = {**scope, "server": ("::ffff:10.0.0.5", 8000)}
    assert guard.judge(dual_stack) is None  # an API bound to ::, an IPv4 client
    scope["headers"] = [(b"host", b"10.0.0.6:8000")]
    refusal = guard.judge(scope)
    assert refusal is not None and (refusal.status, refusal.field) == (421, "host")
