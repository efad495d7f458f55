"""The polling domain's tables, in a schema of their own, created idempotently at start.

Every process that touches the domain (poller, ingest workers, the CLI) calls
:func:`ensure_schema`; the DDL runs in one transaction holding a transaction
advisory lock, so processes starting together all succeed (the later ones
wait, then find everything in place).

``collection_record`` is partitioned by ``observed_at`` (monthly, plus a
default partition so a record outside the prepared months is never refused);
its unique index ``(observation_id, observed_at)`` includes the partition key,
as Postgres requires, and is what makes a replayed batch harmless (D5, D7).
"""

from __future__ import annotations

from datetime import date

from psycopg import sql

from shoal import Database
from shoal_polling.domain import AsyncConn

SCHEMA = "shoal_polling"
# Monthly partitions prepared around the current month; older or newer
# records land in the default partition.
PARTITION_MONTHS_BACK = 2
PARTITION_MONTHS_AHEAD = 12

DDL = """
CREATE TABLE IF NOT EXISTS shoal_polling.account (
    id text PRIMARY KEY,
    real_name_enabled boolean NOT NULL DEFAULT true
);
-- Until when the gateway told a poller to leave the account alone (a 429's
-- Retry-After): no poller claims its steps before then.
ALTER TABLE shoal_polling.account ADD COLUMN IF NOT EXISTS held_until timestamptz;
CREATE TABLE IF NOT EXISTS shoal_polling.plan (
    id text PRIMARY KEY,
    quota_kb bigint NOT NULL CHECK (quota_kb > 0),
    reset_day int NOT NULL CHECK (reset_day BETWEEN 1 AND 28)
);
CREATE TABLE IF NOT EXISTS shoal_polling.card (
    id text PRIMARY KEY,
    account_id text NOT NULL REFERENCES shoal_polling.account (id),
    plan_id text NOT NULL REFERENCES shoal_polling.plan (id),
    polling_enabled boolean NOT NULL DEFAULT true,
    stopped_reason text,
    service_state text NOT NULL DEFAULT 'active'
        CHECK (service_state IN ('active', 'stopped_by_threshold')),
    network_status text,
    last_card_status_check_at timestamptz,
    real_name_status text,
    last_real_name_check_at timestamptz,
    last_traffic_at timestamptz,
    -- Written by the traffic apply: the plan step may skip until then (D8).
    flow_evaluated_until timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CHECK (polling_enabled OR stopped_reason IS NOT NULL)
);
CREATE INDEX IF NOT EXISTS card_account ON shoal_polling.card (account_id);
-- One row per card and day: the day's maximum of the month-to-date reading.
CREATE TABLE IF NOT EXISTS shoal_polling.traffic_snapshot (
    card_id text NOT NULL REFERENCES shoal_polling.card (id),
    day date NOT NULL,
    used_kb bigint NOT NULL CHECK (used_kb >= 0),
    observed_at timestamptz NOT NULL,
    PRIMARY KEY (card_id, day)
);
-- Usage of one plan period: the increment applied is max_used_kb - settled_kb,
-- after which settled_kb = max_used_kb, so a replay adds 0.
CREATE TABLE IF NOT EXISTS shoal_polling.monthly_usage (
    card_id text NOT NULL REFERENCES shoal_polling.card (id),
    period_start date NOT NULL,
    max_used_kb bigint NOT NULL CHECK (max_used_kb >= 0),
    settled_kb bigint NOT NULL CHECK (settled_kb >= 0 AND settled_kb <= max_used_kb),
    PRIMARY KEY (card_id, period_start)
);
CREATE TABLE IF NOT EXISTS shoal_polling.channel_threshold (
    account_id text PRIMARY KEY REFERENCES shoal_polling.account (id),
    stop_percent int NOT NULL CHECK (stop_percent BETWEEN 1 AND 1000)
);
CREATE TABLE IF NOT EXISTS shoal_polling.outbox (
    event_id text PRIMARY KEY,
    card_id text NOT NULL,
    kind text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS shoal_polling.audit_log (
    id bigserial PRIMARY KEY,
    card_id text NOT NULL,
    observation_id text,
    action text NOT NULL,
    detail jsonb NOT NULL DEFAULT '{}',
    at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS shoal_polling.priority_item (
    id bigserial PRIMARY KEY,
    card_id text NOT NULL REFERENCES shoal_polling.card (id),
    step text NOT NULL,
    state text NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'done')),
    created_at timestamptz NOT NULL DEFAULT now(),
    done_at timestamptz,
    observation_id text,
    CHECK ((state = 'done') = (done_at IS NOT NULL))
);
CREATE INDEX IF NOT EXISTS priority_item_active
    ON shoal_polling.priority_item (card_id, step) WHERE state = 'active';
-- Which observations took effect (the reconciliation's ledger of applied state).
CREATE TABLE IF NOT EXISTS shoal_polling.applied_observation (
    observation_id text PRIMARY KEY,
    card_id text NOT NULL,
    kind text NOT NULL,
    observed_at timestamptz NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
-- The poller's schedule: when each card's step is next due.
CREATE TABLE IF NOT EXISTS shoal_polling.due (
    card_id text NOT NULL REFERENCES shoal_polling.card (id),
    step text NOT NULL CHECK (step IN ('traffic', 'card_status', 'real_name', 'plan')),
    due_at timestamptz NOT NULL,
    failures int NOT NULL DEFAULT 0,
    PRIMARY KEY (card_id, step)
);
CREATE INDEX IF NOT EXISTS due_at ON shoal_polling.due (due_at);
-- Set while a poller holds the step (its lease), NULL once its result is
-- written: the in-flight polls every poller counts against the account's limit.
ALTER TABLE shoal_polling.due ADD COLUMN IF NOT EXISTS leased_until timestamptz;
CREATE INDEX IF NOT EXISTS due_in_flight ON shoal_polling.due (card_id)
    WHERE leased_until IS NOT NULL;
CREATE TABLE IF NOT EXISTS shoal_polling.collection_record (
    observation_id text NOT NULL,
    observed_at timestamptz NOT NULL,
    card_id text NOT NULL,
    kind text NOT NULL,
    ok boolean NOT NULL,
    value jsonb,
    error text,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    CHECK (ok = (error IS NULL))
) PARTITION BY RANGE (observed_at);
CREATE UNIQUE INDEX IF NOT EXISTS collection_record_observation
    ON shoal_polling.collection_record (observation_id, observed_at);
CREATE TABLE IF NOT EXISTS shoal_polling.collection_record_default
    PARTITION OF shoal_polling.collection_record DEFAULT;
"""


def _month(start: date, offset: int) -> date:
    index = start.year * 12 + start.month - 1 + offset
    return date(index // 12, index % 12 + 1, 1)


async def ensure_schema(db: Database, *, today: date) -> None:
    """Create what is missing of the domain's schema; safe from many processes at once."""
    this_month = date(today.year, today.month, 1)

    async def run(conn: AsyncConn) -> None:
        # The lock first: CREATE SCHEMA IF NOT EXISTS itself races.
        await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('shoal_polling', 0))")
        await conn.execute("CREATE SCHEMA IF NOT EXISTS shoal_polling")
        await conn.execute(DDL)
        cur = await conn.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_class p ON p.oid = i.inhparent JOIN pg_namespace n ON n.oid = p.relnamespace "
            "WHERE n.nspname = 'shoal_polling' AND p.relname = 'collection_record'"
        )
        existing = {row[0] for row in await cur.fetchall()}
        for offset in range(-PARTITION_MONTHS_BACK, PARTITION_MONTHS_AHEAD + 1):
            start = _month(this_month, offset)
            name = f"collection_record_{start.year:04d}_{start.month:02d}"
            if name in existing:
                continue
            await conn.execute(
                sql.SQL(
                    "CREATE TABLE {} PARTITION OF shoal_polling.collection_record "
                    "FOR VALUES FROM ({}) TO ({})"
                ).format(
                    sql.Identifier(SCHEMA, name),
                    sql.Literal(start.isoformat()),
                    sql.Literal(_month(start, 1).isoformat()),
                )
            )

    await db.run(run)
