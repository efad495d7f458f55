"""Leadership of once-per-cluster duties: which process runs maintenance, cron, the sampler.

Every process that can do a duty contends for it; one leads it at a time, and
only the leader runs it. A process has one :class:`Elector`: one connection of
its own (outside the pool) on which it holds a session advisory lock per duty
it leads, keyed on ``hashtext('<schema>.<duty>')``. The server decides: the
lock is granted to one session, and released the moment that session ends.

- A leader learns that it lost a duty as soon as its connection fails: the
  elector waits on the connection between rounds (LISTEN), so a terminated
  backend, a server restart or a failover ends its term at once, and the
  duty's work is cancelled (:meth:`Elector.lead`). A connection that goes
  silent (a network cut) fails its next round within :data:`ROUND_DEADLINE`.
- Followers try every ``retry`` (:data:`DEFAULT_RETRY`): a leader whose
  process died or whose connection ended is replaced within one ``retry``. A
  leader that resigns (stops, or gives up a duty) tells them on the channel
  ``<schema>_lead`` and they try at once.
- A leader that is alive to the server but no longer runs (its event loop
  stalled) is deposed: the leader's elector runs a statement every ``retry``,
  which moves its session's ``state_change`` in ``pg_stat_activity``; a
  follower that sees it unmoved for ``depose_after`` (:data:`DEFAULT_DEPOSE_AFTER`,
  measured on its own clock) ends that session (``pg_terminate_backend``) and
  takes the lock. Deposing needs the processes to share a database role (or
  ``pg_signal_backend`` and ``pg_read_all_stats``); without it a stalled
  leader keeps its duties until its connection ends.
- A cut-off leader stops before another can start: it gives up within
  ``retry`` + :data:`ROUND_DEADLINE` (15 s), while the server keeps its lock
  until its keepalives fail (:data:`SERVER_KEEPALIVES`, about 25 s) or a
  follower deposes it (``depose_after``, 30 s).

Why a lock and not a lease row with an expiry (River's ``leadership``): the
lock needs no table, and a crashed leader is replaced at the followers' next
try instead of after the lease's time to live. Its limits: it lives on one
server session, so the elector's connection must reach PostgreSQL directly,
never through PgBouncer in transaction mode (docs/deploying.md); and it is
not a fence. Leadership only keeps a duty from running in every process: the
duties' own writes stay safe to race (conditional updates, ``SKIP LOCKED``,
``ON CONFLICT``), for the moments when a deposed leader has not yet noticed.

Who leads is visible: the holder's connection is named ``shoal-elector
<host>:<pid>`` in ``pg_stat_activity`` (:func:`leaders`, ``shoal status``).

>>> elector = Elector(db, clock=clock)                    # doctest: +SKIP
>>> await elector.lead("queue.cron", scheduler.run)      # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from psycopg import sql

from shoal.clock import SYSTEM_CLOCK, Clock
from shoal.db.pool import AsyncConn, Database, abandon_after
from shoal.errors import InvalidInput

log = logging.getLogger("shoal.leadership")

# Followers try this often to take a duty nobody holds, and a leader renews
# (runs a statement) this often: a leader that died is replaced within it.
DEFAULT_RETRY = timedelta(seconds=5)
# A leader whose elector ran nothing for this long is deposed: six missed
# renewals at the default retry, so a loaded event loop is not taken for a
# stalled one.
DEFAULT_DEPOSE_AFTER = timedelta(seconds=30)
# depose_after must be at least this many retries.
MIN_RENEWALS_PER_DEPOSE = 3
# How many of its own lost sessions an elector remembers, to end them if the
# server still has them holding its duties.
MAX_LOST_SESSIONS = 8
# One round's statements on the elector's connection must end within this, or
# the connection is closed and every duty it held is given up: a leader cut
# off from the server stops within retry + this, before the server can let
# another take over (SERVER_KEEPALIVES).
ROUND_DEADLINE = timedelta(seconds=10)
# Set on the elector's session: the server ends the session of a leader whose
# host vanished (no reset ever comes) after idle + interval * count seconds
# without an answer to its keepalives, about 25 s, and so frees its locks.
# The operating system's defaults take more than two hours.
SERVER_KEEPALIVES = {
    "tcp_keepalives_idle": 10,
    "tcp_keepalives_interval": 5,
    "tcp_keepalives_count": 3,
}
# The elector's connection in pg_stat_activity: this, then the process's identity.
ELECTOR_NAME_PREFIX = "shoal-elector "
# PostgreSQL keeps this many bytes of an application_name.
MAX_APPLICATION_NAME = 63
DUTY_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789._-")
MAX_DUTY_NAME = 60


def leadership_channel(schema: str) -> str:
    """The channel a resigning leader notifies, with the duty's name (one per schema).

    As short as ``<schema>_jobs``: a channel name holds 63 bytes.
    """
    return f"{schema}_lead"


def check_duty(duty: object) -> str:
    """``duty`` as given, or InvalidInput naming it: lower-case letters, digits, ``._-``."""
    if (
        not isinstance(duty, str)
        or not 1 <= len(duty) <= MAX_DUTY_NAME
        or not set(duty) <= DUTY_NAME_CHARS
    ):
        raise InvalidInput(
            "duty",
            f"must be 1-{MAX_DUTY_NAME} characters of a-z, 0-9, '.', '_' and '-', got {duty!r:.80}",
        )
    return duty


def this_process() -> str:
    """This process as the Workers page shows it: ``host:pid``.

    Names the elector's connection, and work handed back at shutdown in its
    history notes.
    """
    return f"{socket.gethostname()}:{os.getpid()}"


def elector_name(identity: str) -> str:
    """The application_name of an elector's connection, cut as PostgreSQL cuts it."""
    name = (ELECTOR_NAME_PREFIX + identity).encode()[:MAX_APPLICATION_NAME]
    return name.decode(errors="ignore")


# The session holding each duty's lock, if any. A bigint advisory key appears
# in pg_locks as its high 32 bits (classid) and low 32 bits (objid), objsubid 1.
# state_change is NULL for a session of another role (without pg_read_all_stats).
_HOLDERS = sql.SQL(
    """
SELECT d.duty, a.pid, a.application_name, a.backend_start, a.state_change
FROM unnest(%(duties)s::text[], %(keys)s::text[]) AS d(duty, key)
LEFT JOIN pg_locks l
  ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
 AND l.classid = ((hashtext(d.key)::bigint >> 32) & 4294967295)::oid
 AND l.objid = (hashtext(d.key)::bigint & 4294967295)::oid
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
ORDER BY d.duty
"""
)
# Each duty's lock, for this session if free. hashtext, not hashtextextended:
# the backlog monitor took hashtext('<schema>.ingest.monitor') before this
# module existed, so during a rolling upgrade old and new monitors still
# contend for one lock.
_TRY = sql.SQL(
    "SELECT d.duty, pg_try_advisory_lock(hashtext(d.key)) "
    "FROM unnest(%(duties)s::text[], %(keys)s::text[]) AS d(duty, key)"
)
# Give duties up, and tell the followers (delivered when this commits: at once).
_RELEASE = sql.SQL(
    "SELECT pg_advisory_unlock(hashtext(d.key)), pg_notify(%(channel)s, d.duty) "
    "FROM unnest(%(duties)s::text[], %(keys)s::text[]) AS d(duty, key)"
)
# End a stalled leader's session and wait (up to 5 s) until it is gone, with
# its locks: PostgreSQL 14's form of the function.
_DEPOSE = sql.SQL("SELECT pg_terminate_backend(%(pid)s, 5000)")
_KEEPALIVES = sql.SQL("SELECT ") + sql.SQL(", ").join(
    sql.SQL("set_config({}, {}, false)").format(sql.Literal(name), sql.Literal(str(value)))
    for name, value in SERVER_KEEPALIVES.items()
)


@dataclass(frozen=True, slots=True)
class Holder:
    """Who leads a duty now: the session holding its lock (all None when nobody does)."""

    duty: str
    pid: int | None  # the holder's backend pid
    application_name: str | None  # "shoal-elector host:pid" for an elector
    connected_at: datetime | None  # when the holder's connection began
    active_at: datetime | None  # its last statement (None: not visible to this role)

    @property
    def process(self) -> str | None:
        """The leading process's identity (``host:pid``), or None (nobody, or not an elector)."""
        name = self.application_name
        if name is None or not name.startswith(ELECTOR_NAME_PREFIX):
            return None
        return name[len(ELECTOR_NAME_PREFIX) :]


async def leaders(db: Database, duties: Iterable[str]) -> list[Holder]:
    """Who leads each of ``duties`` in ``db``'s schema now (read on the pool)."""
    names = sorted({check_duty(d) for d in duties})
    rows = await db.fetch(sql.Composed([_HOLDERS]), _params(db.schema, names))
    return [Holder(*row) for row in rows]


def _params(schema: str, duties: Sequence[str]) -> dict[str, Any]:
    return {"duties": list(duties), "keys": [f"{schema}.{d}" for d in duties]}


class Leadership:
    """One duty as one process sees it: whether it leads it now.

    Written by the elector's loop only; read by anyone. ``elected`` is set
    while this process leads, ``lost`` while it does not; ``terms`` counts the
    terms it has begun.
    """

    def __init__(self, duty: str) -> None:
        self.duty = duty
        self.elected = asyncio.Event()
        self.lost = asyncio.Event()
        self.lost.set()
        self.terms = 0

    @property
    def is_leader(self) -> bool:
        return self.elected.is_set()

    def _begin(self) -> None:
        self.terms += 1
        self.lost.clear()
        self.elected.set()

    def _end(self) -> None:
        self.elected.clear()
        self.lost.set()


@dataclass(frozen=True, slots=True)
class Round:
    """What one round of an elector did."""

    leading: tuple[str, ...]  # the duties this process leads after it
    elected: tuple[str, ...]  # of which those it began to lead in this round
    deposed: tuple[Holder, ...]  # stalled leaders whose sessions it ended


class Elector:
    """This process's side of every duty's election; see the module docstring.

    ``retry`` is how often it tries for the duties nobody leads and renews
    those it leads; ``depose_after`` how long another leader may go without a
    renewal before this process ends its session. Both use ``clock``.
    """

    def __init__(
        self,
        db: Database,
        *,
        clock: Clock = SYSTEM_CLOCK,
        identity: str | None = None,
        retry: timedelta = DEFAULT_RETRY,
        depose_after: timedelta = DEFAULT_DEPOSE_AFTER,
    ) -> None:
        if not isinstance(retry, timedelta) or retry <= timedelta(0):
            raise InvalidInput("retry", f"must be a positive timedelta, got {retry!r}")
        if (
            not isinstance(depose_after, timedelta)
            or depose_after < MIN_RENEWALS_PER_DEPOSE * retry
        ):
            raise InvalidInput(
                "depose_after",
                f"must be a timedelta of at least {MIN_RENEWALS_PER_DEPOSE} retries "
                f"({(MIN_RENEWALS_PER_DEPOSE * retry).total_seconds():g}s), got {depose_after!r}",
            )
        self.db = db
        self.clock = clock
        self.identity = identity if identity is not None else this_process()
        self.name = elector_name(self.identity)
        self.retry = retry
        self.depose_after = depose_after
        self.channel = leadership_channel(db.schema)
        # Every duty this process has contended for; those it contends for now.
        self._duties: dict[str, Leadership] = {}
        self._wanted: set[str] = set()
        # Duties given up while held, to unlock and announce at the next round.
        self._released: set[str] = set()
        # Each contested duty's holder as this process last saw it: (pid,
        # state_change) and when (its clock) it first saw them so.
        self._seen: dict[str, tuple[tuple[int, datetime], datetime]] = {}
        # Set to run a round now: a duty asked for or given up, a resignation heard.
        self._wake = asyncio.Event()
        # Set while the elector's connection is up (after its first round).
        self.connected = asyncio.Event()
        # Rounds held so far (read by tests awaiting the next one).
        self.rounds = 0
        self._conn: AsyncConn | None = None
        # Backend pids of this elector's earlier connections, newest last: a
        # session the server still keeps after the elector lost it (a network
        # cut) may still hold a duty, and is ended as soon as it is seen.
        self._lost_sessions: list[int] = []
        # The server's pid of the current connection's session, and whether
        # it changed under the connection (a pooler in transaction mode).
        self._session: int | None = None
        self._pooled = False
        self._task: asyncio.Task[None] | None = None
        # Set by close() while it ends the loop: the terms end by choice.
        self._closing = False

    # -- what the duties use -------------------------------------------------

    def contend(self, duty: str) -> Leadership:
        """Contend for ``duty`` from now on (at once if the elector runs); its view of it."""
        leadership = self._duties.get(check_duty(duty))
        if leadership is None:
            leadership = self._duties[duty] = Leadership(duty)
        self._wanted.add(duty)
        # A duty given up but not yet unlocked stays to be unlocked first: the
        # lock counts each acquisition, and a second would outlive the unlock.
        self._wake.set()
        return leadership

    def withdraw(self, duty: str) -> None:
        """Stop contending for ``duty``; if this process leads it, resign (the next round
        unlocks it and tells the followers, who try at once)."""
        self._wanted.discard(duty)
        leadership = self._duties.get(duty)
        if leadership is not None and leadership.is_leader:
            leadership._end()
            self._released.add(duty)
        self._wake.set()

    def leadership(self, duty: str) -> Leadership | None:
        """This process's view of ``duty``, once it has contended for it."""
        return self._duties.get(duty)

    async def lead(self, duty: str, work: Callable[[], Awaitable[object]]) -> None:
        """Run ``work()`` in each term this process leads ``duty``, until cancelled.

        ``work`` is a duty's loop (``Maintenance.run``): a term starts it, and
        the end of the term (connection lost, deposed) cancels it; the next
        term starts it afresh. When ``work()`` ends by itself, or this call is
        cancelled, the duty is given up (the followers take it at once) and
        its return or exception passes through.
        """
        leadership = self.contend(duty)
        self.start()
        try:
            while True:
                await leadership.elected.wait()
                log.info("leading %s (%s)", duty, self.identity)
                term = asyncio.ensure_future(work())
                ended = asyncio.ensure_future(leadership.lost.wait())
                try:
                    await asyncio.wait([term, ended], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    ended.cancel()
                    if not term.done():
                        term.cancel()
                        # Whatever the cancelled work raises on its way out.
                        await asyncio.gather(term, return_exceptions=True)
                if term.done() and not term.cancelled():
                    term.result()  # its exception, if it raised
                    return
                log.warning("no longer leading %s: its work stopped", duty)
        finally:
            self.withdraw(duty)

    # -- the loop --------------------------------------------------------------

    def start(self) -> None:
        """Run the loop in a task (idempotent); :meth:`close` stops it."""
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="shoal-elector")

    async def close(self) -> None:
        """Resign every duty (the followers are told at once) and close the connection."""
        self._wanted.clear()
        task, self._task = self._task, None
        if task is not None:
            self._closing = True
            task.cancel()
            try:
                # Not an await of the task: a cancellation of close() meanwhile must pass.
                await asyncio.wait([task])
            finally:
                self._closing = False

    async def run(self) -> None:
        """Connect, hold rounds and wait between them, until cancelled; reconnect when lost."""
        while True:
            try:
                conn = await self.db.connect(application_name=self.name)
                try:
                    await self._serve(conn)
                finally:
                    await self._hang_up(conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # loop boundary: leadership outlives a lost connection
                log.warning("leadership connection lost (%s); trying again", exc)
            await self.clock.sleep(self.retry.total_seconds())

    async def _serve(self, conn: AsyncConn) -> None:
        """Rounds on ``conn``, and the waits between them; returns only by raising."""
        with abandon_after(conn, ROUND_DEADLINE.total_seconds()):
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
            await conn.execute(_KEEPALIVES)
            self._session = await self._server_pid(conn)
        self._pooled = False
        self._conn = conn
        self._seen.clear()
        while True:
            await self.run_once()
            self.connected.set()
            await self._wait(conn)

    async def _hang_up(self, conn: AsyncConn) -> None:
        """The connection is going: every term ends now; followers are told."""
        self._conn = None
        if self._session is not None:
            self._lost_sessions = [*self._lost_sessions, self._session][-MAX_LOST_SESSIONS:]
            self._session = None
        self.connected.clear()
        held = sorted(d for d, ship in self._duties.items() if ship.is_leader) + sorted(
            self._released
        )
        for duty in held:
            self._duties[duty]._end()
        if held and self._closing:
            log.debug("resigned %s (%s): closing", ", ".join(held), self.identity)
        elif held:
            log.warning("gave up leading %s: the elector's connection closed", ", ".join(held))
        if held and not conn.broken and not self._pooled:
            # Best effort: the lock goes with the session anyway; the note lets
            # the followers take over now rather than at their next try.
            with contextlib.suppress(Exception), abandon_after(conn, 2.0):
                await conn.execute(_RELEASE, self._release_params(held))
        self._released.clear()
        with contextlib.suppress(Exception):
            await conn.close()

    def _release_params(self, duties: Sequence[str]) -> dict[str, Any]:
        return {**_params(self.db.schema, duties), "channel": self.channel}

    async def _wait(self, conn: AsyncConn) -> None:
        """Until ``retry`` passes or a round is asked for; raises when the connection is lost."""
        listen = asyncio.ensure_future(self._listen(conn))
        waits = [
            listen,
            asyncio.ensure_future(self.clock.sleep(self.retry.total_seconds())),
            asyncio.ensure_future(self._wake.wait()),
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()
            # Cancelled while it waited for the socket to be readable, the
            # connection is idle and usable. asyncio.wait, not an await of
            # the task: a cancellation of this task arriving meanwhile (close)
            # must pass, not be taken for the listener's own.
            await asyncio.wait([listen])
        lost = None if listen.cancelled() else listen.exception()
        if lost is not None:
            raise lost  # the connection's loss

    async def _listen(self, conn: AsyncConn) -> None:
        """Wake a round when a leader resigns a duty this process wants. Raises when
        the connection fails, which is how a leader learns at once that it lost."""
        async for note in conn.notifies():
            if note.payload in self._wanted and note.pid != self._session:
                self._wake.set()

    async def run_once(self) -> Round:
        """One round on the elector's connection: give up what was withdrawn, take
        what is free, renew what is held, depose stalled leaders."""
        conn = self._conn
        if conn is None:
            raise RuntimeError("the elector is not connected: start() it, or await run()")
        self._wake.clear()
        schema = self.db.schema
        elected: list[str] = []
        deposed: list[Holder] = []
        with abandon_after(conn, ROUND_DEADLINE.total_seconds()):
            if not self._pooled and await self._server_pid(conn) != self._session:
                self._go_pooled()
            if self._pooled:
                return self._lockless_round()
            released = sorted(self._released)
            if released:
                await conn.execute(_RELEASE, self._release_params(released))
                self._released.difference_update(released)
                # DEBUG: routine at every stop, after the worker's last line.
                log.debug("resigned %s (%s)", ", ".join(released), self.identity)
            free = sorted(d for d in self._wanted if not self._duties[d].is_leader)
            if free:
                cur = await conn.execute(_TRY, _params(schema, free))
                elected = [duty for duty, won in await cur.fetchall() if won]
            wanted = sorted(self._wanted)
            holders: list[Holder] = []
            if wanted:
                # Every round runs this, so it is also the leader's renewal.
                cur = await conn.execute(_HOLDERS, _params(schema, wanted))
                holders = [Holder(*row) for row in await cur.fetchall()]
            for holder in holders:
                leadership = self._duties[holder.duty]
                if holder.pid == self._session:
                    self._seen.pop(holder.duty, None)
                    continue
                if leadership.is_leader and holder.duty not in elected:
                    # Cannot happen while the session lives; said loudly if it does.
                    log.error("lost %s without losing the connection", holder.duty)
                    leadership._end()
                if holder.pid is not None and self._stalled(holder):
                    await conn.execute(_DEPOSE, {"pid": holder.pid})
                    deposed.append(holder)
                    log.warning(
                        "deposed the leader of %s, %s (backend %d): it ran nothing for %gs",
                        holder.duty,
                        holder.process,
                        holder.pid,
                        self.depose_after.total_seconds(),
                    )
            if deposed:
                cur = await conn.execute(_TRY, _params(schema, [h.duty for h in deposed]))
                elected += [duty for duty, won in await cur.fetchall() if won]
        for duty in elected:
            self._seen.pop(duty, None)
            if duty in self._wanted:
                self._duties[duty]._begin()
            else:  # withdrawn while this round took it
                self._released.add(duty)
                self._wake.set()
        self.rounds += 1
        leading = tuple(sorted(d for d, ship in self._duties.items() if ship.is_leader))
        return Round(leading, tuple(sorted(set(elected))), tuple(deposed))

    @staticmethod
    async def _server_pid(conn: AsyncConn) -> int:
        cur = await conn.execute("SELECT pg_backend_pid()")
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    def _go_pooled(self) -> None:
        """The connection's server session changed under it: a pooler in transaction
        mode (PgBouncer) sits between, where a session lock cannot be held."""
        self._pooled = True
        log.error(
            "the elector's connection goes through a pooler in transaction mode: its server "
            "session changed between two statements. Leadership cannot be held there, so "
            "this process runs every duty it takes (%s), as every other such process does; "
            "the duties are safe to race, only costlier. Connect shoal worker to PostgreSQL "
            "directly (docs/deploying.md, PgBouncer in transaction mode)",
            ", ".join(sorted(self._wanted)) or "none yet",
        )

    def _lockless_round(self) -> Round:
        """A round behind a transaction pooler: every duty wanted is led, none is locked."""
        self._released.clear()
        elected = sorted(d for d in self._wanted if not self._duties[d].is_leader)
        for duty in elected:
            self._duties[duty]._begin()
        self.rounds += 1
        leading = tuple(sorted(d for d, ship in self._duties.items() if ship.is_leader))
        return Round(leading, tuple(elected), ())

    def _stalled(self, holder: Holder) -> bool:
        """Whether ``holder`` is an elector whose renewals stopped ``depose_after`` ago, or
        an earlier connection of this process (lost to it, not yet to the server)."""
        if holder.pid is None or holder.process is None:
            return False  # nobody, or not an elector: never ended from here
        if holder.pid in self._lost_sessions and holder.application_name == self.name:
            return True
        if holder.active_at is None:
            return False  # another role's session: its activity is hidden
        now = self.clock.now()
        state = (holder.pid, holder.active_at)
        seen = self._seen.get(holder.duty)
        if seen is None or seen[0] != state:
            self._seen[holder.duty] = (state, now)
            return False
        return now - seen[1] >= self.depose_after


__all__ = [
    "DEFAULT_DEPOSE_AFTER",
    "DEFAULT_RETRY",
    "MIN_RENEWALS_PER_DEPOSE",
    "Elector",
    "Holder",
    "Leadership",
    "Round",
    "check_duty",
    "elector_name",
    "leaders",
    "leadership_channel",
    "this_process",
]
