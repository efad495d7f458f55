"""What travels on a topic: an envelope with an id, a publish time and a body.

Both transports carry the same JSON envelope, so a message can move from one
to the other (a redrive, a switch of transport) unchanged::

    {"id": "0b1f...", "published_at": "2026-11-30T08:00:00.000000+00:00", "body": {...}}

The attempt count is not in the envelope: each transport knows how many times
it has delivered a message (the job's attempt, JetStream's ``num_delivered``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from shoal.errors import InvalidInput

T = TypeVar("T")

# A message body is kept small: the reference truncates gateway payloads to
# 4 KB before publishing; a whole envelope must fit well inside this.
MAX_ENVELOPE_BYTES = 256 * 1024
_UNSET: Any = object()


class Envelope:
    """A message as the transports see it.

    The body is kept in whichever form it arrived (JSON text from a producer,
    a parsed value from a delivery) and converted at most once, when the
    other form is asked for: a consumer parses each delivery once.
    """

    __slots__ = ("_body", "_body_json", "id", "published_at")

    def __init__(
        self,
        id: str,
        published_at: datetime,
        body_json: str | None = None,
        *,
        body: Any = _UNSET,
    ) -> None:
        if body_json is None and body is _UNSET:
            raise TypeError("an envelope needs body_json or body")
        self.id = id
        self.published_at = published_at
        self._body_json = body_json
        self._body = body

    @property
    def body_json(self) -> str:
        if self._body_json is None:
            self._body_json = json.dumps(self._body, separators=(",", ":"))
        return self._body_json

    @property
    def body(self) -> Any:
        if self._body is _UNSET:
            self._body = json.loads(self.body_json)
        return self._body

    def encode(self) -> bytes:
        text = (
            '{"id":'
            + json.dumps(self.id)
            + ',"published_at":'
            + json.dumps(self.published_at.isoformat())
            + ',"body":'
            + self.body_json
            + "}"
        )
        return text.encode()

    @classmethod
    def decode(cls, raw: bytes | str) -> Envelope:
        doc = json.loads(raw)
        if not isinstance(doc, dict) or not {"id", "published_at", "body"} <= doc.keys():
            raise InvalidInput("message", "not a shoal envelope (needs id, published_at, body)")
        return cls(
            id=str(doc["id"]),
            published_at=datetime.fromisoformat(doc["published_at"]),
            body=doc["body"],
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Envelope):
            return NotImplemented
        return (self.id, self.published_at, self.body) == (other.id, other.published_at, other.body)

    def __hash__(self) -> int:
        return hash((self.id, self.published_at))

    def __repr__(self) -> str:
        return f"Envelope(id={self.id!r}, published_at={self.published_at.isoformat()!r})"


def new_envelope(body: Any, *, published_at: datetime, id: str | None = None) -> Envelope:
    """Wrap a JSON-serialisable body; ``id`` defaults to a random UUID."""
    try:
        body_json = json.dumps(body, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInput("body", f"not JSON-serialisable: {exc}") from exc
    if "\\u0000" in body_json:
        raise InvalidInput("body", "strings may not contain NUL characters")
    envelope = Envelope(id=id or str(uuid.uuid4()), published_at=published_at, body_json=body_json)
    if id is not None and (not id or len(id) > 200 or "\x00" in id):
        raise InvalidInput("id", "a message id is 1-200 characters, without NUL")
    if len(body_json) > MAX_ENVELOPE_BYTES:
        raise InvalidInput(
            "body", f"{len(body_json)} bytes, over the {MAX_ENVELOPE_BYTES}-byte cap"
        )
    return envelope


@dataclass(frozen=True, slots=True)
class Message(Generic[T]):
    """A delivered message as a consumer sees it. ``attempt`` is 1 on the first delivery."""

    id: str
    topic: str
    body: T
    published_at: datetime
    attempt: int


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True, slots=True)
class Topic(Generic[T]):
    """A named stream and how its bodies map to and from JSON.

    >>> readings = Topic("card.ingest", decode=Reading.from_json, encode=Reading.to_json)
    ... # doctest: +SKIP
    """

    name: str
    decode: Callable[[Any], T] = _same
    encode: Callable[[T], Any] = _same

    def __post_init__(self) -> None:
        check_topic_name(self.name)


TOPIC_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def check_topic_name(name: str) -> str:
    """Topic names are 1-100 of ``[A-Za-z0-9._-]``, valid as a queue and a JetStream subject."""
    if not isinstance(name, str) or not 1 <= len(name) <= 100 or not set(name) <= TOPIC_NAME_CHARS:
        raise InvalidInput("topic", f"{name!r}: use 1-100 of A-Z a-z 0-9 . _ -")
    if name.startswith(".") or name.endswith(".") or ".." in name:
        raise InvalidInput("topic", f"{name!r}: dots separate non-empty parts")
    return name


def check_group_name(name: str) -> str:
    """Consumer group names follow the topic rules (a JetStream durable is named for its group)."""
    try:
        return check_topic_name(name)
    except InvalidInput:
        raise InvalidInput("group", f"{name!r}: use 1-100 of A-Z a-z 0-9 . _ -") from None
