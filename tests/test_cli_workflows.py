"""``shoal workflows`` and ``shoal signal``: workflow runs from the command line (issue 39).

The commands call the same ``Workflows`` methods as ``/v1/workflows``; only
``start`` needs the app (``--app tests.wfopsapp:app``).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import httpx
import pytest

from shoal import Shoal
from shoal.workflow import RunStatus, RunView, Workflows
from tests.cli_helpers import shoal
from tests.cli_helpers import with_boss as run_with_boss

from . import wfopsapp
from .conftest import wait_for
from .test_api_logs import environment
from .test_observe_processes import free_port
from .test_processes import REPO

APP = "tests.wfopsapp:app"


def with_workers(db_url: str, body: Callable[[Workflows], Awaitable[Any]]) -> Any:
    """``body(workflows)`` with the app's workflows run by workers in the same loop."""

    async def run(boss: Shoal) -> Any:
        workflows = wfopsapp.app.workflows(boss)
        for name in workflows.specs:
            workflows.work(name)
        try:
            return await body(workflows)
        finally:
            await boss.stop_workers(timedelta(seconds=5))

    return run_with_boss(db_url, run, max_size=4, listen=True)


def settle(run_id: str, *statuses: RunStatus) -> Callable[[Workflows], Awaitable[RunView]]:
    want = set(statuses) or {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED}

    async def body(workflows: Workflows) -> RunView:
        async def done() -> bool:
            return (await workflows.get(run_id)).status in want

        await wait_for(done)
        return await workflows.get(run_id)

    return body


@pytest.fixture(autouse=True)
def broken_reserve() -> None:
    wfopsapp.broken["reserve"] = True


def test_start_show_retry_a_run_that_failed_at_its_second_step(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert shoal(db_url, "workflows", "start", "ops.order", '{"sku": "K-9"}', "--id", "o-9",
                 "--app", APP) == 0  # fmt: skip
    assert capsys.readouterr().out.strip() == "o-9"
    assert with_workers(db_url, settle("o-9")).status is RunStatus.FAILED

    assert shoal(db_url, "workflows", "show", "o-9") == 0
    shown = capsys.readouterr().out
    assert "run o-9" in shown and "workflow ops.order" in shown and "failed" in shown
    assert "check stock: completed" in shown
    assert "reserve: failed" in shown
    assert "inventory service refused K-9" in shown  # the step's error, traceback and all

    assert shoal(db_url, "workflows", "show", "o-9", "--json") == 0
    run = json.loads(capsys.readouterr().out)
    assert [s["status"] for s in run["steps"]] == ["completed", "failed"]

    wfopsapp.broken["reserve"] = False
    assert shoal(db_url, "workflows", "retry", "o-9") == 0
    view = with_workers(db_url, settle("o-9"))
    assert view.status is RunStatus.COMPLETED
    assert view.result == {"stock": 3, "reservation": "reserved K-9"}
    capsys.readouterr()
    assert shoal(db_url, "workflows", "retry", "o-9") == 2
    assert "only a failed or cancelled run" in capsys.readouterr().err


def test_list_filters_and_pages_and_cancel_ends_a_run(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async def three_naps(workflows: Workflows) -> None:
        for n in range(3):
            await workflows.start("ops.nap", id=f"nap-{n}")
        for n in range(3):
            await settle(f"nap-{n}", RunStatus.SLEEPING)(workflows)

    with_workers(db_url, three_naps)
    assert shoal(db_url, "workflows", "list", "--limit", "2", "--json") == 0
    page = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in page["runs"]] == ["nap-2", "nap-1"]
    assert shoal(db_url, "workflows", "list", "--json", "--before", page["next_cursor"]) == 0
    assert [r["id"] for r in json.loads(capsys.readouterr().out)["runs"]] == ["nap-0"]

    assert shoal(db_url, "workflows", "cancel", "nap-1") == 0
    assert shoal(db_url, "workflows", "list", "--status", "cancelled") == 0
    listed = capsys.readouterr().out
    assert "nap-1" in listed and "nap-2" not in listed
    assert shoal(db_url, "workflows", "cancel", "nap-1") == 2
    assert "finished already" in capsys.readouterr().err


def test_signal_resumes_the_run_waiting_for_its_key(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async def waiting(workflows: Workflows) -> None:
        await workflows.start("ops.approval", {"doc": 4}, id="ap-4")
        await settle("ap-4", RunStatus.WAITING)(workflows)

    with_workers(db_url, waiting)
    assert shoal(db_url, "signal", "approve:4", '{"ok": true}') == 0
    view = with_workers(db_url, settle("ap-4"))
    assert view.status is RunStatus.COMPLETED and view.result == {"ok": True}


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["workflows", "show", "no-such-run"], "no workflow run 'no-such-run'"),
        (["workflows", "cancel", "no-such-run"], "no workflow run 'no-such-run'"),
        (["workflows", "start", "ops.order", "{bad", "--app", APP], "INPUT_JSON:"),
        (["workflows", "start", "ops.order"], "--app:"),
        (["workflows", "start", "ops.nope", "--app", APP], "name:"),
        (["signal", "k", "{bad"], "PAYLOAD_JSON:"),
        (["workflows", "list", "--before", "zzz"], "--before:"),
    ],
)
def test_bad_input_exits_2_naming_what_was_wrong(
    db_url: str, capsys: pytest.CaptureFixture[str], argv: list[str], named: str
) -> None:
    assert shoal(db_url, *argv) == 2
    assert named in capsys.readouterr().err


async def test_shoal_api_with_an_app_starts_that_apps_workflows(db_url: str) -> None:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "shoal.cli", "--database-url", db_url],
        *["api", "--app", APP, "--port", str(port)],
        env=environment(),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:

            async def up() -> bool:
                assert proc.returncode is None, "shoal api exited early"
                try:
                    return (await c.get("/healthz")).status_code == 200
                except httpx.TransportError:
                    return False

            await wait_for(up, timeout_s=30, interval_s=0.1)
            declared = (await c.get("/v1/workflows")).json()["workflows"]
            started = await c.post("/v1/workflows/runs", json={"name": "ops.nap", "id": "via-api"})
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(proc.communicate(), timeout=20)
    assert proc.returncode == 0, output.decode(errors="replace")
    assert declared == ["ops.approval", "ops.flaky", "ops.nap", "ops.order", "ops.parent"]
    assert started.status_code == 201, started.text
