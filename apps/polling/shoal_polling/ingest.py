"""The ingest side: the observation consumer and the collection-record sink.

Both paths of decision D11 go through :class:`PollingIngest`: the poller's
``Pipeline.submit`` applies in place (sync) or publishes (async), and the
consumer of :data:`~shoal_polling.domain.OBSERVATIONS` runs the very same
:meth:`PollingIngest.apply`. After the apply commits, the success record is
published to :data:`~shoal_polling.domain.COLLECTION` (D7); when that publish
fails it is written at once (D11: "nsqd unavailable: write synchronously").
A crash between the commit and the publish leaves the message without its
done-marker, so it is delivered again: the replay changes nothing and
publishes the record, which the unique index keeps single.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from shoal import Database, Message, Pipeline, PublishError
from shoal_polling.apply import Applied, apply_observation, write_collection_records
from shoal_polling.domain import COLLECTION, AsyncConn, CollectionRecord, Observation

log = logging.getLogger("shoal_polling.ingest")

DEFAULT_PLAN_INTERVAL = timedelta(minutes=30)
# D1/D12: the consumer's fixed concurrency, and one collection writer.
INGEST_CONCURRENCY = 30
COLLECTION_WRITERS = 1


@dataclass(slots=True)
class IngestCounts:
    applied: int = 0
    records_written_directly: int = 0


class PollingIngest:
    def __init__(
        self,
        db: Database,
        pipeline: Pipeline,
        *,
        plan_interval: timedelta = DEFAULT_PLAN_INTERVAL,
        apply_cost: timedelta = timedelta(0),
    ) -> None:
        self.db = db
        self.pipeline = pipeline
        self.plan_interval = plan_interval
        # The experiment's stand-in for a production database's heavier write
        # (bigger tables, triggers, contention): server time added to each apply.
        self.apply_cost_s = apply_cost.total_seconds()
        self.counts = IngestCounts()

    async def apply(self, message: Message[Observation]) -> None:
        """The shared apply (sync path, async consumer): the domain write, then its record."""
        observation = message.body

        async def run(conn: AsyncConn) -> Applied:
            if self.apply_cost_s > 0:
                await conn.execute("SELECT pg_sleep(%s)", (self.apply_cost_s,))
            return await apply_observation(conn, observation, plan_interval=self.plan_interval)

        await self.db.run(run)
        self.counts.applied += 1
        await self.record(CollectionRecord.of(observation))

    async def record(self, record: CollectionRecord) -> None:
        """Publish a collection record; write it directly when the publish fails."""
        try:
            await self.pipeline.publish(COLLECTION, record, id=f"{record.observation_id}:record")
        except PublishError as exc:
            log.warning(
                "collection record %s: publish failed (%s); writing it directly",
                record.observation_id,
                exc,
            )
            await self.write([record])
            self.counts.records_written_directly += 1

    async def write(self, records: list[CollectionRecord]) -> None:
        async def run(conn: AsyncConn) -> int:
            return await write_collection_records(conn, records)

        await self.db.run(run)

    async def write_batch(self, messages: list[Message[CollectionRecord]]) -> None:
        """The sink of the collection topic: one multi-row insert per batch."""
        await self.write([m.body for m in messages])
