"""``shoal api --app shoal_extract.app:app`` serves the workbench beside shoal's own routes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import IO

import httpx

from tests.conftest import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]


def start_api(db_url: str, port: int, log: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shoal.cli",
            "--database-url",
            db_url,
            "api",
            "--app",
            "shoal_extract.app:app",
            "--port",
            str(port),
        ],
        cwd=ROOT,
        env=dict(os.environ),
        stdout=log,
        stderr=subprocess.STDOUT,
    )


async def test_shoal_api_mounts_the_workbench_page_and_routes(db_url: str, tmp_path: Path) -> None:
    port = free_port()
    log = (tmp_path / "api.log").open("wb")
    proc = start_api(db_url, port, log)
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=5) as client:

            async def answering() -> bool:
                try:
                    return (await client.get("/healthz")).status_code == 200
                except httpx.HTTPError:
                    return False

            await wait_for(answering, timeout_s=30)
            page = await client.get("/extraction")
            assert page.status_code == 200 and "<html" in page.text.lower()
            templates = (await client.get("/v1/extraction/templates")).json()
            names = {t["name"] for t in templates} if isinstance(templates, list) else set()
            if not names:  # an envelope such as {"templates": [...]}
                names = {t["name"] for t in next(iter(templates.values()))}
            assert {"clinical_trial", "metadata"} <= names
            assert (await client.get("/")).status_code == 200  # shoal's dashboard still there
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        log.close()
