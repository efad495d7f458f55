"""Stream management: one file-backed stream per topic, created, checked and kept.

A topic ``card.ingest`` is the subject ``shoal.card.ingest``, stored in the
stream ``SHOAL_card_ingest`` (the prefix is configurable; characters a stream
name may not hold, here ``.``, become ``_``). A stream shoal finds is checked
before use (file storage, its subject, no async persist mode), and one made
without atomic publish gets it in place (:mod:`shoal.ingest.nats.publish`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import (
    DiscardPolicy,
    PersistMode,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamInfo,
)

from shoal.errors import Conflict, TransientError
from shoal.ingest.message import check_topic_name
from shoal.ingest.nats.connection import CONNECTION_ERRORS
from shoal.ingest.nats.durability import UnsafeDurability

log = logging.getLogger("shoal.ingest.nats")

SUBJECT_PREFIX = "shoal"
DEFAULT_STREAM_PREFIX = "SHOAL"
# Messages are kept this long whether consumed or not (JetStream "limits"
# retention; see Streams.config for why not "interest"). The backlog monitor
# alerts after 10 minutes of waiting, days before anything expires.
DEFAULT_MAX_AGE = timedelta(days=7)
STREAM_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def stream_name_for(prefix: str, topic: str) -> str:
    """``SHOAL`` + ``card.ingest`` -> ``SHOAL_card_ingest`` (``.`` is not allowed in a name)."""
    return f"{prefix}_{check_topic_name(topic).replace('.', '_')}"


def subject_for(topic: str) -> str:
    return f"{SUBJECT_PREFIX}.{check_topic_name(topic)}"


@dataclass(frozen=True, slots=True)
class Stream:
    """A topic's stream as this transport found it."""

    name: str
    atomic: bool  # allow_atomic is on: publish in atomic batches


class Streams:
    """The topics' streams one transport checked or created, by topic.

    ``jetstream`` gives the connection's JetStream context (raising
    :class:`~shoal.errors.TransientError` while there is none).
    """

    def __init__(
        self,
        jetstream: Callable[[], JetStreamContext],
        *,
        prefix: str,
        replicas: int,
        max_age: timedelta | None,
        allow_unsafe_sync: bool,
    ) -> None:
        self._jetstream = jetstream
        self._prefix = prefix
        self._replicas = replicas
        self._max_age = max_age
        self._allow_unsafe_sync = allow_unsafe_sync
        # Written under _lock (and dropped by forget when a stream's atomic
        # publish was turned off behind shoal's back), read without it.
        self._known: dict[str, Stream] = {}
        self._lock = asyncio.Lock()

    def forget(self, topic: str) -> None:
        """Check ``topic``'s stream again on its next use."""
        self._known.pop(topic, None)

    def clear(self) -> None:
        self._known.clear()

    def config(self, topic: str) -> StreamConfig:
        return StreamConfig(
            name=stream_name_for(self._prefix, topic),
            subjects=[subject_for(topic)],
            # "limits", not "interest": an interest stream with no consumer yet
            # drops every message as soon as it is stored (checked on 2.15),
            # while NSQ holds a topic's messages until a channel appears.
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            num_replicas=self._replicas,
            max_age=self._max_age.total_seconds() if self._max_age else None,
            # Past a size limit, refuse new messages (the publisher hears it)
            # rather than silently dropping the oldest.
            discard=DiscardPolicy.NEW,
            # Lets publish store a whole batch with one fsync (see publish).
            allow_atomic=True,
        )

    async def ensure(self, topic: str) -> Stream:
        """The topic's stream, created if missing, checked, with atomic publish enabled."""
        stream = self._known.get(topic)
        if stream is not None:
            return stream
        js = self._jetstream()
        config = self.config(topic)
        assert config.name is not None
        async with self._lock:
            stream = self._known.get(topic)
            if stream is not None:
                return stream
            try:
                try:
                    info = await js.stream_info(config.name)
                except nats.js.errors.NotFoundError:
                    try:
                        info = await js.add_stream(config)
                    except nats.js.errors.BadRequestError:
                        # Created meanwhile by another process, maybe differently:
                        # read what is there and judge that.
                        info = await js.stream_info(config.name)
                self._check(topic, info)
                if (info.config.num_replicas or 1) < self._replicas:
                    info = await self._add_replicas(info)
                atomic = info.config.allow_atomic is True or await self._enable_atomic(info)
            except CONNECTION_ERRORS as exc:
                raise TransientError(f"nats: stream {config.name}: {exc}") from exc
            stream = Stream(config.name, atomic)
            self._known[topic] = stream
            return stream

    async def _add_replicas(self, info: StreamInfo) -> StreamInfo:
        """Raise a stream's replicas to the configured number (made before a cluster had it).

        JetStream copies the messages to the new replicas in place; consumers
        and their positions stay. A stream with more replicas than configured
        is left as it is: fewer would weaken it behind its operator's back.
        When the server refuses, the stream goes on with what it has, and a
        WARNING says so.
        """
        js = self._jetstream()
        name = info.config.name
        try:
            updated = await js.update_stream(
                dataclasses.replace(info.config, num_replicas=self._replicas)
            )
        except nats.js.errors.APIError as exc:
            if isinstance(exc, CONNECTION_ERRORS):
                raise
            log.warning(
                "nats: stream %s has %s replica(s) and cannot get the configured %d (%s); it "
                "goes on with what it has",
                name,
                info.config.num_replicas or 1,
                self._replicas,
                exc,
            )
            return info
        log.info(
            "nats: stream %s raised from %s to %d replicas",
            name,
            info.config.num_replicas or 1,
            self._replicas,
        )
        return updated

    async def _enable_atomic(self, info: StreamInfo) -> bool:
        """Turn on atomic publish for a stream made without it (by a shoal before it used it).

        Only ``allow_atomic`` changes; messages, consumers and every other
        setting stay. False when the server refuses or ignores it (a server
        older than 2.12, a stream in async persist mode, no permission to
        update streams): the topic is then published one message at a time.
        """
        js = self._jetstream()
        name = info.config.name
        try:
            updated = await js.update_stream(dataclasses.replace(info.config, allow_atomic=True))
        except nats.js.errors.APIError as exc:
            if isinstance(exc, CONNECTION_ERRORS):
                raise
            log.warning(
                "nats: stream %s has no atomic publish and cannot get it (%s); its topic is "
                "published one message at a time, which is slower but as safe",
                name,
                exc,
            )
            return False
        if updated.config.allow_atomic is not True:
            log.warning(
                "nats: the server ignored allow_atomic for stream %s (nats-server < 2.12?); its "
                "topic is published one message at a time, which is slower but as safe",
                name,
            )
            return False
        log.info("nats: enabled atomic batch publish on existing stream %s", name)
        return True

    def _check(self, topic: str, info: StreamInfo) -> None:
        name = info.config.name
        storage = info.config.storage
        if storage != StorageType.FILE:
            raise Conflict(
                f"nats stream {name} (topic {topic!r}) uses {storage} storage; shoal needs "
                "file storage, which survives a server restart. Move its messages and recreate "
                "it with file storage, or choose another stream_prefix"
            )
        subject = subject_for(topic)
        subjects = info.config.subjects or []
        if subject not in subjects:
            raise Conflict(
                f"nats stream {name} carries {subjects}, not {subject!r}: another topic maps to "
                f"the same stream name as {topic!r} ('.' and '_' both become '_'); rename one"
            )
        if info.config.persist_mode == PersistMode.ASYNC:
            # ADR-56: the PubAck goes out before the write is flushed, whatever
            # sync_interval says: the hole sync_interval: always closes.
            message = (
                f"nats stream {name} (topic {topic!r}) has persist_mode 'async': it acknowledges "
                "messages before they are on disk, so a crash can lose them. Set it back to "
                "'default'"
            )
            if not self._allow_unsafe_sync:
                raise UnsafeDurability(message + ", or pass allow_unsafe_sync=True")
            log.error("%s; going on because allow_unsafe_sync=True", message)
