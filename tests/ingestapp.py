"""The ingest app the process tests run as ``shoal worker --app tests.ingestapp:app``.

One consumer of ``card.ingest`` (30 slots, the reference's) applying readings
with the shared idempotent apply, and the ``card.collection`` batch sink. The
transport comes from the environment (SHOAL_INGEST_TRANSPORT, SHOAL_NATS_URL).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from shoal import App, Shoal
from shoal.db.pool import Database
from shoal.ingest.message import Message
from tests.ingest_helpers import (
    COLLECTION,
    READINGS,
    Reading,
    apply_reading_in,
    create_schema,
    write_collection,
)

ACK_WAIT = timedelta(seconds=3)

app = App()
app.ingest_settings.monitor_interval = timedelta(seconds=1)
_db: list[Database] = []


@app.on_start
async def prepare(boss: Shoal) -> None:
    _db.append(boss.db)
    await create_schema(boss.db)


@app.consumer(READINGS, concurrency=30, ack_wait=ACK_WAIT, poll=timedelta(milliseconds=200))
async def apply(message: Message[Reading]) -> None:
    await _db[0].run(lambda conn: apply_reading_in(conn, message))


@app.sink(COLLECTION, batch_size=200, ack_wait=ACK_WAIT, poll=timedelta(milliseconds=200))
async def write(messages: list[Message[Any]]) -> None:
    await write_collection(_db[0], messages)
