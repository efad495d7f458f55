"""A small observation domain for the ingest tests: idempotent sinks, as a user writes them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shoal.db.pool import AsyncConn, Database
from shoal.ingest.guard import newer_than_applied
from shoal.ingest.message import Message, Topic

SCHEMA = """
CREATE TABLE IF NOT EXISTS card (
    id int PRIMARY KEY,
    status text,
    status_observed_at timestamptz,
    total bigint NOT NULL DEFAULT 0
);
-- Which messages took effect: the idempotency key of `total`.
CREATE TABLE IF NOT EXISTS applied (message_id text PRIMARY KEY, card_id int NOT NULL);
-- Every call of apply, including replays that changed nothing.
CREATE TABLE IF NOT EXISTS apply_call (message_id text NOT NULL);
CREATE TABLE IF NOT EXISTS collection (
    observation_id text NOT NULL,
    observed_at timestamptz NOT NULL,
    value int NOT NULL CHECK (value >= 0),
    UNIQUE (observation_id, observed_at)
);
"""


@dataclass(frozen=True)
class Reading:
    card_id: int
    amount: int
    status: str | None = None
    observed_at: str | None = None  # ISO

    @classmethod
    def from_json(cls, doc: Any) -> Reading:
        return cls(**doc)

    def to_json(self) -> dict[str, Any]:
        return {
            "card_id": self.card_id,
            "amount": self.amount,
            "status": self.status,
            "observed_at": self.observed_at,
        }


READINGS = Topic("card.ingest", decode=Reading.from_json, encode=Reading.to_json)
COLLECTION: Topic[Any] = Topic("card.collection")


async def create_schema(db: Database, cards: int = 100) -> None:
    async def run(conn: AsyncConn) -> None:
        await conn.execute(SCHEMA)
        await conn.execute(
            "INSERT INTO card (id) SELECT g FROM generate_series(0, %s) g ON CONFLICT DO NOTHING",
            (cards,),
        )

    await db.run(run)


async def apply_reading_in(conn: AsyncConn, message: Message[Reading]) -> None:
    """The shared apply function (sync and async paths): idempotent by message id."""
    reading = message.body
    await conn.execute("INSERT INTO apply_call VALUES (%s)", (message.id,))
    cur = await conn.execute(
        "INSERT INTO applied VALUES (%s, %s) ON CONFLICT DO NOTHING RETURNING 1",
        (message.id, reading.card_id),
    )
    if await cur.fetchone() is not None:
        await conn.execute(
            "UPDATE card SET total = total + %s WHERE id = %s", (reading.amount, reading.card_id)
        )
    if reading.status is not None and reading.observed_at is not None:
        observed = datetime.fromisoformat(reading.observed_at)
        if await newer_than_applied(
            conn,
            table="card",
            key_column="id",
            key=reading.card_id,
            applied_column="status_observed_at",
            observed_at=observed,
        ):
            await conn.execute(
                "UPDATE card SET status = %s, status_observed_at = %s WHERE id = %s",
                (reading.status, observed, reading.card_id),
            )


def apply_reading(db: Database) -> Any:
    async def apply(message: Message[Reading]) -> None:
        await db.run(lambda conn: apply_reading_in(conn, message))

    return apply


async def write_collection(db: Database, messages: list[Message[Any]]) -> None:
    """One multi-row INSERT ... ON CONFLICT DO NOTHING for a batch."""
    rows = [(m.body["observation_id"], m.body["observed_at"], m.body["value"]) for m in messages]

    async def run(conn: AsyncConn) -> None:
        async with conn.cursor() as cur:
            await cur.execute(
                "INSERT INTO collection (observation_id, observed_at, value) "
                "SELECT * FROM unnest(%s::text[], %s::timestamptz[], %s::int[]) "
                "ON CONFLICT DO NOTHING",
                ([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]),
            )

    await db.run(run)


async def scalar(db: Database, query: str, params: tuple[Any, ...] = ()) -> Any:
    async def run(conn: AsyncConn) -> Any:
        cur = await conn.execute(query, params)
        row = await cur.fetchone()
        return None if row is None else row[0]

    return await db.run(run, transaction=False)
