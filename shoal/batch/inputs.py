"""A create request's inputs, checked and fingerprinted before anything is written.

:func:`parse_items` is the one check of a task's item list (the HTTP
contract's limits come from here too); :func:`request_hash` is the
fingerprint an idempotency key is matched against.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from shoal.errors import InvalidInput
from shoal.queue.limits import partition_key_of
from shoal.queue.options import encode_payload, shown

MAX_REF_LENGTH = 512
# What an item given as a mapping may hold.
ITEM_FIELDS = frozenset({"ref", "data", "partition_key"})
MAX_KEY_LENGTH = 255
# The longest deadline a task may ask for.
MAX_DEADLINE_S = 10 * 365 * 86400


@dataclass(frozen=True, slots=True)
class ParsedItems:
    """A task's items, validated: refs in input order and each item's data as JSON text.

    ``data`` holds None for an item without data (JSON null), and is empty
    when no item has any: the common ``["doc-1", "doc-2", ...]`` costs no
    per-item encoding. ``partition_keys`` holds the key each item named
    (None: none), and is empty when none named one.
    """

    refs: list[str]
    data: list[str | None]
    partition_keys: list[str | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.refs)


def parse_items(items: object, *, max_items: int, max_payload_bytes: int) -> ParsedItems:
    """``[ref | {"ref", "data", "partition_key"}]`` validated; InvalidInput names the bad entry.

    The one check that a task's refs are unique: the item table has no unique
    index on them (see 0002_batch.sql), and create is its only writer.
    """
    if not isinstance(items, Sequence) or isinstance(items, str | bytes):
        raise InvalidInput("items", "must be a list of refs or {ref, data} objects")
    if not items:
        raise InvalidInput("items", "is empty: a task needs at least one item")
    if len(items) > max_items:
        raise InvalidInput("items", f"has {len(items)} entries, over the cap of {max_items}")
    refs: list[str] = []
    data: list[str | None] = []
    keys: list[str | None] = []
    seen: set[str] = set()
    any_data = any_key = False
    for i, entry in enumerate(items):
        text: str | None = None
        key: object = None
        if isinstance(entry, str):
            ref: object = entry
        elif isinstance(entry, Mapping):
            unknown = set(entry) - ITEM_FIELDS
            if unknown:
                raise InvalidInput(f"items[{i}]", f"unknown field(s) {sorted(unknown)}")
            ref, value, key = entry.get("ref"), entry.get("data"), entry.get("partition_key")
            if value is not None:
                text = encode_payload(value, max_bytes=max_payload_bytes, field=f"items[{i}].data")
                any_data = True
        else:
            ref = entry
        if not isinstance(ref, str) or not ref or len(ref) > MAX_REF_LENGTH or "\x00" in ref:
            raise InvalidInput(
                f"items[{i}].ref",
                f"must be a non-empty string of at most {MAX_REF_LENGTH} characters "
                f"without NUL, got {ref!r:.80}",
            )
        if ref in seen:
            raise InvalidInput(f"items[{i}].ref", f"duplicate ref {ref!r}")
        seen.add(ref)
        refs.append(ref)
        data.append(text)
        named = None
        if key is not None:
            named = partition_key_of(key, field=f"items[{i}].partition_key")
            any_key = True
        keys.append(named)
    return ParsedItems(refs, data if any_data else [], keys if any_key else [])


def request_hash(kind: str, items: ParsedItems, params: str, deadline_s: float | None) -> str:
    """A digest of everything a create request asks for (its idempotency fingerprint)."""
    digest = hashlib.sha256()
    digest.update(json.dumps([kind, params, deadline_s]).encode())
    # One join and one encode for the whole list: per-item updates would be a
    # measurable share of creating 100,000 items. Item data is JSON text, "null"
    # for none.
    data = items.data or [None] * len(items.refs)
    text = "".join(
        [
            f"\x00{ref}\x01{'null' if d is None else d}"
            for ref, d in zip(items.refs, data, strict=True)
        ]
    )
    digest.update(text.encode())
    if items.partition_keys:
        # The keys items named are part of the request; a request that names
        # none has the fingerprint it had before items could name one.
        digest.update(
            "".join(
                [f"\x02{i}\x03{k}" for i, k in enumerate(items.partition_keys) if k is not None]
            ).encode()
        )
    return digest.hexdigest()


def check_idempotency_key(key: object) -> str | None:
    """``key`` when it is None or a usable idempotency key; InvalidInput otherwise."""
    if key is not None and (
        not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH or "\x00" in key
    ):
        raise InvalidInput(
            "idempotency_key",
            f"must be a non-empty string of at most {MAX_KEY_LENGTH} characters",
        )
    return key


def positive_seconds(field: str, value: timedelta | float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise InvalidInput(field, f"must be a number of seconds, got {value!r}")
    # Compared before float(): float(10**400) raises OverflowError.
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if not seconds > 0 or seconds != seconds or seconds > MAX_DEADLINE_S:
        raise InvalidInput(field, f"must be a positive number of seconds, got {shown(value)}")
    return float(seconds)


def canonical_uuid(value: object) -> str | None:
    """The canonical spelling of a UUID (PostgreSQL refuses some Python accepts), or None."""
    try:
        return str(uuid.UUID(str(value)))
    except ValueError:
        return None


__all__ = [
    "ITEM_FIELDS",
    "MAX_KEY_LENGTH",
    "MAX_REF_LENGTH",
    "ParsedItems",
    "canonical_uuid",
    "check_idempotency_key",
    "parse_items",
    "positive_seconds",
    "request_hash",
]
