"""The shared apply functions: replays change nothing, older observations change nothing,
and the channel threshold stops a card past its quota."""

from __future__ import annotations

import asyncio
from datetime import UTC, date, datetime, timedelta
from typing import Any

from shoal import Shoal, SystemClock
from shoal_polling.apply import (
    apply_observation,
    evaluate_plan,
    period_start,
    write_collection_records,
)
from shoal_polling.domain import CollectionRecord, Observation
from shoal_polling.fleet import card_id
from shoal_polling.schema import ensure_schema

CARD = card_id(0, 0)
T0 = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
PLAN_INTERVAL = timedelta(minutes=30)


def traffic(n: int, used_kb: int, at: datetime) -> Observation:
    return Observation(f"t{n}", CARD, "acct000", "traffic", at, used_kb=used_kb)


def status(n: int, value: str, at: datetime, kind: Any = "card_status") -> Observation:
    return Observation(f"s{n}", CARD, "acct000", kind, at, status=value)


async def apply(boss: Shoal, observation: Observation) -> Any:
    return await boss.db.run(
        lambda conn: apply_observation(conn, observation, plan_interval=PLAN_INTERVAL)
    )


async def rows(boss: Shoal, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    async def run(conn: Any) -> list[tuple[Any, ...]]:
        cur = await conn.execute(query, params)
        return list(await cur.fetchall()) if cur.description else []

    return await boss.db.run(run, transaction=False)


async def state(boss: Shoal) -> dict[str, Any]:
    """Everything an apply may write, to compare before and after a replay."""
    return {
        "snapshots": await rows(boss, "SELECT * FROM shoal_polling.traffic_snapshot ORDER BY 1, 2"),
        "usage": await rows(boss, "SELECT * FROM shoal_polling.monthly_usage ORDER BY 1, 2"),
        "outbox": await rows(boss, "SELECT event_id, payload FROM shoal_polling.outbox ORDER BY 1"),
        "audit": await rows(boss, "SELECT count(*) FROM shoal_polling.audit_log"),
        "card": await rows(
            boss,
            "SELECT service_state, network_status, last_card_status_check_at, real_name_status,"
            " last_real_name_check_at, polling_enabled FROM shoal_polling.card WHERE id = %s",
            (CARD,),
        ),
    }


def test_period_start_follows_the_reset_day() -> None:
    assert period_start(date(2026, 11, 30), 1) == date(2026, 11, 1)
    assert period_start(date(2026, 11, 3), 15) == date(2026, 10, 15)
    assert period_start(date(2026, 1, 3), 15) == date(2025, 12, 15)


async def test_a_replayed_traffic_observation_adds_nothing(polling: Shoal) -> None:
    first = await apply(polling, traffic(1, 1000, T0))
    assert first.settled_kb == 1000
    before = await state(polling)
    replay = await apply(polling, traffic(1, 1000, T0))
    assert replay.settled_kb == 0 and not replay.changed
    assert await state(polling) == before


async def test_the_month_usage_is_the_month_maximum_minus_what_was_settled(
    polling: Shoal,
) -> None:
    await apply(polling, traffic(1, 1000, T0))
    await apply(polling, traffic(2, 2500, T0 + timedelta(hours=1)))
    # An older, smaller reading delivered late: the day keeps its maximum, nothing is settled.
    late = await apply(polling, traffic(3, 1800, T0 + timedelta(minutes=30)))
    assert late.settled_kb == 0
    usage = await rows(polling, "SELECT max_used_kb, settled_kb FROM shoal_polling.monthly_usage")
    assert usage == [(2500, 2500)]
    snapshot = await rows(polling, "SELECT day, used_kb FROM shoal_polling.traffic_snapshot")
    assert snapshot == [(T0.date(), 2500)]
    increments = await rows(
        polling,
        "SELECT sum((payload->>'increment_kb')::int) FROM shoal_polling.outbox"
        " WHERE kind = 'usage.settled'",
    )
    assert increments == [(2500,)]
    # The next day (Dec 1) opens a new period: its own snapshot and its own settlement.
    await apply(polling, traffic(4, 300, T0 + timedelta(days=1)))
    assert await rows(polling, "SELECT count(*) FROM shoal_polling.traffic_snapshot") == [(2,)]
    assert await rows(
        polling, "SELECT period_start, settled_kb FROM shoal_polling.monthly_usage ORDER BY 1"
    ) == [(date(2026, 11, 1), 2500), (date(2026, 12, 1), 300)]


async def test_an_out_of_order_status_observation_leaves_the_newest(polling: Shoal) -> None:
    await apply(polling, status(1, "suspended", T0 + timedelta(minutes=5)))
    older = await apply(polling, status(2, "active", T0))
    assert not older.changed
    card = (await state(polling))["card"][0]
    assert card[1] == "suspended" and card[2] == T0 + timedelta(minutes=5)
    await apply(polling, status(3, "unverified", T0 + timedelta(minutes=5), "real_name"))
    await apply(polling, status(4, "verified", T0, "real_name"))
    card = (await state(polling))["card"][0]
    assert card[3] == "unverified" and card[4] == T0 + timedelta(minutes=5)
    # A replay of the newest is refused by the same guard: nothing more is written.
    before = await state(polling)
    await apply(polling, status(1, "suspended", T0 + timedelta(minutes=5)))
    assert await state(polling) == before


async def test_a_risk_answer_stops_polling_the_card(polling: Shoal) -> None:
    result = await apply(polling, status(1, "risk_blocked", T0))
    assert result.polling_stopped
    assert await rows(
        polling,
        "SELECT polling_enabled, stopped_reason FROM shoal_polling.card WHERE id = %s",
        (CARD,),
    ) == [(False, "risk:risk_blocked")]


async def test_the_channel_threshold_stops_a_card_past_its_quota_once(polling: Shoal) -> None:
    await apply(polling, traffic(1, 9_000, T0))
    assert (await state(polling))["card"][0][0] == "active"
    over = await apply(polling, traffic(2, 10_001, T0 + timedelta(minutes=1)))
    assert over.stopped_by_threshold
    await apply(polling, traffic(3, 12_000, T0 + timedelta(minutes=2)))
    assert (await state(polling))["card"][0][0] == "stopped_by_threshold"
    stops = await rows(
        polling, "SELECT count(*) FROM shoal_polling.outbox WHERE kind = 'card.stop'"
    )
    assert stops == [(1,)]


async def test_the_plan_step_stops_a_card_when_a_threshold_was_lowered(polling: Shoal) -> None:
    now = SystemClock().now()
    await apply(polling, Observation("t1", CARD, "acct000", "traffic", now, used_kb=6_000))
    assert not (await polling.db.run(lambda c: evaluate_plan(c, CARD, now=now))).changed
    await rows(polling, "UPDATE shoal_polling.channel_threshold SET stop_percent = 50")
    assert (await polling.db.run(lambda c: evaluate_plan(c, CARD, now=now))).stopped_by_threshold


async def test_collection_records_are_kept_once_per_observation(polling: Shoal) -> None:
    records = [
        CollectionRecord(
            f"o{i}", T0 + timedelta(days=40 * i), CARD, "traffic", True, {"used_kb": i}
        )
        for i in range(3)
    ] + [CollectionRecord("f1", T0, CARD, "card_status", False, error="gateway 503")]
    assert await polling.db.run(lambda c: write_collection_records(c, records)) == 4
    assert await polling.db.run(lambda c: write_collection_records(c, records)) == 0
    partitions = await rows(
        polling,
        "SELECT count(DISTINCT tableoid) FROM shoal_polling.collection_record",
    )
    assert partitions == [(3,)]  # routed by observed_at into monthly partitions


async def test_two_processes_creating_the_schema_at_once_both_succeed(boss: Shoal) -> None:
    today = SystemClock().now().date()
    await asyncio.gather(ensure_schema(boss.db, today=today), ensure_schema(boss.db, today=today))
    partitions_query = (
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = 'shoal_polling.collection_record'::regclass ORDER BY 1"
    )
    partitions = [name for (name,) in await rows(boss, partitions_query)]
    # One partition per month from two back to twelve ahead, and the default.
    months = [divmod(today.year * 12 + today.month - 1 + k, 12) for k in range(-2, 13)]
    assert partitions == sorted(
        [f"collection_record_{y:04d}_{m + 1:02d}" for y, m in months]
        + ["collection_record_default"]
    )
    # A record of this month lands in this month's partition, not the default.
    mid_month = datetime(today.year, today.month, 15, 12, tzinfo=UTC)
    record = CollectionRecord("o1", mid_month, CARD, "traffic", True, {"used_kb": 1})
    assert await boss.db.run(lambda c: write_collection_records(c, [record])) == 1
    assert await rows(
        boss, "SELECT tableoid::regclass::text FROM shoal_polling.collection_record"
    ) == [(f"shoal_polling.collection_record_{today.year:04d}_{today.month:02d}",)]

    await ensure_schema(boss.db, today=today)  # a third run finds everything in place
    assert [name for (name,) in await rows(boss, partitions_query)] == partitions
