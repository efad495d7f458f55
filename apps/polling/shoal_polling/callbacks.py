"""The app's receiver of the gateway's callbacks: ``shoal-polling callbacks --port 8950``.

A confirmation the gateway posts to ``/v1/confirmations`` becomes the event
``confirm:<request>`` (``Workflows.signal``), which resumes the run of
``polling.card_action`` waiting for it at once; one that comes before the run
waits is kept for it.
"""

from __future__ import annotations

from typing import Any

from fastapi import Body, FastAPI
from fastapi.responses import JSONResponse

from shoal import InvalidInput
from shoal.workflow import Workflows
from shoal_polling.actions import confirmation_key

CONFIRMATIONS_PATH = "/v1/confirmations"


def build_callback_app(workflows: Workflows) -> FastAPI:
    api = FastAPI(title="shoal-polling callbacks", docs_url=None, redoc_url=None)

    @api.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"ok": True}

    @api.post(CONFIRMATIONS_PATH)
    async def confirmation(body: dict[str, Any] = Body(...)) -> Any:  # noqa: B008
        request = body.get("request")
        if not isinstance(request, str) or not request:
            return JSONResponse({"error": "request: a confirmation names its request"}, 422)
        try:
            event = await workflows.signal(confirmation_key(request), body)
        except InvalidInput as exc:
            return JSONResponse({"error": str(exc)}, 422)
        return JSONResponse({"event": event}, 202)

    return api
