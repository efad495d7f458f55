"""The poller: calls the gateway for each card and step when it is due, and hands the
observation to the ingest path, sync or async (D1, D8, D11).

A round (:meth:`Poller.run_once`) writes back the results of finished polls
(their next due time), then, unless the backlog monitor paused the
observation or the collection topic (D10), claims due ``(card, step)`` rows with ``FOR UPDATE
SKIP LOCKED`` (pushing their due time a lease ahead, so a poller that dies
gives its work back after the lease) and starts one poll for each. Gateway
concurrency is per account (20, as in the reference) across every poller:
the claim takes no more of an account's steps than its limit leaves beside
the ones in flight anywhere (:meth:`Poller._claim`). A poll also holds its
account's semaphore while it calls the gateway and submits. The database's
concurrency is fixed by the ingest consumer, whatever the number of
accounts.

A poll of a status step:

1. priority item for this card and step? then the observation is applied
   synchronously and completes the item in the same transaction (D8);
2. the card from the cache (D9), the gateway call;
3. a failed call publishes a failure collection record (D7) and backs off;
4. a risk answer stops polling the card at once, from the answer alone (D8);
5. ``Pipeline.submit``: applied in place (``sync``) or published (``async``,
   degrading to in place when the publish fails); when neither works for a
   few seconds, kept in the pipeline's spool on disk and replayed later.

A 429 with ``Retry-After`` holds the whole account: in this poller every
call for it waits until the Retry-After has passed (the rate-limited poll
too, which then calls again, up to ``rate_limit_retries`` times), and the
hold is written to the account's row, so that no poller's claim takes its
steps meanwhile. The gateway's limit is per
account, so calling it for the account's other cards would only earn more
429s.

Every count goes to :class:`~shoal_polling.metrics.PollerMetrics` as well as
to :class:`PollerStats`.

A round takes no new work while ``Pipeline.admit`` says no: the backlog
monitor paused the topic (D10), or the spool is full, so that the gateway is
not called for observations that could not be kept.

The plan step skips while the traffic apply's "flow evaluated" marker is
fresh, and evaluates the threshold otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from shoal import Clock, Database, Pipeline, ShoalError, SystemClock
from shoal.ingest import check_connection_budget
from shoal_polling.apply import PRIORITY_CHANNEL, evaluate_plan
from shoal_polling.caches import (
    DEFAULT_ACCOUNT_TTL,
    DEFAULT_CARD_TTL,
    CardInfo,
    CardInvalidator,
    TtlCache,
    load_cards,
    load_real_name_enabled,
)
from shoal_polling.domain import (
    ACCOUNT_CONCURRENCY,
    COLLECTION,
    OBSERVATIONS,
    AsyncConn,
    CollectionRecord,
    Kind,
    Observation,
    Step,
    should_stop_polling_for_risk,
)
from shoal_polling.gateway_client import GatewayAnswer, GatewayClient, GatewayError
from shoal_polling.ingest import PollingIngest
from shoal_polling.metrics import DEAD_LETTER_CAP, PollerMetrics, gateway_error_reason

log = logging.getLogger("shoal_polling.poller")


@dataclass(frozen=True, slots=True)
class PollerSettings:
    account_concurrency: int = ACCOUNT_CONCURRENCY
    traffic_interval: timedelta = timedelta(minutes=5)
    card_status_interval: timedelta = timedelta(minutes=10)
    real_name_interval: timedelta = timedelta(hours=1)
    plan_interval: timedelta = timedelta(minutes=30)
    failure_backoff: timedelta = timedelta(seconds=30)  # doubled per failure, up to the cap
    max_backoff: timedelta = timedelta(minutes=10)
    lease: timedelta = timedelta(minutes=2)
    max_in_flight: int = 2000
    idle_wait: timedelta = timedelta(milliseconds=500)
    priority_refresh: timedelta = timedelta(seconds=30)
    card_ttl: timedelta = DEFAULT_CARD_TTL
    account_ttl: timedelta = DEFAULT_ACCOUNT_TTL
    # A 429: how often one poll calls again after its account's pause, and the
    # longest pause a Retry-After may ask for (the pause is 1 s without one).
    rate_limit_retries: int = 3
    max_account_pause: timedelta = timedelta(minutes=1)
    # How often the dead letters of the polling topics are counted for the metrics.
    dead_letter_interval: timedelta = timedelta(seconds=30)

    def interval(self, step: Step) -> timedelta:
        return {
            "traffic": self.traffic_interval,
            "card_status": self.card_status_interval,
            "real_name": self.real_name_interval,
            "plan": self.plan_interval,
        }[step]


@dataclass(slots=True)
class PollerStats:
    polls: int = 0
    observations: int = 0
    gateway_errors: int = 0
    apply_errors: int = 0  # sync applies that failed (the reference's SQL timeouts)
    handed_off: int = 0  # of those, handed to the topic for a consumer to apply
    degraded: int = 0  # async mode, publish failed: applied in place (D11)
    resubmitted: int = 0  # neither apply nor publish worked at first; tried again
    spooled: int = 0  # neither worked for a while: kept in the pipeline's spool on disk
    priority_applied: int = 0
    risk_stops: int = 0
    plan_skipped: int = 0
    plan_evaluated: int = 0
    paused_rounds: int = 0
    rate_limited: int = 0  # 429 answers
    account_pauses: int = 0  # of those, the ones that held (or held longer) their account
    errors: dict[str, int] = field(default_factory=dict)

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


@dataclass(frozen=True, slots=True)
class _Result:
    card_id: str
    step: Step
    outcome: str  # "ok" | "failed" | "stop"


class Poller:
    def __init__(
        self,
        db: Database,
        pipeline: Pipeline,
        ingest: PollingIngest,
        gateway: GatewayClient,
        *,
        settings: PollerSettings | None = None,
        clock: Clock | None = None,
        metrics: PollerMetrics | None = None,
    ) -> None:
        self.db = db
        self.pipeline = pipeline
        self.ingest = ingest
        self.gateway = gateway
        self.settings = settings or PollerSettings()
        self.clock = clock or SystemClock()
        self.stats = PollerStats()
        self.metrics = metrics if metrics is not None else PollerMetrics()
        self.cards: TtlCache[str, CardInfo] = TtlCache(self.settings.card_ttl, self.clock)
        self.real_name: TtlCache[str, bool] = TtlCache(self.settings.account_ttl, self.clock)
        self.invalidator = CardInvalidator(
            db, self.cards, on_priority=self._priority_announced, on_listen=self._priority_unknown
        )
        # Active priority items, (card, step) -> item id: rebuilt from the database
        # every priority_refresh by the refresher, added to at once by the
        # invalidator's LISTEN when add_priority_item commits (D9), read (and
        # popped once applied) by polls.
        self.priority: dict[tuple[str, str], int] = {}
        # Set once a re-read that started after the latest LISTEN finished: from
        # then on every new item reaches the set through its notification.
        self.priority_ready = asyncio.Event()
        self._priority_reread = asyncio.Event()  # set: re-read now, not at the interval
        self._listen_generation = 0
        # Items announced since the running re-read began: merged into its result,
        # which may predate them.
        self._announced: dict[tuple[str, str], int] = {}
        self._semaphores: dict[str, asyncio.Semaphore] = {}
        self._polls: set[asyncio.Task[None]] = set()
        self._results: list[_Result] = []
        self._failures: dict[tuple[str, str], int] = {}
        # Accounts held by a 429's Retry-After: account -> clock.monotonic() it ends.
        self._held_until: dict[str, float] = {}
        # The same holds as wall-clock times, written to the account rows by
        # the next claim, so that every poller leaves the account alone.
        self._pending_holds: dict[str, datetime] = {}
        self.account_waits = 0  # polls waiting for their account's hold to pass

    # -- the budget check (D12) ---------------------------------------------------------

    def check_budget(self, accounts: int, mode: str) -> bool:
        """In sync mode every gateway-concurrent poll may also hold a connection to apply."""
        if mode != "sync":
            return True
        return check_connection_budget(
            pool_size=self.db.max_size,
            consumers=accounts * self.settings.account_concurrency,
            writers=1,
        )

    # -- rounds --------------------------------------------------------------------------

    async def run_once(self) -> int:
        """Write back finished polls, then claim due steps and start their polls; how many."""
        await self.flush()
        room = self.settings.max_in_flight - len(self._polls)
        if room <= 0:
            return 0
        # Every poll publishes to both topics (its observation, its record):
        # a backlog on either one holds the poller off (D10).
        self.metrics.in_flight.set(len(self._polls))
        self.metrics.spool(self.pipeline.spool_stats())
        if not await self.pipeline.admit(OBSERVATIONS) or not await self.pipeline.admit(COLLECTION):
            self.stats.paused_rounds += 1
            self.metrics.paused_rounds.inc()
            return 0
        claimed = await self._claim(room)
        if not claimed:
            return 0
        await self._warm_cards([card for card, _, _ in claimed])
        for card_id, account_id, step in claimed:
            task = asyncio.create_task(self._poll(card_id, account_id, step))
            self._polls.add(task)
            task.add_done_callback(self._polls.discard)
        return len(claimed)

    async def run(self, stop: asyncio.Event) -> None:
        """Round after round until ``stop``; then wait for running polls and write them back."""
        background = [
            asyncio.create_task(self.invalidator.run(stop)),
            asyncio.create_task(self._refresh_priority(stop)),
            asyncio.create_task(self._count_dead_letters(stop)),
        ]
        try:
            while not stop.is_set():
                try:
                    started = await self.run_once()
                except ShoalError as exc:
                    self.metrics.sql_timeout(exc)
                    log.warning("poller round failed: %s", exc)
                    started = 0
                if not started:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.settings.idle_wait.total_seconds()):
                            await stop.wait()
        finally:
            await self.drain()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)

    @property
    def in_flight(self) -> int:
        """Polls started and not finished."""
        return len(self._polls)

    async def drain(self) -> None:
        """Wait for every started poll, then write their results back."""
        if self._polls:
            await asyncio.gather(*list(self._polls), return_exceptions=True)
        await self.flush()

    async def _claim(self, limit: int) -> list[tuple[str, str, Step]]:
        """Claim due steps, at most ``account_concurrency`` in flight per account across pollers.

        Two statements in one transaction. The first locks the accounts that
        have due steps, room and no 429 hold (``FOR UPDATE SKIP LOCKED``: an
        account another poller is claiming for is left to it this round).
        The second starts with a snapshot taken after those locks were
        granted, so it sees every claim that committed before: it counts each
        locked account's steps in flight (leased by any poller) and takes at
        most the rest of its limit, in due order. Slots come back when a
        poll's result is written or, should its poller die, when its lease
        passes.
        """
        now = self.clock.now()
        held = self.held_accounts()
        await self.share_holds()
        cap = self.settings.account_concurrency

        async def run(conn: AsyncConn) -> list[tuple[str, str, Step]]:
            params = {"now": now, "limit": limit, "cap": cap, "held": held}
            cur = await conn.execute(
                "WITH full_accounts AS ("
                " SELECT c.account_id FROM shoal_polling.due d"
                " JOIN shoal_polling.card c ON c.id = d.card_id"
                " WHERE d.leased_until > %(now)s"
                " GROUP BY c.account_id HAVING count(*) >= %(cap)s)"
                " SELECT a.id FROM shoal_polling.account a"
                " WHERE a.id IN ("
                "  SELECT c.account_id FROM shoal_polling.due d"
                "  JOIN shoal_polling.card c ON c.id = d.card_id"
                "  JOIN shoal_polling.account h ON h.id = c.account_id"
                "  WHERE d.due_at <= %(now)s AND c.polling_enabled"
                "  AND (h.held_until IS NULL OR h.held_until <= %(now)s)"
                "  AND c.account_id <> ALL(%(held)s::text[])"
                "  AND c.account_id NOT IN (SELECT account_id FROM full_accounts)"
                "  ORDER BY d.due_at LIMIT %(limit)s)"
                " AND (a.held_until IS NULL OR a.held_until <= %(now)s)"
                " ORDER BY a.id FOR UPDATE SKIP LOCKED",
                params,
            )
            accounts = [r[0] for r in await cur.fetchall()]
            if not accounts:
                return []
            # The steps of a locked account are claimed only by its lock's
            # holder, so they need no row locks of their own.
            cur = await conn.execute(
                "WITH running AS ("
                " SELECT c.account_id, count(*) AS n FROM shoal_polling.due d"
                " JOIN shoal_polling.card c ON c.id = d.card_id"
                " WHERE d.leased_until > %(now)s AND c.account_id = ANY(%(accounts)s)"
                " GROUP BY c.account_id),"
                " candidates AS ("
                " SELECT d.card_id, d.step, c.account_id, d.due_at FROM shoal_polling.due d"
                " JOIN shoal_polling.card c ON c.id = d.card_id"
                " WHERE d.due_at <= %(now)s AND c.polling_enabled"
                " AND c.account_id = ANY(%(accounts)s)"
                " ORDER BY d.due_at LIMIT %(limit)s),"
                " picked AS ("
                " SELECT r.card_id, r.step, r.account_id FROM ("
                "  SELECT x.*,"
                "  row_number() OVER (PARTITION BY x.account_id ORDER BY x.due_at) AS rn"
                "  FROM candidates x) r"
                " LEFT JOIN running ru ON ru.account_id = r.account_id"
                " WHERE r.rn <= %(cap)s - coalesce(ru.n, 0))"
                " UPDATE shoal_polling.due d SET due_at = %(lease)s, leased_until = %(lease)s"
                " FROM picked WHERE d.card_id = picked.card_id AND d.step = picked.step"
                " RETURNING d.card_id, picked.account_id, d.step",
                {**params, "accounts": accounts, "lease": now + self.settings.lease},
            )
            return [(r[0], r[1], r[2]) for r in await cur.fetchall()]

        return await self.db.run(run)

    async def share_holds(self) -> None:
        """Write this poller's 429 holds to their accounts, so that no poller claims their steps.

        A hold not written (the database unreachable) stays pending for the
        next call; this poller keeps honouring it meanwhile.
        """
        if not self._pending_holds:
            return
        holds, self._pending_holds = self._pending_holds, {}

        async def run(conn: AsyncConn) -> None:
            await conn.execute(
                "UPDATE shoal_polling.account a SET held_until = greatest(a.held_until, x.until)"
                " FROM unnest(%s::text[], %s::timestamptz[]) AS x(id, until) WHERE a.id = x.id",
                (list(holds), list(holds.values())),
            )

        try:
            await self.db.run(run)
        except ShoalError as exc:
            for account_id, until in holds.items():
                self._pending_holds[account_id] = max(
                    until, self._pending_holds.get(account_id, until)
                )
            log.warning("account holds not shared with other pollers yet: %s", exc)

    async def flush(self) -> None:
        """Write the next due time of every finished poll in one statement (or two)."""
        if not self._results:
            return
        results, self._results = self._results, []
        now = self.clock.now()
        keep = [r for r in results if r.outcome != "stop"]
        stopped = sorted({r.card_id for r in results if r.outcome == "stop"})
        due: list[datetime] = []
        for r in keep:
            key = (r.card_id, r.step)
            if r.outcome == "ok":
                self._failures.pop(key, None)
                due.append(now + self.settings.interval(r.step))
            else:
                failures = self._failures[key] = self._failures.get(key, 0) + 1
                backoff = self.settings.failure_backoff * 2 ** min(failures - 1, 10)
                due.append(now + min(backoff, self.settings.max_backoff))

        async def run(conn: AsyncConn) -> None:
            if keep:
                await conn.execute(
                    "UPDATE shoal_polling.due d SET due_at = x.due_at, leased_until = NULL,"
                    " failures = CASE WHEN x.ok THEN 0 ELSE d.failures + 1 END"
                    " FROM unnest(%s::text[], %s::text[], %s::timestamptz[], %s::boolean[])"
                    " AS x(card_id, step, due_at, ok)"
                    " WHERE d.card_id = x.card_id AND d.step = x.step",
                    (
                        [r.card_id for r in keep],
                        [r.step for r in keep],
                        due,
                        [r.outcome == "ok" for r in keep],
                    ),
                )
            if stopped:
                # The reference's removeCard: no more polls of a card at risk.
                await conn.execute(
                    "DELETE FROM shoal_polling.due WHERE card_id = ANY(%s)", (stopped,)
                )

        try:
            await self.db.run(run)
        except ShoalError as exc:
            self.metrics.sql_timeout(exc)
            log.warning("poll results not written (%s); their leases will hand them back", exc)

    # -- dead letters (for the metrics) ------------------------------------------------------

    async def count_dead_letters(self) -> dict[str, int]:
        """Each polling topic's dead letters waiting for a redrive (up to the cap), as gauges."""
        counts = {}
        for topic in (OBSERVATIONS.name, COLLECTION.name):
            letters = await self.pipeline.store.dead_letters(topic, limit=DEAD_LETTER_CAP)
            counts[topic] = len(letters)
            self.metrics.dead_letters.labels(topic=topic).set(len(letters))
        return counts

    async def _count_dead_letters(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.count_dead_letters()
            except ShoalError as exc:
                log.warning("dead letters not counted: %s", exc)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.dead_letter_interval.total_seconds()):
                    await stop.wait()

    # -- caches ----------------------------------------------------------------------------

    async def _warm_cards(self, ids: Sequence[str]) -> None:
        missing = self.cards.missing(sorted(set(ids)))
        if not missing:
            return
        try:
            for card_id, info in (await load_cards(self.db, missing)).items():
                self.cards.put(card_id, info)
        except ShoalError as exc:  # not cached: each poll loads its card again
            log.warning("card cache: bulk load failed: %s", exc)

    async def _card(self, card_id: str) -> CardInfo:
        async def load(key: str) -> CardInfo:
            found = await load_cards(self.db, [key])
            return found[key]

        return await self.cards.get(card_id, load)

    async def _refresh_priority(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.refresh_priority()
            except ShoalError as exc:
                log.warning("priority items not refreshed: %s", exc)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.priority_refresh.total_seconds()):
                    await _either(stop, self._priority_reread)

    async def refresh_priority(self) -> None:
        """Re-read the active priority items; the safety net under their notifications."""
        self._priority_reread.clear()
        generation = self._listen_generation
        self._announced = {}

        async def run(conn: AsyncConn) -> dict[tuple[str, str], int]:
            cur = await conn.execute(
                "SELECT card_id, step, max(id) FROM shoal_polling.priority_item"
                " WHERE state = 'active' GROUP BY card_id, step"
            )
            return {(r[0], r[1]): r[2] for r in await cur.fetchall()}

        found = await self.db.run(run, transaction=False)
        for key, item in self._announced.items():
            found[key] = max(found.get(key, 0), item)
        self.priority = found
        if generation == self._listen_generation:
            self.priority_ready.set()

    def _priority_announced(self, payload: str) -> None:
        """A priority item committed (``add_priority_item``): into the set at once."""
        try:
            doc = json.loads(payload)
            key = (str(doc["card_id"]), str(doc["step"]))
            item = int(doc["id"])
        except (ValueError, KeyError, TypeError) as exc:
            log.warning(
                "priority notification %r unreadable (%s); the re-read finds it", payload, exc
            )
            self._priority_reread.set()
            return
        self.priority[key] = max(self.priority.get(key, 0), item)
        self._announced[key] = max(self._announced.get(key, 0), item)

    def _priority_unknown(self) -> None:
        """LISTEN (re)started: items announced while nobody listened need a re-read."""
        self._listen_generation += 1
        self.priority_ready.clear()
        self._priority_reread.set()

    # -- one poll -------------------------------------------------------------------------

    def _semaphore(self, account_id: str) -> asyncio.Semaphore:
        sem = self._semaphores.get(account_id)
        if sem is None:
            sem = self._semaphores[account_id] = asyncio.Semaphore(
                self.settings.account_concurrency
            )
        return sem

    async def _poll(self, card_id: str, account_id: str, step: Step) -> None:
        self.stats.polls += 1
        try:
            async with self._semaphore(account_id):
                if step == "plan":
                    outcome = await self._plan(card_id)
                else:
                    outcome = await self._observe(card_id, account_id, step)
        except Exception as exc:  # a loop boundary: log with the card, keep polling
            log.warning("poll %s/%s failed: %s: %s", card_id, step, type(exc).__name__, exc)
            self.stats.error(type(exc).__name__)
            self.metrics.sql_timeout(exc)
            outcome = "failed"
        self.metrics.polls.labels(step=step, outcome=outcome).inc()
        self._results.append(_Result(card_id, step, outcome))

    async def _observe(self, card_id: str, account_id: str, kind: Kind) -> str:
        if kind == "real_name" and not await self.real_name.get(
            account_id, lambda a: load_real_name_enabled(self.db, a)
        ):
            return "ok"  # the account's carrier has no real-name query
        card = await self._card(card_id)
        if not card.polling_enabled:
            return "stop"
        priority_item = self.priority.get((card_id, kind))
        try:
            answer = await self._call(account_id, card_id, kind)
        except GatewayError as exc:
            self.stats.gateway_errors += 1
            # D7: a failed poll is recorded by the step itself.
            await self.ingest.record(
                CollectionRecord(
                    f"failed-{uuid.uuid4()}",
                    self.clock.now(),
                    card_id,
                    kind,
                    ok=False,
                    error=str(exc)[:500],
                )
            )
            return "failed"
        self.stats.observations += 1
        observation = Observation(
            observation_id=answer.observation_id,
            card_id=card_id,
            account_id=account_id,
            kind=kind,
            observed_at=answer.observed_at,
            used_kb=answer.used_kb,
            status=answer.status,
            raw=answer.raw,
            priority_item_id=priority_item,
        )
        stop = should_stop_polling_for_risk(kind, answer.status)
        try:
            # D8: a priority poll stays on the sync path, and completes its item on commit.
            submitted = await self.pipeline.submit(
                OBSERVATIONS,
                observation,
                self.ingest.apply,
                id=observation.observation_id,
                mode="sync" if priority_item is not None else None,
            )
        except Exception as exc:
            self.stats.apply_errors += 1
            self.stats.error(type(exc).__name__)
            self.metrics.observations.labels(route="failed").inc()
            self.metrics.sql_timeout(exc)
            log.warning(
                "observation %s of %s not applied: %s: %s",
                observation.observation_id,
                card_id,
                type(exc).__name__,
                exc,
            )
            return "stop" if stop else "failed"
        self.metrics.observations.labels(route=submitted.route).inc()
        self.metrics.sql_timeout(submitted.error)
        if submitted.rounds > 1:
            self.stats.resubmitted += 1
        if submitted.route == "handed_off":
            # The reference's SQL timeout, without its loss: a consumer applies it later.
            self.stats.apply_errors += 1
            self.stats.handed_off += 1
            self.stats.error(type(submitted.error).__name__)
        elif submitted.route == "degraded":
            self.stats.degraded += 1
        elif submitted.route == "spooled":
            # On disk; the pipeline's replayer applies or publishes it once a path is back.
            self.stats.spooled += 1
        elif priority_item is not None:
            self.priority.pop((card_id, kind), None)
            self._announced.pop((card_id, kind), None)
            self.stats.priority_applied += 1
        if stop:
            self.stats.risk_stops += 1
            return "stop"
        return "ok"

    async def _call(self, account_id: str, card_id: str, kind: Kind) -> GatewayAnswer:
        """The gateway call, after the account's hold; a 429 holds the account and calls again."""
        account = self.metrics.account(account_id)
        retries = 0
        while True:
            await self._wait_for_account(account_id)
            started = self.clock.monotonic()
            try:
                answer = await self.gateway.query(account_id, card_id, kind)
            except GatewayError as exc:
                self.metrics.gateway_seconds.labels(account=account).observe(
                    self.clock.monotonic() - started
                )
                self.metrics.gateway_errors.labels(
                    account=account, reason=gateway_error_reason(exc.status)
                ).inc()
                if exc.status != 429:
                    raise
                self.stats.rate_limited += 1
                self.metrics.rate_limited.labels(account=account).inc()
                self.hold_account(account_id, exc.retry_after)
                await self.share_holds()
                if retries >= self.settings.rate_limit_retries:
                    raise
                retries += 1
                continue
            self.metrics.gateway_seconds.labels(account=account).observe(
                self.clock.monotonic() - started
            )
            return answer

    def hold_account(self, account_id: str, retry_after: float | None) -> None:
        """Hold ``account_id``'s calls for ``retry_after`` seconds (1 s when None), capped."""
        seconds = min(
            1.0 if retry_after is None else retry_after,
            self.settings.max_account_pause.total_seconds(),
        )
        until = self.clock.monotonic() + seconds
        if until <= self._held_until.get(account_id, 0.0):
            return  # a pause that lasts longer is already in force
        if account_id not in self._held_until:
            log.warning(
                "account %s: gateway answered 429; holding its calls %.1f s", account_id, seconds
            )
        self._held_until[account_id] = until
        self._pending_holds[account_id] = self.clock.now() + timedelta(seconds=seconds)
        self.stats.account_pauses += 1
        self.metrics.account_pauses.labels(account=self.metrics.account(account_id)).inc()
        self.metrics.accounts_paused.set(len(self._held_until))

    def held_accounts(self) -> list[str]:
        """Accounts whose hold has not yet passed (and forget those whose has)."""
        now = self.clock.monotonic()
        for account_id in [a for a, until in self._held_until.items() if until <= now]:
            del self._held_until[account_id]
        self.metrics.accounts_paused.set(len(self._held_until))
        return sorted(self._held_until)

    async def _wait_for_account(self, account_id: str) -> None:
        while True:
            until = self._held_until.get(account_id)
            if until is None:
                return
            left = until - self.clock.monotonic()
            if left <= 0:
                if self._held_until.get(account_id) == until:
                    del self._held_until[account_id]
                    self.metrics.accounts_paused.set(len(self._held_until))
                return
            self.account_waits += 1
            self.metrics.account_waits.set(self.account_waits)
            try:
                await self.clock.sleep(left)
            finally:
                self.account_waits -= 1
                self.metrics.account_waits.set(self.account_waits)

    async def _plan(self, card_id: str) -> str:
        card = await self._card(card_id)
        if not card.polling_enabled:
            return "stop"
        now = self.clock.now()
        if card.flow_evaluated_until is not None and card.flow_evaluated_until > now:
            self.stats.plan_skipped += 1
            return "ok"
        await self.db.run(lambda conn: evaluate_plan(conn, card_id, now=now))
        self.stats.plan_evaluated += 1
        return "ok"


async def add_priority_item(db: Database, card_id: str, step: Kind) -> int:
    """Ask for the next poll of ``card_id``'s ``step`` to be applied synchronously (D8).

    Listening pollers add it to their priority set as soon as this commits
    (``pg_notify``, delivered on commit); a poller that missed the
    notification finds it at its next re-read (``priority_refresh``, 30 s).
    """

    async def run(conn: AsyncConn) -> int:
        cur = await conn.execute(
            "INSERT INTO shoal_polling.priority_item (card_id, step) VALUES (%s, %s) RETURNING id",
            (card_id, step),
        )
        row = await cur.fetchone()
        assert row is not None
        item = int(row[0])
        announce = json.dumps({"id": item, "card_id": card_id, "step": step})
        await conn.execute("SELECT pg_notify(%s, %s)", (PRIORITY_CHANNEL, announce))
        return item

    return await db.run(run)


async def _either(*events: asyncio.Event) -> None:
    """Until one of ``events`` is set."""
    waits = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
