"""Reconciling while polling goes on: observations served after the cut may still be on
their way, so they are checked for being doubled, never for being missing."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

from shoal_polling.reconcile import Snapshot, compare

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
CARD = "898600000000001"


def traffic(n: int, used_kb: int, at: datetime) -> dict[str, Any]:
    return {
        "observation_id": f"s1-{CARD}-traffic-{n}",
        "card_id": CARD,
        "kind": "traffic",
        "observed_at": at.isoformat(),
        "used_kb": used_kb,
    }


def snapshot(records: dict[str, int], settled_kb: int) -> Snapshot:
    period = date(2026, 12, 1)
    return {
        "records": list(records.items()),
        "failed": [(0,)],
        "applied": [(i,) for i in records],
        "reset": [(CARD, 1)],
        "usage": [(CARD, period, settled_kb)],
        "increments": [(CARD, period, settled_kb)],
    }


def test_the_newest_observations_are_not_missed_but_still_checked_for_doubles() -> None:
    old, new = traffic(1, 100, T0), traffic(2, 250, T0 + timedelta(minutes=5))
    cut = T0 + timedelta(minutes=4)
    # The newest reading is not applied yet: missing without a cut, on its way with one.
    data = snapshot({old["observation_id"]: 1}, settled_kb=100)
    assert not compare(data, [old, new]).clean
    report = compare(data, [old, new], settled_before=cut)
    assert report.clean and report.unsettled == 1
    assert "1 too recent to be missed" in report.lines()[0]
    # Applied already (usage at its reading): fine too.
    both = snapshot({old["observation_id"]: 1, new["observation_id"]: 1}, settled_kb=250)
    assert compare(both, [old, new], settled_before=cut).clean
    # Recorded twice, or usage past every reading served: doubled, cut or no cut.
    twice = snapshot({old["observation_id"]: 1, new["observation_id"]: 2}, settled_kb=250)
    assert compare(twice, [old, new], settled_before=cut).doubled_records == [new["observation_id"]]
    over = snapshot({old["observation_id"]: 1}, settled_kb=300)
    assert compare(over, [old, new], settled_before=cut).usage_doubled
    # Usage below a reading served before the cut: lost.
    short = snapshot({old["observation_id"]: 1}, settled_kb=50)
    assert compare(short, [old, new], settled_before=cut).usage_short
