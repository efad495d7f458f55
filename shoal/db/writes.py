"""Whether the database accepts writes: a probe commit with a short timeout.

A primary whose synchronous standby is gone still answers every read, but
each commit that wrote anything waits for the standby's acknowledgement,
forever. ``SELECT 1`` cannot see that. :class:`WriteProbe` commits a tiny
write and says whether the commit completed within :data:`WRITE_TIMEOUT`.
``/readyz`` and the console ask it through a :class:`CachedWriteCheck`, and
every worker process runs a :class:`WriteStallWatch` that logs one ERROR
naming the likely cause when commits keep stalling.

The write is a transactional logical-decoding message
(``pg_logical_emit_message``): it needs no table and no privilege beyond
LOGIN, and it writes WAL, so its commit waits for synchronous replication as
any real write does. (A transaction that only takes an xid writes no WAL
before its commit record and skips that wait.) A logical decoder that asks
for messages sees them, under the prefix :data:`PROBE_PREFIX`.

A commit waiting for a synchronous standby ignores ``statement_timeout``:
the probe cancels it from the client when :data:`WRITE_TIMEOUT` passes.
PostgreSQL then ends the wait, warns that the transaction committed locally
(harmless here: it wrote nothing of anyone's) and leaves the connection idle
and reusable. Closing the socket instead would leave the server process
waiting for the standby, holding a connection slot, for as long as the
stall lasts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

import psycopg
from psycopg import pq

from shoal.clock import SYSTEM_CLOCK, Clock
from shoal.db.pool import AsyncConn, Database, abandon_after, translate

log = logging.getLogger("shoal.db")

# Long enough for a commit acknowledged by a standby in another zone (a few
# ms) on a loaded server, short enough to answer an orchestrator's readiness
# probe (often 1-5 s) with the cancel's round trip included.
WRITE_TIMEOUT = timedelta(seconds=2)
# Beyond WRITE_TIMEOUT: for the cancel request to be answered. A server that
# does not answer by then is not answering at all, and the probe's own
# connection is closed (abandon_after), not reused.
CANCEL_GRACE = timedelta(seconds=1)
# How long /readyz and the console reuse one answer: a burst of probes (an
# orchestrator, a load balancer, open console pages) makes one write.
CHECK_MAX_AGE = timedelta(seconds=1.5)
# A worker process probes this often, and logs its ERROR once commits have
# stalled this long (counted from the first probe that stalled).
WATCH_INTERVAL = timedelta(seconds=5)
STALL_ERROR_AFTER = timedelta(seconds=30)
PROBE_PREFIX = "shoal.write_probe"
# The probe's connection is "<the pool's application_name>:write-probe" in
# pg_stat_activity, told apart from the pool's: whoever counts or terminates
# a process's pool connections by name is not misled by it.
PROBE_NAME_SUFFIX = ":write-probe"

QUERY_CANCELED = "57014"
EMIT_MESSAGE = "SELECT pg_logical_emit_message(true, %s, '')"
STANDBY_NAMES = "SELECT current_setting('synchronous_standby_names')"


class WriteState(StrEnum):
    """What one probe found."""

    # The probe's commit completed within the timeout.
    WRITABLE = "writable"
    # The server answered, but the write did not complete within the timeout.
    STALLED = "stalled"
    # The probe failed: no connection, a refused write, a server that does
    # not answer its cancel. The message names the error.
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class WriteCheck:
    """One probe's finding: ``message`` says what is wrong (empty when writable),
    ``cause`` what likely causes a stall (empty unless stalled)."""

    state: WriteState
    message: str = ""
    cause: str = ""

    @property
    def is_writable(self) -> bool:
        return self.state is WriteState.WRITABLE


def stall_cause(standby_names: str | None) -> str:
    """The likely cause of commits that stall, from ``synchronous_standby_names``.

    >>> stall_cause("standby1")
    "synchronous_standby_names = 'standby1': is a synchronous standby down?"
    """
    if standby_names is None:
        return "a synchronous standby may be down: check synchronous_standby_names"
    if standby_names.strip():
        return f"synchronous_standby_names = {standby_names!r}: is a synchronous standby down?"
    return "synchronous_standby_names is empty, so not a standby: check the server's disk and log"


def stalled_message(timeout: timedelta, cause: str) -> str:
    """What /readyz and the console say while commits stall."""
    return (
        "database: answers reads but is not accepting writes "
        f"(commits do not complete within {timeout.total_seconds():g} s; {cause})"
    )


def failed_message(exc: BaseException) -> str:
    """What /readyz says when the probe failed: the class only (the text may name hosts).

    >>> failed_message(psycopg.errors.ReadOnlySqlTransaction("read-only"))
    'database: refuses writes (ReadOnlySqlTransaction)'
    """
    mapped = translate(exc)
    if isinstance(exc, psycopg.Error) and mapped is exc:
        # The server answered with an error of its own: a standby in
        # recovery, a read-only transaction default, a revoked function.
        return f"database: refuses writes ({type(exc).__name__})"
    return f"database: not answering ({type(mapped).__name__})"


class WriteProbe:
    """Commits a tiny write on a connection of its own, one probe at a time.

    Its own connection, not the pool's: in a stall the pool's connections are
    the ones stuck in commits, and a probe waiting for one of them would
    report "no connection" rather than the stall. With ``keep_connection``
    the connection is opened on the first probe, kept for the next and
    replaced after any failure (call :meth:`close` when done); without, each
    probe opens and closes its own (for an owner with no shutdown of its own,
    such as the API's routes).

    >>> probe = WriteProbe(db)                      # doctest: +SKIP
    >>> (await probe.check()).is_writable           # doctest: +SKIP
    True
    """

    def __init__(
        self, db: Database, *, timeout: timedelta = WRITE_TIMEOUT, keep_connection: bool = True
    ) -> None:
        self.db = db
        self.timeout = timeout
        self.keep_connection = keep_connection
        # Held by check() for a whole probe, so probes never share the connection.
        self._lock = asyncio.Lock()
        self._conn: AsyncConn | None = None

    async def check(self) -> WriteCheck:
        """Probe once: writable, stalled (with the likely cause) or failed (with the error)."""
        async with self._lock:
            try:
                return await self._check()
            except Exception as exc:  # any failure is the finding; the reason goes to the log
                log.warning("write probe failed: %s: %s", type(exc).__name__, exc)
                await self._drop()
                return WriteCheck(WriteState.FAILED, failed_message(exc))
            finally:
                if not self.keep_connection:
                    await self._drop()

    async def close(self) -> None:
        async with self._lock:
            await self._drop()

    async def _check(self) -> WriteCheck:
        if self._conn is None or self._conn.closed:
            # Bounded like the write: a probe must answer in seconds, not
            # within the pool's deadline.
            async with asyncio.timeout(self.timeout.total_seconds()):
                self._conn = await self.db.connect(
                    application_name=f"{self.db.application_name}{PROBE_NAME_SUFFIX}"
                )
        conn = self._conn
        bound = (self.timeout + CANCEL_GRACE).total_seconds()
        with abandon_after(conn, bound):
            if await self._commit_within_timeout(conn):
                return WriteCheck(WriteState.WRITABLE)
            cause = stall_cause(await _standby_names(conn))
        log.debug("write probe: no commit within %g s", self.timeout.total_seconds())
        return WriteCheck(WriteState.STALLED, stalled_message(self.timeout, cause), cause)

    async def _commit_within_timeout(self, conn: AsyncConn) -> bool:
        """True when the probe's transaction committed within the timeout.

        On timeout psycopg sends the server a cancel request and waits for its
        answer: a commit waiting for a standby then ends (committed locally),
        a statement still running is cancelled and rolled back here.
        """
        try:
            async with asyncio.timeout(self.timeout.total_seconds()):
                await conn.execute("BEGIN")
                await conn.execute(EMIT_MESSAGE, (PROBE_PREFIX,))
                await conn.execute("COMMIT")
        except TimeoutError:
            await _end_transaction(conn)
            return False
        except psycopg.Error as exc:
            await _end_transaction(conn)
            if exc.sqlstate == QUERY_CANCELED:  # the server's own statement_timeout
                return False
            raise
        return True

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                await conn.close()


async def _end_transaction(conn: AsyncConn) -> None:
    """Roll back what a cancelled probe left open, so the connection is reusable."""
    if conn.info.transaction_status in (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR):
        await conn.execute("ROLLBACK")


async def _standby_names(conn: AsyncConn) -> str | None:
    """``synchronous_standby_names`` as the server has it (a read: it still answers)."""
    try:
        cur = await conn.execute(STANDBY_NAMES)
        row = await cur.fetchone()
    except psycopg.Error:
        return None
    return None if row is None else str(row[0])


class CachedWriteCheck:
    """A :class:`WriteProbe` whose answer is reused for ``max_age``, for callers polled often.

    Concurrent callers share the probe in flight: a burst of requests makes one
    write. Ages are measured on ``clock``.
    """

    def __init__(
        self,
        db: Database,
        *,
        clock: Clock = SYSTEM_CLOCK,
        max_age: timedelta = CHECK_MAX_AGE,
        timeout: timedelta = WRITE_TIMEOUT,
    ) -> None:
        self.probe = WriteProbe(db, timeout=timeout, keep_connection=False)
        self.clock = clock
        self.max_age_s = max_age.total_seconds()
        # Written by get() when a probe ends, read by the next get().
        self._last: tuple[float, WriteCheck] | None = None
        self._running: asyncio.Task[WriteCheck] | None = None

    async def get(self) -> WriteCheck:
        """The last answer while younger than ``max_age``, else a new probe's."""
        last = self._last
        if last is not None and self.clock.monotonic() - last[0] < self.max_age_s:
            return last[1]
        if self._running is None or self._running.done():
            self._running = asyncio.create_task(self._probe(), name="shoal-write-probe")
        # Shielded: a caller that gives up (a client hung up) must not cancel
        # the probe the others wait for.
        return await asyncio.shield(self._running)

    async def _probe(self) -> WriteCheck:
        check = await self.probe.check()
        self._last = (self.clock.monotonic(), check)
        return check

    async def close(self) -> None:
        if self._running is not None and not self._running.done():
            self._running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._running
        await self.probe.close()


class WriteStallWatch:
    """Logs one ERROR when a worker process's database stops completing commits.

    Every ``interval`` it probes (:class:`WriteProbe`). Once commits have
    stalled for ``error_after`` (from the first probe that stalled) it logs an
    ERROR naming the likely cause; nothing more while the stall lasts. When a
    probe commits again it logs that at INFO, and a later stall gets its own
    ERROR. A probe that fails outright (the server is gone) neither starts
    nor ends a stall: the lost connections are reported where they happen.
    """

    def __init__(
        self,
        db: Database,
        *,
        clock: Clock = SYSTEM_CLOCK,
        interval: timedelta = WATCH_INTERVAL,
        error_after: timedelta = STALL_ERROR_AFTER,
        timeout: timedelta = WRITE_TIMEOUT,
    ) -> None:
        self.probe = WriteProbe(db, timeout=timeout)
        self.clock = clock
        self.interval_s = interval.total_seconds()
        self.error_after_s = error_after.total_seconds()
        # Set and read by run_once() only: when the stall began, and whether
        # its ERROR is out.
        self.stalled_since: float | None = None
        self.reported = False

    async def run_once(self) -> WriteCheck:
        """Probe once, log an ERROR or a recovery when due, and return the finding."""
        started = self.clock.monotonic()
        check = await self.probe.check()
        if check.state is WriteState.STALLED:
            if self.stalled_since is None:
                self.stalled_since = started
            stalled_s = self.clock.monotonic() - self.stalled_since
            if not self.reported and stalled_s >= self.error_after_s:
                self.reported = True
                log.error(
                    "database writes have not completed for %.0f s: commits stall (%s)",
                    stalled_s,
                    check.cause,
                )
        elif check.state is WriteState.WRITABLE and self.stalled_since is not None:
            if self.reported:
                log.info(
                    "database writes complete again (stalled for %.0f s)",
                    self.clock.monotonic() - self.stalled_since,
                )
            self.stalled_since = None
            self.reported = False
        return check

    async def run(self) -> None:
        """Probe every ``interval`` until cancelled; the caller closes the watch.

        The first probe comes one interval after the start, not at it: a
        process that lives shorter (a drain, a command) then opens no probe
        connection and commits no probe: a server process and a WAL flush
        fewer (bench/queue_bench.py's drain child: 5 sessions, not 6). A
        stall is reported after ``error_after`` of stalled probes either way;
        a stall from the start, one interval later.
        """
        while True:
            await self.clock.sleep(self.interval_s)
            try:
                await self.run_once()
            except Exception:  # loop boundary: the watch must keep running
                log.exception("write stall watch failed")

    async def close(self) -> None:
        await self.probe.close()


__all__ = [
    "CHECK_MAX_AGE",
    "STALL_ERROR_AFTER",
    "WATCH_INTERVAL",
    "WRITE_TIMEOUT",
    "CachedWriteCheck",
    "WriteCheck",
    "WriteProbe",
    "WriteStallWatch",
    "WriteState",
]
