"""Reconciliation: what the gateway served against what was recorded and applied.

For every observation the gateway answered (its served log):

- a success collection record must exist, exactly one per observation id;
- the observation must be in the applied ledger;
- for traffic, each card's settled usage of a period must equal the largest
  reading the gateway served for it in that period, and the outbox's usage
  increments must add up to it: more would be a reading counted twice, less
  one lost.

Records and applied observations the gateway never served are reported too.
The expected report is empty.

While polling goes on, the newest observations are still on their way
(queued on the topic, in an apply). ``settled_before`` leaves those out of
the "missing" findings: an observation served after it is only checked for
being doubled, and a card's usage may not be below the largest reading
served before it, nor above the largest served at all. Reading the database
before asking the gateway (:func:`load_snapshot`, then :func:`compare`)
keeps observations served in between from showing as "recorded but never
served".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

from shoal import Database
from shoal_polling.apply import period_start
from shoal_polling.domain import AsyncConn

SAMPLE = 10  # ids listed per finding


@dataclass(slots=True)
class Reconciliation:
    served: int = 0
    unsettled: int = 0  # served after settled_before: checked for doubles only
    recorded: int = 0
    failed_records: int = 0
    applied: int = 0
    missing_records: list[str] = field(default_factory=list)
    doubled_records: list[str] = field(default_factory=list)
    missing_applied: list[str] = field(default_factory=list)
    unserved_records: list[str] = field(default_factory=list)
    unserved_applied: list[str] = field(default_factory=list)
    usage_short: list[str] = field(default_factory=list)  # card/period settled below served max
    usage_doubled: list[str] = field(default_factory=list)  # above it, or events adding up above

    @property
    def clean(self) -> bool:
        return not (
            self.missing_records
            or self.doubled_records
            or self.missing_applied
            or self.unserved_records
            or self.unserved_applied
            or self.usage_short
            or self.usage_doubled
        )

    def lines(self) -> list[str]:
        out = [
            f"served by the gateway: {self.served}"
            + (f" ({self.unsettled} too recent to be missed)" if self.unsettled else ""),
            f"collection records: {self.recorded} ok, {self.failed_records} failed polls",
            f"applied observations: {self.applied}",
        ]
        findings = {
            "served but not recorded": self.missing_records,
            "recorded more than once": self.doubled_records,
            "served but not applied": self.missing_applied,
            "recorded but never served": self.unserved_records,
            "applied but never served": self.unserved_applied,
            "usage below the served maximum (lost)": self.usage_short,
            "usage above the served maximum (doubled)": self.usage_doubled,
        }
        for title, ids in findings.items():
            if ids:
                sample = ", ".join(ids[:SAMPLE]) + (" ..." if len(ids) > SAMPLE else "")
                out.append(f"{title}: {len(ids)} ({sample})")
        out.append("nothing missing or doubled" if self.clean else "MISMATCH")
        return out


async def _rows(conn: AsyncConn, query: str) -> list[tuple[Any, ...]]:
    cur = await conn.execute(query)
    return list(await cur.fetchall())


Snapshot = dict[str, list[tuple[Any, ...]]]


async def reconcile(
    db: Database,
    served: Sequence[dict[str, Any]],
    *,
    settled_before: datetime | None = None,
) -> Reconciliation:
    """Compare ``served`` (the gateway's served log) with the database."""
    return compare(await load_snapshot(db), served, settled_before=settled_before)


async def load_snapshot(db: Database) -> Snapshot:
    """What reconciliation reads from the database, in one snapshot."""

    async def load(conn: AsyncConn) -> Snapshot:
        # One snapshot for every read.
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        return {
            "records": await _rows(
                conn,
                "SELECT observation_id, count(*) FROM shoal_polling.collection_record"
                " WHERE ok GROUP BY observation_id",
            ),
            "failed": await _rows(
                conn, "SELECT count(*) FROM shoal_polling.collection_record WHERE NOT ok"
            ),
            "applied": await _rows(
                conn, "SELECT observation_id FROM shoal_polling.applied_observation"
            ),
            "reset": await _rows(
                conn,
                "SELECT c.id, p.reset_day FROM shoal_polling.card c"
                " JOIN shoal_polling.plan p ON p.id = c.plan_id",
            ),
            "usage": await _rows(
                conn, "SELECT card_id, period_start, settled_kb FROM shoal_polling.monthly_usage"
            ),
            "increments": await _rows(
                conn,
                "SELECT card_id, (payload->>'period')::date,"
                " sum((payload->>'increment_kb')::bigint) FROM shoal_polling.outbox"
                " WHERE kind = 'usage.settled' GROUP BY 1, 2",
            ),
        }

    return await db.run(load)


def compare(
    data: Snapshot,
    served: Sequence[dict[str, Any]],
    *,
    settled_before: datetime | None = None,
) -> Reconciliation:
    """The findings of ``served`` against a :func:`load_snapshot` taken before it was read."""

    def observed(s: dict[str, Any]) -> datetime:
        return datetime.fromisoformat(s["observed_at"])

    settled_served = (
        served if settled_before is None else [s for s in served if observed(s) < settled_before]
    )
    report = Reconciliation(served=len(served), unsettled=len(served) - len(settled_served))
    served_ids = {s["observation_id"] for s in served}
    settled_ids = {s["observation_id"] for s in settled_served}
    records = {row[0]: int(row[1]) for row in data["records"]}
    applied = {row[0] for row in data["applied"]}
    report.recorded = len(records)
    report.failed_records = int(data["failed"][0][0])
    report.applied = len(applied)
    report.missing_records = sorted(settled_ids - records.keys())
    report.doubled_records = sorted(i for i, n in records.items() if n > 1)
    report.missing_applied = sorted(settled_ids - applied)
    report.unserved_records = sorted(records.keys() - served_ids)
    report.unserved_applied = sorted(applied - served_ids)

    reset_day = {row[0]: int(row[1]) for row in data["reset"]}
    # Per card and period: the largest reading served before the cut (usage may
    # not be below it) and the largest served at all (usage may not be above it).
    at_least: dict[tuple[str, date], int] = defaultdict(int)
    at_most: dict[tuple[str, date], int] = defaultdict(int)
    for s in served:
        if s["kind"] != "traffic" or s["card_id"] not in reset_day:
            continue
        key = (s["card_id"], period_start(observed(s).date(), reset_day[s["card_id"]]))
        at_most[key] = max(at_most[key], int(s["used_kb"]))
        if s["observation_id"] in settled_ids:
            at_least[key] = max(at_least[key], int(s["used_kb"]))
    settled = {(row[0], row[1]): int(row[2]) for row in data["usage"]}
    increments = {(row[0], row[1]): int(row[2]) for row in data["increments"]}
    for key in sorted(at_most.keys() | settled.keys()):
        name = f"{key[0]}/{key[1].isoformat()}"
        got = settled.get(key, 0)
        if got > at_most.get(key, 0) or increments.get(key, 0) > got:
            report.usage_doubled.append(name)
        elif got < at_least.get(key, 0):
            report.usage_short.append(name)
    return report
