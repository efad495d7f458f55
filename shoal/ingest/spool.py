"""``Spool``: messages a producer accepted while neither the database nor the broker took them.

``Pipeline.submit`` applies a message in place or publishes it. When both
fail for longer than a short bound (the database overloaded or down, the
broker down), the message is written here, on the producer's local disk,
and fsynced before ``submit`` returns ``route="spooled"``. The pipeline's
replayer hands spooled messages on once a path works again and removes each
only after that succeeded. Nothing a producer accepted depends on the
producer's memory.

On disk, a spool is a directory holding one SQLite database (the standard
library's ``sqlite3``) in WAL mode::

    spool.db       one row per waiting message, in the order they were spooled
    spool.db-wal   SQLite's write-ahead log, while the spool is open

A put is a transaction committed with ``synchronous=FULL``: the log is
fsynced before ``put`` returns. A remove is committed with
``synchronous=NORMAL``, not fsynced: if it is lost in a crash of the machine,
the message is handed on again, and the done-marker (or the transport's
duplicate window) absorbs the replay. A process killed outright loses
neither (its writes are in the kernel's page cache).

Crash safety is SQLite's: a crash in the middle of a commit leaves a torn
tail in the write-ahead log, and SQLite's recovery, at the next open, keeps
every transaction whose frames and checksums hold and drops the torn one.
That one was never fsynced, so no ``submit`` returned for it.

One process at a time: the database is opened with ``locking_mode=EXCLUSIVE``
and locked at ``open``; a second ``open`` on the directory, from this process
or another, fails with ``Conflict``. Rows are deleted as their messages are
handed on; when the spool empties, the file gives its free pages back and
the log is truncated.

Until this, the spool was segment files of CRC-32-framed records under a
flock, written by hand; bench/spool_bench.py measures both (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Literal

from shoal.clock import Clock
from shoal.errors import Conflict, InvalidInput
from shoal.ingest.message import Envelope

log = logging.getLogger("shoal.ingest")

DATABASE = "spool.db"
# Past this many bytes of waiting messages, submit holds the producer instead
# of spooling more, and Pipeline.admit says to take no new work (backpressure).
DEFAULT_SPOOL_MAX_BYTES = 256 * 1024 * 1024
# SQLite's write-ahead log is checkpointed into the database every 1000 pages
# (its default) and cut back to this size after a checkpoint, so a long
# outage leaves neither a large log nor, once the spool empties, a large file.
WAL_LIMIT_BYTES = 4 * 1024 * 1024
# What ``reason`` keeps of the paths' last error.
REASON_CHARS = 500

# One b-tree, no index: a put writes one page of the log (an index on id,
# or AUTOINCREMENT's sqlite_sequence, would add a page to every commit; the
# bench measured 0.75x the puts per second with both). Rows are found by
# seq, which the in-memory entries hold; seq is the largest so far plus one,
# so it grows with every put while rows remain.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS message (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL,
    topic TEXT NOT NULL,
    envelope TEXT NOT NULL,
    mode TEXT CHECK (mode IN ('sync', 'async')),
    spooled_at TEXT NOT NULL,
    reason TEXT NOT NULL,
    rounds INTEGER NOT NULL
)
"""
_PUT = (
    "INSERT INTO message (id, topic, envelope, mode, spooled_at, reason, rounds)"
    " VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING seq"
)
_REMOVE = "DELETE FROM message WHERE seq = ?"
_ALL = "SELECT seq, id, topic, envelope, mode, spooled_at, reason, rounds FROM message ORDER BY seq"

Mode = Literal["sync", "async"]


@dataclass(frozen=True, slots=True)
class SpoolEntry:
    """One spooled message: what ``submit`` was given, and when and why it was spooled."""

    topic: str
    envelope: Envelope
    mode: Mode | None  # submit's per-message override (None: the configured mode)
    spooled_at: datetime
    reason: str  # the last error of the paths, as text
    rounds: int  # submit's tries of both paths before spooling
    size: int  # bytes of its row's values (topic, envelope, reason)
    seq: int  # its place in the spool, oldest first (0 until written)


@dataclass(frozen=True, slots=True)
class SpoolStats:
    """How much is waiting in the spool (for logs, the poller and tests)."""

    messages: int
    bytes: int
    oldest_age: timedelta | None  # now minus spooled_at of the oldest waiting message
    max_bytes: int

    @property
    def full(self) -> bool:
        return self.bytes >= self.max_bytes


@dataclass(frozen=True, slots=True)
class _Put:
    entry: SpoolEntry
    envelope: str  # the encoded envelope, as stored


@dataclass(frozen=True, slots=True)
class _Remove:
    seqs: tuple[int, ...]  # the rows of messages handed on, or of a replaced put


def _size(topic: str, envelope: str, reason: str) -> int:
    return len(topic.encode()) + len(envelope.encode()) + len(reason.encode())


class Spool:
    """A SQLite database of waiting messages in ``directory``; one process at a time.

    >>> spool = await Spool(Path("/var/lib/app/spool"), clock=clock).open()  # doctest: +SKIP
    >>> await spool.put("readings", envelope, mode=None, reason="...", rounds=3)  # doctest: +SKIP
    >>> [e.envelope.id for e in spool.entries()]                    # oldest first  # doctest: +SKIP
    >>> await spool.remove([envelope.id])                           # doctest: +SKIP

    ``put`` returns once the message is on disk (fsynced). ``remove`` is
    idempotent. Safe for many tasks of one event loop; database calls run in
    a thread, one at a time, and concurrent puts share one transaction (and
    one fsync).
    """

    def __init__(
        self, directory: Path, *, clock: Clock, max_bytes: int = DEFAULT_SPOOL_MAX_BYTES
    ) -> None:
        if max_bytes < 1:
            raise InvalidInput("spool_max_bytes", f"{max_bytes}: must be at least 1")
        self.directory = Path(directory)
        self.clock = clock
        self.max_bytes = max_bytes
        # Waiting messages by id, oldest first: the database's rows, kept in
        # memory so that entries() and stats() need no disk. Written by put
        # (once its row is committed, by the flusher) and remove; read by the
        # replayer and stats.
        self._live: dict[str, SpoolEntry] = {}
        self._live_bytes = 0
        # Only the flusher's thread (and open and close, which no flush overlaps) use it.
        self._db: sqlite3.Connection | None = None
        # Pending writes, in order, each with the future its caller awaits
        # (None for the removal of a replaced put's row, which nobody awaits).
        self._pending: list[tuple[_Put | _Remove, asyncio.Future[None] | None]] = []
        self._flusher: asyncio.Task[None] | None = None
        # Set whenever a put registers; the replayer waits on it while the spool is empty.
        self.changed = asyncio.Event()

    # -- opening -------------------------------------------------------------

    async def open(self) -> Spool:
        """Lock the database (creating it) and read what an earlier process left."""
        await asyncio.to_thread(self._open_sync)
        if self._live:
            stats = self.stats()
            log.warning(
                "spool %s: %d messages (%d bytes) left by an earlier process; replaying them",
                self.directory,
                stats.messages,
                stats.bytes,
            )
            self.changed.set()
        return self

    def _open_sync(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        segments = sorted(p.name for p in self.directory.glob("spool-*.log"))
        if segments:
            # The segment files of the spool before this one (development
            # builds of 0.2.0): their messages would be ignored, never lost
            # silently. Refused until they are handed on by the build that
            # wrote them, or moved away.
            raise InvalidInput(
                "spool_dir",
                f"{self.directory} holds {len(segments)} segment file(s) of an earlier spool "
                f"format ({segments[0]}, ...) that this version does not read: run the build "
                "that wrote them until its spool is empty, or move them away",
            )
        path = self.directory / DATABASE
        created = not path.exists()
        crashed = (self.directory / f"{DATABASE}-wal").exists()
        # timeout=0: a spool held by another process is refused at once, not waited for.
        db = sqlite3.connect(path, timeout=0, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA locking_mode = EXCLUSIVE")
            if db.execute("PRAGMA journal_mode = WAL").fetchone()[0] != "wal":
                raise OSError(f"spool {path}: SQLite refused WAL mode")
            db.execute("PRAGMA synchronous = FULL")
            db.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}")
            # Takes the exclusive lock, held until close (locking_mode above).
            db.execute("BEGIN IMMEDIATE")
            db.execute(_SCHEMA)
            db.execute("COMMIT")
            rows = db.execute(_ALL).fetchall()
        except sqlite3.OperationalError as exc:
            db.close()
            if "locked" in str(exc):
                raise Conflict(f"spool {self.directory} is in use by another process") from None
            raise OSError(f"spool {path}: {exc}") from exc
        except BaseException:
            db.close()
            raise
        if created:
            self._fsync_directory()  # the new file's name survives a power loss too
        self._db = db
        if crashed:
            log.warning(
                "spool %s: left by a process that did not close it; SQLite's recovery kept "
                "every committed write and dropped any the crash cut short (never confirmed "
                "to a producer)",
                path,
            )
        replaced: list[int] = []
        for seq, _id, topic, envelope, mode, spooled_at, reason, rounds in rows:
            old = self._register(
                SpoolEntry(
                    topic=topic,
                    envelope=Envelope.decode(envelope),
                    mode=mode,
                    spooled_at=datetime.fromisoformat(spooled_at),
                    reason=reason,
                    rounds=rounds,
                    size=_size(topic, envelope, reason),
                    seq=seq,
                )
            )
            if old is not None:
                replaced.append(old.seq)
        if replaced:  # ids put again whose earlier rows a crash kept from being deleted
            self._commit_sync([_Remove(tuple(replaced))])

    def _fsync_directory(self) -> None:
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    # -- state ----------------------------------------------------------------

    def _register(self, entry: SpoolEntry) -> SpoolEntry | None:
        """Add ``entry``; the entry it replaced (a second put of one id replaces the first)."""
        replaced = self._unregister(entry.envelope.id)
        self._live[entry.envelope.id] = entry
        self._live_bytes += entry.size
        return replaced

    def _unregister(self, message_id: str) -> SpoolEntry | None:
        entry = self._live.pop(message_id, None)
        if entry is not None:
            self._live_bytes -= entry.size
        return entry

    def entries(self, limit: int | None = None) -> list[SpoolEntry]:
        """Waiting messages, oldest first."""
        entries = list(self._live.values())
        return entries if limit is None else entries[:limit]

    def __len__(self) -> int:
        return len(self._live)

    def stats(self) -> SpoolStats:
        oldest = next(iter(self._live.values()), None)
        return SpoolStats(
            messages=len(self._live),
            bytes=self._live_bytes,
            oldest_age=None if oldest is None else self.clock.now() - oldest.spooled_at,
            max_bytes=self.max_bytes,
        )

    @property
    def full(self) -> bool:
        return self._live_bytes >= self.max_bytes

    # -- writing ----------------------------------------------------------------

    async def put(
        self, topic: str, envelope: Envelope, *, mode: Mode | None, reason: str, rounds: int
    ) -> SpoolEntry:
        """Write one message and fsync it; it is waiting in the spool when this returns.

        Raises ``OSError`` when the disk refuses (full, read-only): then the
        message is not spooled and the caller still holds it.
        """
        encoded = envelope.encode().decode()
        reason = reason[:REASON_CHARS]
        entry = SpoolEntry(
            topic=topic,
            envelope=envelope,
            mode=mode,
            spooled_at=self.clock.now(),
            reason=reason,
            rounds=rounds,
            size=_size(topic, encoded, reason),
            seq=0,  # set by the flusher to the row's seq
        )
        await self._write(_Put(entry, encoded))
        return self._live.get(envelope.id, entry)

    async def remove(self, ids: Sequence[str]) -> int:
        """Mark messages handed on; how many were waiting. Not fsynced (see the module)."""
        removed = [entry for i in ids if (entry := self._unregister(i)) is not None]
        if removed:
            await self._write(_Remove(tuple(e.seq for e in removed)))
        return len(removed)

    async def _write(self, op: _Put | _Remove) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((op, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        # Shielded: a cancelled producer does not cancel a write others share.
        await asyncio.shield(future)

    async def _flush(self) -> None:
        """Write pending operations in order, one transaction (and at most one fsync) per batch."""
        while self._pending:
            batch, self._pending = self._pending, []
            ops = [op for op, _ in batch]
            try:
                seqs = await asyncio.to_thread(self._commit_sync, ops)
            except BaseException as exc:
                log.error("spool %s: write failed: %s", self.directory, exc)
                error = exc if isinstance(exc, Exception) else OSError(exc)
                for _, future in batch:
                    if future is not None and not future.done():
                        future.set_exception(error)
                continue
            replaced: list[int] = []
            for (op, future), seq in zip(batch, seqs, strict=True):
                if isinstance(op, _Put):
                    old = self._register(dataclasses.replace(op.entry, seq=seq))
                    if old is not None and old.seq:
                        replaced.append(old.seq)
                    self.changed.set()
                if future is not None and not future.done():
                    future.set_result(None)
            if replaced:  # the earlier rows of ids put again go with the next batch
                self._pending.append((_Remove(tuple(replaced)), None))
            if not self._live:
                try:
                    await asyncio.to_thread(self._shrink_sync)
                except (OSError, sqlite3.Error) as exc:  # the file stays larger; nothing lost
                    log.warning(
                        "spool %s: could not shrink the empty spool: %s", self.directory, exc
                    )

    def _commit_sync(self, ops: Sequence[_Put | _Remove]) -> list[int]:
        """One transaction for ``ops``; each put's seq (0 for a remove)."""
        db = self._db
        if db is None:
            raise OSError(f"spool {self.directory} is not open")
        # FULL fsyncs the log at this commit (a put must be on disk when put
        # returns); NORMAL leaves a remove-only commit to the next fsync.
        sync = "FULL" if any(isinstance(op, _Put) for op in ops) else "NORMAL"
        db.execute(f"PRAGMA synchronous = {sync}")
        seqs: list[int] = []
        try:
            db.execute("BEGIN IMMEDIATE")
            for op in ops:
                if isinstance(op, _Put):
                    e = op.entry
                    row = db.execute(
                        _PUT,
                        (
                            e.envelope.id,
                            e.topic,
                            op.envelope,
                            e.mode,
                            e.spooled_at.isoformat(),
                            e.reason,
                            e.rounds,
                        ),
                    ).fetchone()
                    seqs.append(int(row[0]))
                else:
                    db.executemany(_REMOVE, [(seq,) for seq in op.seqs])
                    seqs.append(0)
            db.execute("COMMIT")
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise OSError(f"spool {self.directory}: {exc}") from exc
            raise
        return seqs

    def _shrink_sync(self) -> None:
        """The spool emptied: give the file's free pages back and cut the log to nothing."""
        if self._db is not None:
            self._db.execute("VACUUM")  # of an empty table: a rewrite of nothing
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    # -- closing ----------------------------------------------------------------

    async def close(self) -> None:
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)
        await asyncio.to_thread(self._close_sync)

    def _close_sync(self) -> None:
        if self._db is not None:
            self._db.close()  # checkpoints, removes the log and releases the lock
            self._db = None


def spool_stats_line(stats: SpoolStats) -> str:
    age = "-" if stats.oldest_age is None else f"{stats.oldest_age.total_seconds():.1f} s"
    return f"{stats.messages} messages, {stats.bytes} bytes, oldest {age}"
