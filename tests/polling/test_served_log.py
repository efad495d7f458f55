"""A gateway started again on its ``--served-log`` file resumes from it, and reconciles.

The first gateway serves two rounds of polls and stops; a second one, on the
same file, serves two more. The second knows everything the first served
(``GET /v1/served`` and ``reconcile`` cover both), continues each card's
observation ids instead of serving the first ones again, and answers what a
gateway that never stopped would have answered. ``reconcile --served-log``
reads the file with no gateway running at all.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

from shoal import Shoal
from shoal_polling.cli import main
from shoal_polling.domain import Kind
from shoal_polling.gateway import Gateway, GatewaySettings, read_log, read_served_log
from shoal_polling.poller import PollerSettings
from shoal_polling.reconcile import reconcile
from tests.conftest import wait_for
from tests.polling.rig import open_rig, scalar

NOW = timedelta(0)
EVERY_ROUND = PollerSettings(
    traffic_interval=NOW,
    card_status_interval=NOW,
    real_name_interval=NOW,
    plan_interval=timedelta(hours=1),
    failure_backoff=NOW,
)


def values(answer: dict[str, Any]) -> tuple[Any, ...]:
    return (answer["observation_id"], answer.get("used_kb"), answer.get("status"))


async def test_a_restarted_gateway_resumes_from_its_served_log_and_reconciles(
    polling: Shoal, db_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "served.jsonl"
    settings = GatewaySettings(seed=3, latency_ms=0.0, rate_limit=0.0, error_rate=0.2)
    logged = dataclasses.replace(settings, served_log=path)

    first = await open_rig(polling, logged, settings=EVERY_ROUND)
    try:
        for _ in range(2):
            await first.round()
    finally:
        await first.close()
    before = list(first.gateway.served)
    assert before and first.gateway.stats.failed > 0

    second = await open_rig(polling, logged, settings=EVERY_ROUND)
    try:
        assert second.gateway.served == before, "the restarted gateway knows what was served"
        for _ in range(2):
            await second.round()
        served = second.gateway.served
        assert len(served) > len(before)
        ids = [s["observation_id"] for s in served]
        assert len(set(ids)) == len(ids), "no observation id served twice"
        second.start_consumers()
        await wait_for(lambda: _at_least(polling, "collection_record WHERE ok", len(served)), 30)
        await wait_for(lambda: _at_least(polling, "applied_observation", len(served)), 30)
    finally:
        await second.close()

    # Both processes' answers, from the restarted gateway's memory and from the file.
    assert (await reconcile(polling.db, served)).clean
    assert read_served_log(path) == served

    # What a gateway that never stopped answers to the same queries, card by card.
    asked: dict[tuple[str, str, Kind], int] = defaultdict(int)
    for entry in read_log(path):
        asked[(entry["account_id"], entry["card_id"], entry["kind"])] += 1
    unbroken = Gateway(settings)
    for (account, card, kind), times in sorted(asked.items()):
        for _ in range(times):
            await unbroken.query(account, card, kind)
    assert sorted(map(values, unbroken.served)) == sorted(map(values, served))

    # The command, by the file alone, with its findings for a textfile collector.
    prom = tmp_path / "reconcile.prom"
    args = ["--database-url", db_url, "reconcile", "--served-log", str(path)]
    assert await asyncio.to_thread(main, [*args, "--metrics-file", str(prom)]) == 0
    text = prom.read_text()
    assert "shoal_polling_reconcile_clean 1.0" in text
    assert f'shoal_polling_reconcile_observations{{what="served"}} {float(len(served))}' in text
    assert 'shoal_polling_reconcile_findings{finding="missing_applied"} 0.0' in text


async def _at_least(boss: Shoal, table_where: str, n: int) -> bool:
    return int(await scalar(boss, f"SELECT count(*) FROM shoal_polling.{table_where}")) >= n
