"""The embedded server and the command line, as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg

from shoal.db import EmbeddedPostgres
from shoal.db.migrate import load_migrations

ROOT = Path(__file__).parent.parent


def shoal_cli(
    *args: str, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shoal.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        cwd=ROOT,
        timeout=timeout,
    )


def test_embedded_server_starts_on_demand_is_reused_and_stops(pg_dir: Path) -> None:
    first = EmbeddedPostgres(pg_dir / "pg", fsync=False)
    url = first.start()
    assert first.started_here
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    second = EmbeddedPostgres(pg_dir / "pg")
    assert second.start() == url  # reused, not started twice
    assert not second.started_here
    with psycopg.connect(url):
        # A client connected throughout: no grace can make it look gone.
        assert not first.stop_if_unused(grace_s=0.2), "stopped under a connected client"
    assert first.stop_if_unused()
    assert not first.is_running()
    restarted = EmbeddedPostgres(pg_dir / "pg", fsync=False)
    restarted.start()  # the same data directory comes back
    restarted.stop()


def test_cli_without_database_url_uses_the_embedded_server(pg_dir: Path) -> None:
    env = {"SHOAL_DATA_DIR": str(pg_dir / "data"), "DATABASE_URL": ""}
    result = shoal_cli("migrate", env=env)
    assert result.returncode == 0, result.stderr
    every = [m.version for m in load_migrations()]
    assert f"applied {every}" in result.stderr
    again = shoal_cli("migrate", env=env)
    assert "up to date" in again.stderr
    assert not EmbeddedPostgres(pg_dir / "data").is_running(), "left the server running"


def test_status_prints_queue_depths(db_url: str) -> None:
    import asyncio

    from shoal import Shoal

    async def seed() -> None:
        boss = await Shoal.connect(db_url)
        await boss.insert([{"queue": "reports"}] * 3)
        await boss.pause_queue("reports")
        await boss.close()

    asyncio.run(seed())
    result = shoal_cli("status", env={"DATABASE_URL": db_url})
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if "reports" in line)
    assert "paused" in line and " 3 " in line


def test_worker_rejects_an_app_that_is_not_an_app(db_url: str) -> None:
    result = shoal_cli("worker", "--app", "shoal.demo:DEMO_KIND", env={"DATABASE_URL": db_url})
    assert result.returncode != 0
    assert "is not a shoal.App" in result.stderr


def test_demo_runs_end_to_end(db_url: str) -> None:
    from .conftest import free_port

    result = shoal_cli(
        "demo",
        "--items",
        "60",
        "--port",
        str(free_port()),
        env={"DATABASE_URL": db_url},
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    assert "items completed" in result.stdout
    assert "completed_with_errors" in result.stdout or "/ completed" in result.stdout
