"""``Spool``: messages a producer accepted while neither the database nor the broker took them.

``Pipeline.submit`` applies a message in place or publishes it. When both
fail for longer than a short bound (the database overloaded or down, the
broker down), the message is appended here, on the producer's local disk,
and fsynced before ``submit`` returns ``route="spooled"``. The pipeline's
replayer hands spooled messages on once a path works again and removes each
only after that succeeded. Nothing a producer accepted depends on the
producer's memory.

On disk, a spool is a directory::

    lock                     flock: one process per spool
    spool-000000000001.log   segments, appended to, never rewritten
    spool-000000000002.log

A segment is a sequence of records, each ``b"SPL1"``, the payload's length
and its CRC-32 (big-endian unsigned 32-bit each), then the payload (JSON):
``{"op": "put", ...}`` for a spooled message, ``{"op": "done", "id": ...}``
once it was handed on. A put is fsynced before it counts; a done record is
not: if it is lost in a crash, the message is handed on again, and the
done-marker (or the transport's duplicate window) absorbs the replay.

Crash safety:

- A crash in the middle of an append leaves a torn record at the end of the
  segment being written. Reading stops at the first record whose header,
  length or checksum does not hold, with a WARN; that record was never
  fsynced, so no ``submit`` returned for it. A failed write is truncated
  away and the next write starts a new segment, so a torn record is always
  a segment's last.
- A process appends only to segments it created; an existing spool's
  segments are read at start and deleted once every message in them (and
  in every older segment) is done. Segments go oldest first, so the put a
  done record cancels is always deleted with it or before it, never after.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import re
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from shoal.clock import Clock
from shoal.errors import Conflict, InvalidInput
from shoal.ingest.message import Envelope

log = logging.getLogger("shoal.ingest")

MAGIC = b"SPL1"
HEADER = struct.Struct(">4sII")  # magic, payload length, CRC-32 of the payload
# A payload larger than this is not a record of ours: the header is garbage.
MAX_RECORD_BYTES = 16 * 1024 * 1024
# A segment is closed and a new one started past this size, so segments whose
# messages were all handed on can be deleted while others are still waiting.
DEFAULT_SEGMENT_BYTES = 8 * 1024 * 1024
# Past this many bytes of waiting messages, submit holds the producer instead
# of spooling more, and Pipeline.admit says to take no new work (backpressure).
DEFAULT_SPOOL_MAX_BYTES = 256 * 1024 * 1024
_SEGMENT_NAME = re.compile(r"^spool-(\d{12})\.log$")

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
    size: int  # bytes of its record on disk
    segment: int


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


def encode_record(payload: dict[str, Any]) -> bytes:
    data = json.dumps(payload, separators=(",", ":")).encode()
    return HEADER.pack(MAGIC, len(data), zlib.crc32(data)) + data


def read_records(data: bytes) -> tuple[list[dict[str, Any]], int]:
    """The intact records at the start of ``data``, and the offset where they end.

    The first record whose header, length or checksum does not hold ends the
    read: it is a torn tail (see the module docstring).
    """
    records: list[dict[str, Any]] = []
    offset = 0
    while offset + HEADER.size <= len(data):
        magic, length, crc = HEADER.unpack_from(data, offset)
        start = offset + HEADER.size
        if magic != MAGIC or length > MAX_RECORD_BYTES or start + length > len(data):
            break
        payload = data[start : start + length]
        if zlib.crc32(payload) != crc:
            break
        try:
            record = json.loads(payload)
        except ValueError:
            break
        if not isinstance(record, dict):
            break
        records.append(record)
        offset = start + length
    return records, offset


class Spool:
    """A directory of append-only, checksummed segments; one process at a time.

    >>> spool = await Spool(Path("/var/lib/app/spool"), clock=clock).open()  # doctest: +SKIP
    >>> await spool.put("readings", envelope, mode=None, reason="...", rounds=3)  # doctest: +SKIP
    >>> [e.envelope.id for e in spool.entries()]                    # oldest first  # doctest: +SKIP
    >>> await spool.remove([envelope.id])                           # doctest: +SKIP

    ``put`` returns once the message is on disk (fsynced). ``remove`` is
    idempotent. Safe for many tasks of one event loop; file I/O runs in a
    thread, one operation at a time, and concurrent puts share one fsync.
    """

    def __init__(
        self,
        directory: Path,
        *,
        clock: Clock,
        max_bytes: int = DEFAULT_SPOOL_MAX_BYTES,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    ) -> None:
        if max_bytes < 1:
            raise InvalidInput("spool_max_bytes", f"{max_bytes}: must be at least 1")
        if segment_bytes < 1:
            raise InvalidInput("segment_bytes", f"{segment_bytes}: must be at least 1")
        self.directory = Path(directory)
        self.clock = clock
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        # Waiting messages by id, oldest first. Written by put (once its record is
        # fsynced, by the flusher) and remove; read by the replayer and stats.
        self._live: dict[str, SpoolEntry] = {}
        self._live_bytes = 0
        # Segment number -> waiting messages in it; every segment on disk has a key.
        self._segment_live: dict[int, int] = {}
        # The segment being appended to (this process's), its file and size; only
        # the flusher's thread touches the file.
        self._segment = 0
        self._fd: int | None = None
        self._segment_size = 0
        self._lock_fd: int | None = None
        # Pending writes, in order: (record bytes, fsync?, entry to register, future).
        self._pending: list[tuple[bytes, bool, SpoolEntry | None, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None
        # Set whenever a put registers; the replayer waits on it while the spool is empty.
        self.changed = asyncio.Event()

    # -- opening -------------------------------------------------------------

    async def open(self) -> Spool:
        """Take the directory's lock and read what an earlier process left."""
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
        lock_fd = os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise Conflict(f"spool {self.directory} is in use by another process") from None
        self._lock_fd = lock_fd
        segments = sorted(
            int(m.group(1)) for p in self.directory.iterdir() if (m := _SEGMENT_NAME.match(p.name))
        )
        for number in segments:
            self._segment_live[number] = 0
            path = self._path(number)
            data = path.read_bytes()
            records, end = read_records(data)
            if end < len(data):
                log.warning(
                    "spool %s: torn record at byte %d (%d bytes) skipped: a write the crash "
                    "interrupted, never confirmed to a producer",
                    path,
                    end,
                    len(data) - end,
                )
            for record in records:
                self._apply_record(record, number)
        self._segment = segments[-1] if segments else 0
        self._collect_sync(self._deletable())

    def _apply_record(self, record: dict[str, Any], segment: int) -> None:
        op = record.get("op")
        if op == "put":
            entry = SpoolEntry(
                topic=str(record["topic"]),
                envelope=Envelope.decode(record["envelope"]),
                mode=record.get("mode"),
                spooled_at=datetime.fromisoformat(record["spooled_at"]),
                reason=str(record.get("reason", "")),
                rounds=int(record.get("rounds", 1)),
                size=len(encode_record(record)),
                segment=segment,
            )
            self._register(entry)
        elif op == "done":
            self._unregister(str(record["id"]))

    def _path(self, segment: int) -> Path:
        return self.directory / f"spool-{segment:012d}.log"

    # -- state ----------------------------------------------------------------

    def _register(self, entry: SpoolEntry) -> None:
        self._unregister(entry.envelope.id)  # a second put of one id replaces the first
        self._live[entry.envelope.id] = entry
        self._live_bytes += entry.size
        self._segment_live[entry.segment] = self._segment_live.get(entry.segment, 0) + 1

    def _unregister(self, message_id: str) -> bool:
        entry = self._live.pop(message_id, None)
        if entry is None:
            return False
        self._live_bytes -= entry.size
        self._segment_live[entry.segment] -= 1
        return True

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
        """Append one message and fsync it; it is waiting in the spool when this returns.

        Raises ``OSError`` when the disk refuses (full, read-only): then the
        message is not spooled and the caller still holds it.
        """
        spooled_at = self.clock.now()
        record: dict[str, Any] = {
            "op": "put",
            "topic": topic,
            "envelope": envelope.encode().decode(),
            "mode": mode,
            "spooled_at": spooled_at.isoformat(),
            "reason": reason[:500],
            "rounds": rounds,
        }
        data = encode_record(record)
        entry = SpoolEntry(
            topic=topic,
            envelope=envelope,
            mode=mode,
            spooled_at=spooled_at,
            reason=reason[:500],
            rounds=rounds,
            size=len(data),
            segment=0,  # set by the flusher to the segment the record landed in
        )
        await self._write(data, sync=True, entry=entry)
        return self._live.get(envelope.id, entry)

    async def remove(self, ids: Sequence[str]) -> int:
        """Mark messages handed on; how many were waiting. Not fsynced (see the module)."""
        removed = [i for i in ids if self._unregister(i)]
        if removed:
            data = b"".join(encode_record({"op": "done", "id": i}) for i in removed)
            await self._write(data, sync=False, entry=None)
        return len(removed)

    async def _write(self, data: bytes, *, sync: bool, entry: SpoolEntry | None) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((data, sync, entry, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        # Shielded: a cancelled producer does not cancel a write others share.
        await asyncio.shield(future)

    async def _flush(self) -> None:
        """Write pending records in order, one thread call (and at most one fsync) per batch."""
        while self._pending:
            batch, self._pending = self._pending, []
            data = b"".join(d for d, _, _, _ in batch)
            sync = any(s for _, s, _, _ in batch)
            try:
                segment = await asyncio.to_thread(self._append_sync, data, sync)
            except BaseException as exc:
                log.error("spool %s: write failed: %s", self.directory, exc)
                for _, _, _, future in batch:
                    if not future.done():
                        future.set_exception(exc if isinstance(exc, Exception) else OSError(exc))
                continue
            for _, _, entry, future in batch:
                if entry is not None:
                    self._register(dataclasses.replace(entry, segment=segment))
                    self.changed.set()
                if not future.done():
                    future.set_result(None)
            deletable = self._deletable()
            if deletable:
                with contextlib.suppress(OSError):
                    await asyncio.to_thread(self._collect_sync, deletable)

    def _append_sync(self, data: bytes, sync: bool) -> int:
        if self._fd is None:
            self._segment += 1
            self._segment_live.setdefault(self._segment, 0)
            self._fd = os.open(
                self._path(self._segment), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
            )
            self._segment_size = 0
            self._fsync_directory()
        fd = self._fd
        start = self._segment_size
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if sync:
                os.fsync(fd)
        except BaseException:
            # Cut the partial write off and start a new segment: a torn record
            # stays a segment's last, so reading never stops before a good one.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            with contextlib.suppress(OSError):
                os.close(fd)
            self._fd = None
            raise
        self._segment_size = start + len(data)
        segment = self._segment
        if self._segment_size >= self.segment_bytes:
            os.close(fd)
            self._fd = None
        return segment

    def _fsync_directory(self) -> None:
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def _deletable(self) -> list[int]:
        """The oldest segments with nothing waiting in them, in order.

        The segment being written goes only when the whole spool is empty: it
        may hold done records of older segments' messages.
        """
        out: list[int] = []
        for number in sorted(self._segment_live):
            if self._segment_live[number] > 0:
                break
            if number == self._segment and self._fd is not None and self._live:
                break
            out.append(number)
        return out

    def _collect_sync(self, segments: Sequence[int]) -> None:
        for number in segments:
            if number == self._segment and self._fd is not None:
                os.close(self._fd)
                self._fd = None
            with contextlib.suppress(FileNotFoundError):
                self._path(number).unlink()
            self._segment_live.pop(number, None)

    # -- closing ----------------------------------------------------------------

    async def close(self) -> None:
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)
        await asyncio.to_thread(self._close_sync)

    def _close_sync(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None


def spool_stats_line(stats: SpoolStats) -> str:
    age = "-" if stats.oldest_age is None else f"{stats.oldest_age.total_seconds():.1f} s"
    return f"{stats.messages} messages, {stats.bytes} bytes, oldest {age}"
