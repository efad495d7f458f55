"""The workbench as an app for shoal's own commands, configured from the environment.

    shoal worker --app shoal_extract.app:app   # runs extraction items and the flow's runs
    shoal api --app shoal_extract.app:app      # /v1, dashboard, workbench at /extraction

The llm extractor is configured by ``SHOAL_LLM_BASE_URL``, ``SHOAL_LLM_MODEL``
and ``SHOAL_LLM_API_KEY`` (apps/extraction/README.md); without them only ``rules``
runs. ``SHOAL_EXTRACT_MAX_PAGES`` and ``SHOAL_EXTRACT_MAX_OCR_PAGES`` bound one document.
``SHOAL_API_TOKEN_NAME`` names the token's holder in the reviews they store.
A run of the flow (workflow ``extraction``) writes its export to
``$SHOAL_EXTRACT_DIR/exports``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from shoal import Shoal
from shoal_extract.api import mount_workbench
from shoal_extract.cli import TOKEN_NAME_ENV, data_dir, llm_settings, parse_limits
from shoal_extract.worker import ExtractionApp, WorkerSettings

_NO_FLAGS = argparse.Namespace(
    llm_base_url=None, llm_model=None, llm_timeout=None, max_pages=None, max_ocr_pages=None
)

extraction = ExtractionApp(
    WorkerSettings(
        llm=llm_settings(_NO_FLAGS, os.environ),
        limits=parse_limits(_NO_FLAGS, os.environ),
        export_dir=data_dir(os.environ) / "exports",
    )
)
app = extraction.app


@app.on_api
async def mount(api: Any, boss: Shoal, token: str | None) -> None:
    await extraction.attach(boss)
    assert extraction.workbench is not None  # attach() opens it, with the flow's runs
    mount_workbench(
        api,
        extraction.workbench,
        token=token,
        token_name=os.environ.get(TOKEN_NAME_ENV) or None,
    )
