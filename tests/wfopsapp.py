"""An App with workflows to operate: one that fails at its second step until told
otherwise, one that sleeps, one that waits for an event (``--app tests.wfopsapp:app``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from shoal import App
from shoal.workflow import Workflow

app = App(name="tests.wfopsapp:app")

# Set by a test, read by the step: while True, the "reserve" step fails.
broken = {"reserve": True}


async def check_stock(sku: str) -> int:
    return 3


async def reserve(sku: str) -> str:
    if broken["reserve"]:
        raise RuntimeError(f"inventory service refused {sku}")
    return f"reserved {sku}"


@app.workflow("ops.order")
async def order(wf: Workflow, data: dict[str, Any]) -> dict[str, Any]:
    stock = await wf.step(check_stock, data["sku"], name="check stock")
    reservation = await wf.step(reserve, data["sku"], name="reserve")
    return {"stock": stock, "reservation": reservation}


@app.workflow("ops.nap")
async def nap(wf: Workflow, data: Any) -> str:
    await wf.step(check_stock, "nap", name="before")
    await wf.sleep(timedelta(hours=1))
    return "rested"


@app.workflow("ops.approval")
async def approval(wf: Workflow, data: dict[str, Any]) -> Any:
    return await wf.wait_for(f"approve:{data['doc']}", timeout=timedelta(days=2))


# Set by a test, read by the step: how many more calls of the gateway fail.
gateway_failures = {"left": 0}


async def call_gateway(n: int) -> int:
    if gateway_failures["left"] > 0:
        gateway_failures["left"] -= 1
        raise ConnectionError("gateway reset the connection")
    return 2 * n


@app.workflow("ops.flaky")
async def flaky(wf: Workflow, data: int) -> int:
    return int(await wf.step(call_gateway, data, name="gateway", retry_limit=2))


@app.workflow("ops.parent")
async def parent(wf: Workflow, data: Any) -> Any:
    return await wf.child("ops.nap")
