"""The command line: ``seed``, ``mode`` and ``poll`` against a gateway process."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import psycopg

from shoal_polling.cli import main
from tests.polling.processes import GatewayProcess


def wait_up(url: str) -> None:
    deadline = time.monotonic() + 15
    while True:
        try:
            if httpx.get(f"{url}/healthz").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the gateway did not start"
        time.sleep(0.05)  # noqa: TID251 - polls a gateway process starting up


def test_seed_mode_and_poll_commands_poll_a_fleet_in_sync_mode(db_url: str, tmp_path: Path) -> None:
    gateway = GatewayProcess(tmp_path, "--seed", "4").start()
    try:
        wait_up(gateway.url)
        db = ["--database-url", db_url]
        assert main([*db, "seed", "--accounts", "1", "--cards", "3"]) == 0
        assert main([*db, "mode", "sync"]) == 0
        quick = ["--traffic-interval-s", "0.2", "--card-status-interval-s", "0.2"]
        assert main([*db, "poll", "--gateway", gateway.url, "--duration-s", "1", *quick]) == 0
    finally:
        gateway.stop()
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT count(*), count(DISTINCT card_id) FROM shoal_polling.applied_observation"
        ).fetchone()
    assert row is not None
    applied, cards = row
    assert cards == 3 and applied >= 3 * 3  # every card's three status steps, at least once
