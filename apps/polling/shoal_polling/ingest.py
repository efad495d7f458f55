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

An apply that fails for good publishes a failure record beside the poll
step's gateway failures (D7): a business error (acknowledged and
dead-lettered by the consumer, raised by a sync submit) or the last attempt
allowed by ``retry_limit``. A retryable failure with attempts left records
nothing: the redelivery (or, from a sync poll, the hand-off to the topic)
may still apply it.

Every log line about an observation names it and its card, in the text and
as the record's ``observation_id`` / ``card_id`` attributes, so an operator
can follow one card through the ingest path.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from shoal import Database, InvalidInput, Message, Pipeline, PublishError
from shoal.ingest import is_retryable
from shoal_polling.apply import Applied, apply_observation, write_collection_records
from shoal_polling.domain import COLLECTION, AsyncConn, CollectionRecord, Observation

log = logging.getLogger("shoal_polling.ingest")

DEFAULT_PLAN_INTERVAL = timedelta(minutes=30)
# D8: the plan step's interval, one run-time setting for the poller (how often
# the plan step is due) and every apply (how long the traffic apply's
# "flow evaluated" marker lasts). Seconds; `shoal-polling poll
# --plan-interval-s` writes it, `shoal config set` too.
PLAN_INTERVAL_KEY = "polling.plan_interval_s"
# D1/D12: the consumer's fixed concurrency, and one collection writer.
INGEST_CONCURRENCY = 30
COLLECTION_WRITERS = 1
# D4: retryable failures are delivered again without limit. The consumer and
# PollingIngest must agree on this, since the apply decides from it when a
# failure is final and gets its failure record.
INGEST_RETRY_LIMIT: int | None = None
# A failure record keeps this much of the error's text.
ERROR_LIMIT = 500


class ObservationLog(logging.LoggerAdapter[logging.Logger]):
    """``log`` with the observation's and card's ids on every record (``extra``)."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs


def observation_log(observation: Observation) -> ObservationLog:
    return ObservationLog(
        log, {"observation_id": observation.observation_id, "card_id": observation.card_id}
    )


@dataclass(slots=True)
class IngestCounts:
    applied: int = 0
    records_written_directly: int = 0
    failures_recorded: int = 0  # applies that failed for good, with their failure record


class PollingIngest:
    def __init__(
        self,
        db: Database,
        pipeline: Pipeline,
        *,
        plan_interval: timedelta | None = None,
        apply_cost: timedelta = timedelta(0),
        retryable: tuple[type[BaseException], ...] = (),
        retry_limit: int | None = INGEST_RETRY_LIMIT,
    ) -> None:
        self.db = db
        self.pipeline = pipeline
        # None: the shared setting (PLAN_INTERVAL_KEY), read through the
        # pipeline's config cache; a value pins it (tests, the experiment).
        self.plan_interval = plan_interval
        # The experiment's stand-in for a production database's heavier write
        # (bigger tables, triggers, contention): server time added to each apply.
        self.apply_cost_s = apply_cost.total_seconds()
        # The consumer's own retry settings, to tell a final failure from one
        # that will be delivered again.
        self.retryable = retryable
        self.retry_limit = retry_limit
        self.counts = IngestCounts()

    async def apply(self, message: Message[Observation]) -> None:
        """The shared apply (sync path, async consumer): the domain write, then its record."""
        observation = message.body
        plan_interval = self.plan_interval
        if plan_interval is None:
            plan_interval = await read_plan_interval(self.pipeline)

        async def run(conn: AsyncConn) -> Applied:
            if self.apply_cost_s > 0:
                await conn.execute("SELECT pg_sleep(%s)", (self.apply_cost_s,))
            return await apply_observation(conn, observation, plan_interval=plan_interval)

        olog = observation_log(observation)
        try:
            applied = await self.db.run(run)
        except Exception as exc:
            final = not is_retryable(exc, self.retryable) or (
                self.retry_limit is not None and message.attempt > self.retry_limit
            )
            olog.warning(
                "observation %s of card %s: apply attempt %d failed (%s: %s)%s",
                observation.observation_id,
                observation.card_id,
                message.attempt,
                type(exc).__name__,
                exc,
                "; final, recording the failure" if final else "",
            )
            if final:
                await self._record_failure(observation, exc)
            raise
        self.counts.applied += 1
        olog.debug(
            "observation %s of card %s applied (changed: %s)",
            observation.observation_id,
            observation.card_id,
            applied.changed,
        )
        await self.record(CollectionRecord.of(observation))

    async def _record_failure(self, observation: Observation, error: BaseException) -> None:
        """The failure record of an apply that failed for good (D7)."""
        record = CollectionRecord(
            f"{observation.observation_id}:apply-failed",
            observation.observed_at,
            observation.card_id,
            observation.kind,
            ok=False,
            error=f"apply: {type(error).__name__}: {error}"[:ERROR_LIMIT],
        )
        try:
            await self.record(record)
        except Exception as exc:  # the apply's own error is the one to raise
            observation_log(observation).error(
                "observation %s of card %s: failure record lost (%s: %s)",
                observation.observation_id,
                observation.card_id,
                type(exc).__name__,
                exc,
            )
            return
        self.counts.failures_recorded += 1

    async def record(self, record: CollectionRecord) -> None:
        """Publish a collection record; write it directly when the publish fails."""
        try:
            await self.pipeline.publish(COLLECTION, record, id=f"{record.observation_id}:record")
        except PublishError as exc:
            log.warning(
                "collection record %s of card %s: publish failed (%s); writing it directly",
                record.observation_id,
                record.card_id,
                exc,
                extra={"observation_id": record.observation_id, "card_id": record.card_id},
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


def _plan_interval(value: object) -> timedelta:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidInput(PLAN_INTERVAL_KEY, f"must be a number of seconds > 0, got {value!r}")
    return timedelta(seconds=value)


async def read_plan_interval(pipeline: Pipeline) -> timedelta:
    """The shared plan interval (5 s cache); the default when unset or unusable."""
    value = await pipeline.config.get(PLAN_INTERVAL_KEY)
    if value is None:
        return DEFAULT_PLAN_INTERVAL
    try:
        return _plan_interval(value)
    except InvalidInput as exc:
        log.warning("%s; using %s", exc, DEFAULT_PLAN_INTERVAL)
        return DEFAULT_PLAN_INTERVAL


async def share_plan_interval(pipeline: Pipeline, given: timedelta | None) -> timedelta:
    """The poller's start: write ``given`` as the shared setting, or read the setting."""
    if given is None:
        return await read_plan_interval(pipeline)
    seconds = given.total_seconds()
    _plan_interval(seconds)
    await pipeline.config.set(PLAN_INTERVAL_KEY, seconds)
    return given
