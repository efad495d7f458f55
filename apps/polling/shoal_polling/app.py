"""The ingest side, run by ``shoal worker --app shoal_polling.app:app``.

- the consumer of ``polling.observation``: 30 slots (D1), applying with the
  same :meth:`PollingIngest.apply` the sync path runs (D2);
- the batch sink of ``polling.collection``: flush at 200 or after 1 s, one
  writer, 500 in flight (D7);
- shoal's runner adds the backlog monitor with its pause flag (D10), the
  start-up connection budget check (D12) and, on nats, the durability check;
- the mode switch is ``polling.ingest.mode`` (D11);
- the workflow ``polling.card_action``: an operator's action on a card, the
  gateway's delayed confirmation awaited durably (``actions.py``).

The transport is the environment's (``SHOAL_INGEST_TRANSPORT=postgres|nats``,
``SHOAL_NATS_URL``), the same one the poller publishes on. Settings for the
tests and the experiment: ``SHOAL_POLLING_ACK_WAIT_S``,
``SHOAL_POLLING_MONITOR_INTERVAL_S``, ``SHOAL_POLLING_CONCURRENCY`` and
``SHOAL_POLLING_APPLY_COST_MS`` (server time added to each apply).
"""

from __future__ import annotations

import os
from datetime import timedelta

from shoal import App, Message, Shoal, SystemClock
from shoal_polling.actions import CARD_ACTION, card_action
from shoal_polling.domain import COLLECTION, MODE_KEY, OBSERVATIONS, CollectionRecord, Observation
from shoal_polling.ingest import (
    COLLECTION_WRITERS,
    INGEST_CONCURRENCY,
    INGEST_RETRY_LIMIT,
    PollingIngest,
)
from shoal_polling.schema import ensure_schema

# The lease of a delivery (how soon a message held by a killed worker is
# delivered again), on either transport: it is the consumer's and the sink's.
ACK_WAIT = timedelta(seconds=float(os.environ.get("SHOAL_POLLING_ACK_WAIT_S", "300")))
CONCURRENCY = int(os.environ.get("SHOAL_POLLING_CONCURRENCY", str(INGEST_CONCURRENCY)))
APPLY_COST = timedelta(milliseconds=float(os.environ.get("SHOAL_POLLING_APPLY_COST_MS", "0")))


app = App()
app.ingest_settings.mode_key = MODE_KEY
app.ingest_settings.monitor_interval = timedelta(
    seconds=float(os.environ.get("SHOAL_POLLING_MONITOR_INTERVAL_S", "60"))
)
app.workflow(CARD_ACTION)(card_action)
# Set by the start hook, before any consumer runs; read by the consumer and the sink.
_ingest: list[PollingIngest] = []


@app.on_start
async def prepare(boss: Shoal) -> None:
    await ensure_schema(boss.db, today=SystemClock().now().date())
    # The consumer publishes collection records on the worker's own pipeline.
    _ingest.append(
        PollingIngest(boss.db, app.pipeline, apply_cost=APPLY_COST, retry_limit=INGEST_RETRY_LIMIT)
    )


@app.consumer(
    OBSERVATIONS, concurrency=CONCURRENCY, ack_wait=ACK_WAIT, retry_limit=INGEST_RETRY_LIMIT
)
async def apply(message: Message[Observation]) -> None:
    await _ingest[0].apply(message)


@app.sink(
    COLLECTION,
    batch_size=200,
    max_wait=timedelta(seconds=1),
    writers=COLLECTION_WRITERS,
    max_in_flight=500,
    ack_wait=ACK_WAIT,
)
async def write(messages: list[Message[CollectionRecord]]) -> None:
    await _ingest[0].write_batch(messages)
