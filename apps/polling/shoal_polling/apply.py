"""The shared apply functions: what an observation does to the domain, in one transaction.

The sync path (the poll step, ``polling.ingest.mode = sync``, and every poll
that claimed a priority item) and the async path (the ingest consumer) call
the same :func:`apply_observation` (D2). Each one is idempotent, so a replay
after a commit whose done-marker was lost changes nothing (D5):

- traffic: the day's snapshot keeps the maximum reading; the month's usage is
  settled as "month maximum minus already settled", which a replay makes 0;
- status and real-name: the out-of-order guard (D6) refuses an observation
  not newer than the one applied, and so refuses a replay;
- outbox events have ids derived from the observation: ``ON CONFLICT
  (event_id) DO NOTHING``;
- the collection record's unique index ``(observation_id, observed_at)``.

Every apply ends with ``pg_notify`` on :data:`CARD_CHANNEL`: delivered on
commit, it invalidates the pollers' card caches (D9).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from shoal import InvalidInput, NotFound
from shoal.ingest import newer_than_applied
from shoal_polling.domain import (
    AsyncConn,
    CollectionRecord,
    Observation,
    should_stop_polling_for_risk,
)

log = logging.getLogger("shoal_polling.apply")

CARD_CHANNEL = "shoal_polling_card"
# A new priority item is announced here on commit (JSON: id, card_id, step), so
# pollers add it to their priority set at once instead of at their next re-read.
PRIORITY_CHANNEL = "shoal_polling_priority"


@dataclass(frozen=True, slots=True)
class Applied:
    """What one apply did (a replay or an out-of-order observation did nothing)."""

    changed: bool
    settled_kb: int = 0
    stopped_by_threshold: bool = False
    polling_stopped: bool = False


def period_start(day: date, reset_day: int) -> date:
    """The first day of the plan period holding ``day``, for a quota reset on ``reset_day``."""
    if day.day >= reset_day:
        return date(day.year, day.month, reset_day)
    index = day.year * 12 + day.month - 2
    return date(index // 12, index % 12 + 1, reset_day)


async def _event(
    conn: AsyncConn, event_id: str, card_id: str, kind: str, payload: dict[str, Any]
) -> None:
    await conn.execute(
        "INSERT INTO shoal_polling.outbox (event_id, card_id, kind, payload) "
        "VALUES (%s, %s, %s, %s) ON CONFLICT (event_id) DO NOTHING",
        (event_id, card_id, kind, json.dumps(payload)),
    )


async def _audit(
    conn: AsyncConn, card_id: str, observation_id: str | None, action: str, detail: dict[str, Any]
) -> None:
    await conn.execute(
        "INSERT INTO shoal_polling.audit_log (card_id, observation_id, action, detail) "
        "VALUES (%s, %s, %s, %s)",
        (card_id, observation_id, action, json.dumps(detail)),
    )


async def apply_observation(
    conn: AsyncConn, observation: Observation, *, plan_interval: timedelta
) -> Applied:
    """Apply one observation inside the caller's transaction. Idempotent.

    Raises :class:`~shoal.NotFound` (a business error: acknowledged, not
    retried) when the card does not exist.
    """
    if observation.kind == "traffic":
        applied = await _apply_traffic(conn, observation, plan_interval=plan_interval)
    else:
        applied = await _apply_status(conn, observation)
    await conn.execute(
        "INSERT INTO shoal_polling.applied_observation (observation_id, card_id, kind, observed_at)"
        " VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
        (
            observation.observation_id,
            observation.card_id,
            observation.kind,
            observation.observed_at,
        ),
    )
    if observation.priority_item_id is not None:
        await conn.execute(
            "UPDATE shoal_polling.priority_item SET state = 'done', done_at = now(),"
            " observation_id = %s WHERE id = %s AND state = 'active'",
            (observation.observation_id, observation.priority_item_id),
        )
    await conn.execute("SELECT pg_notify(%s, %s)", (CARD_CHANNEL, observation.card_id))
    return applied


async def apply_confirmed_status(conn: AsyncConn, observation: Observation) -> Applied:
    """A network status the gateway confirmed for an operator's action (``actions.py``).

    The status apply of a poll's answer (the out-of-order guard, D6; the
    outbox event and the audit row of a change; the cache notify), without
    the applied-observation ledger: that ledger lists what the gateway
    served to polls, which ``reconcile`` compares with its served log.
    """
    if observation.kind != "card_status" or observation.status is None:
        raise InvalidInput(
            "observation", f"a confirmed status is a card_status with a status, got {observation}"
        )
    applied = await _apply_status(conn, observation)
    await conn.execute("SELECT pg_notify(%s, %s)", (CARD_CHANNEL, observation.card_id))
    return applied


async def _apply_traffic(
    conn: AsyncConn, observation: Observation, *, plan_interval: timedelta
) -> Applied:
    if observation.used_kb is None or observation.used_kb < 0:
        raise InvalidInput("used_kb", f"traffic observation {observation.observation_id} has none")
    card_id = observation.card_id
    cur = await conn.execute(
        "SELECT c.account_id, c.service_state, p.quota_kb, p.reset_day"
        " FROM shoal_polling.card c JOIN shoal_polling.plan p ON p.id = c.plan_id"
        " WHERE c.id = %s FOR UPDATE OF c",
        (card_id,),
    )
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"card {card_id!r} does not exist")
    account_id, service_state, quota_kb, reset_day = row
    observed = observation.observed_at
    day = observed.date()
    period = period_start(day, reset_day)
    await conn.execute(
        "INSERT INTO shoal_polling.traffic_snapshot AS s (card_id, day, used_kb, observed_at)"
        " VALUES (%s, %s, %s, %s) ON CONFLICT (card_id, day) DO UPDATE SET"
        " used_kb = GREATEST(s.used_kb, EXCLUDED.used_kb),"
        " observed_at = CASE WHEN EXCLUDED.used_kb > s.used_kb"
        "   THEN EXCLUDED.observed_at ELSE s.observed_at END",
        (card_id, day, observation.used_kb, observed),
    )
    cur = await conn.execute(
        "INSERT INTO shoal_polling.monthly_usage AS u"
        " (card_id, period_start, max_used_kb, settled_kb) VALUES (%s, %s, %s, 0)"
        " ON CONFLICT (card_id, period_start) DO UPDATE SET"
        " max_used_kb = GREATEST(u.max_used_kb, EXCLUDED.max_used_kb)"
        " RETURNING max_used_kb, settled_kb",
        (card_id, period, observation.used_kb),
    )
    usage = await cur.fetchone()
    assert usage is not None
    month_max, settled = usage
    increment = month_max - settled  # 0 for a replay or an older reading
    if increment > 0:
        await conn.execute(
            "UPDATE shoal_polling.monthly_usage SET settled_kb = max_used_kb"
            " WHERE card_id = %s AND period_start = %s",
            (card_id, period),
        )
        detail = {"period": period.isoformat(), "increment_kb": increment, "used_kb": month_max}
        await _event(conn, f"usage:{observation.observation_id}", card_id, "usage.settled", detail)
        await _audit(conn, card_id, observation.observation_id, "usage_settled", detail)
    stopped = False
    if service_state == "active":
        cur = await conn.execute(
            "SELECT stop_percent FROM shoal_polling.channel_threshold WHERE account_id = %s",
            (account_id,),
        )
        threshold = await cur.fetchone()
        if threshold is not None and month_max * 100 >= quota_kb * threshold[0]:
            await conn.execute(
                "UPDATE shoal_polling.card SET service_state = 'stopped_by_threshold'"
                " WHERE id = %s AND service_state = 'active'",
                (card_id,),
            )
            detail = {"period": period.isoformat(), "used_kb": month_max, "quota_kb": quota_kb}
            await _event(
                conn, f"threshold_stop:{card_id}:{period.isoformat()}", card_id, "card.stop", detail
            )
            await _audit(conn, card_id, observation.observation_id, "threshold_stop", detail)
            stopped = True
    await conn.execute(
        "UPDATE shoal_polling.card SET"
        " last_traffic_at = GREATEST(last_traffic_at, %(observed)s),"
        " flow_evaluated_until = GREATEST(flow_evaluated_until, %(until)s),"
        " updated_at = now() WHERE id = %(card)s",
        {"observed": observed, "until": observed + plan_interval, "card": card_id},
    )
    return Applied(
        changed=increment > 0 or stopped, settled_kb=increment, stopped_by_threshold=stopped
    )


# The column holding the observed time of the applied status, per kind.
_APPLIED_COLUMN = {
    "card_status": "last_card_status_check_at",
    "real_name": "last_real_name_check_at",
}


async def _apply_status(conn: AsyncConn, observation: Observation) -> Applied:
    applied_column = _APPLIED_COLUMN[observation.kind]
    card_id = observation.card_id
    if not await newer_than_applied(
        conn,
        table="shoal_polling.card",
        key_column="id",
        key=card_id,
        applied_column=applied_column,
        observed_at=observation.observed_at,
        what=f"{observation.kind} observation {observation.observation_id}",
    ):
        return Applied(changed=False)
    # The guard holds the card's row lock from here to commit.
    if observation.kind == "card_status":
        cur = await conn.execute(
            "SELECT network_status FROM shoal_polling.card WHERE id = %s", (card_id,)
        )
    else:
        cur = await conn.execute(
            "SELECT real_name_status FROM shoal_polling.card WHERE id = %s", (card_id,)
        )
    row = await cur.fetchone()
    previous = None if row is None else row[0]
    stop = should_stop_polling_for_risk(observation.kind, observation.status)
    if observation.kind == "card_status":
        await conn.execute(
            "UPDATE shoal_polling.card SET network_status = %(status)s,"
            " last_card_status_check_at = %(observed)s,"
            " polling_enabled = polling_enabled AND NOT %(stop)s,"
            " stopped_reason = CASE WHEN %(stop)s AND polling_enabled"
            "   THEN 'risk:' || %(status)s ELSE stopped_reason END,"
            " updated_at = now() WHERE id = %(card)s",
            {
                "status": observation.status,
                "observed": observation.observed_at,
                "stop": stop,
                "card": card_id,
            },
        )
    else:
        await conn.execute(
            "UPDATE shoal_polling.card SET real_name_status = %s, last_real_name_check_at = %s,"
            " updated_at = now() WHERE id = %s",
            (observation.status, observation.observed_at, card_id),
        )
    changed = previous != observation.status
    if changed:
        detail = {"from": previous, "to": observation.status}
        kind = f"{observation.kind}.changed"
        await _event(
            conn, f"{observation.kind}:{observation.observation_id}", card_id, kind, detail
        )
        await _audit(conn, card_id, observation.observation_id, kind, detail)
    if stop:
        await _audit(
            conn,
            card_id,
            observation.observation_id,
            "polling_stopped",
            {"status": observation.status},
        )
    return Applied(changed=changed, polling_stopped=stop)


async def write_collection_records(conn: AsyncConn, records: Sequence[CollectionRecord]) -> int:
    """One multi-row ``INSERT ... ON CONFLICT DO NOTHING``; how many rows were new."""
    if not records:
        return 0
    cur = await conn.execute(
        "INSERT INTO shoal_polling.collection_record"
        " (observation_id, observed_at, card_id, kind, ok, value, error)"
        " SELECT * FROM unnest(%s::text[], %s::timestamptz[], %s::text[], %s::text[],"
        " %s::boolean[], %s::jsonb[], %s::text[])"
        " ON CONFLICT (observation_id, observed_at) DO NOTHING",
        (
            [r.observation_id for r in records],
            [r.observed_at for r in records],
            [r.card_id for r in records],
            [r.kind for r in records],
            [r.ok for r in records],
            [None if r.value is None else json.dumps(r.value) for r in records],
            [r.error for r in records],
        ),
    )
    return cur.rowcount


async def evaluate_plan(conn: AsyncConn, card_id: str, *, now: datetime) -> Applied:
    """The plan step when the traffic apply has not evaluated the card recently.

    Re-checks the channel threshold against the settled usage of the current
    period (a threshold lowered since the last reading takes effect here).
    """
    cur = await conn.execute(
        "SELECT c.account_id, c.service_state, p.quota_kb, p.reset_day, t.stop_percent"
        " FROM shoal_polling.card c JOIN shoal_polling.plan p ON p.id = c.plan_id"
        " LEFT JOIN shoal_polling.channel_threshold t ON t.account_id = c.account_id"
        " WHERE c.id = %s FOR UPDATE OF c",
        (card_id,),
    )
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"card {card_id!r} does not exist")
    _, service_state, quota_kb, reset_day, stop_percent = row
    period = period_start(now.date(), reset_day)
    cur = await conn.execute(
        "SELECT settled_kb FROM shoal_polling.monthly_usage"
        " WHERE card_id = %s AND period_start = %s",
        (card_id, period),
    )
    usage = await cur.fetchone()
    settled = 0 if usage is None else usage[0]
    if service_state != "active" or stop_percent is None or settled * 100 < quota_kb * stop_percent:
        return Applied(changed=False)
    await conn.execute(
        "UPDATE shoal_polling.card SET service_state = 'stopped_by_threshold' WHERE id = %s",
        (card_id,),
    )
    detail = {"period": period.isoformat(), "used_kb": settled, "quota_kb": quota_kb}
    await _event(
        conn, f"threshold_stop:{card_id}:{period.isoformat()}", card_id, "card.stop", detail
    )
    await _audit(conn, card_id, None, "threshold_stop", detail)
    await conn.execute("SELECT pg_notify(%s, %s)", (CARD_CHANNEL, card_id))
    return Applied(changed=True, stopped_by_threshold=True)
