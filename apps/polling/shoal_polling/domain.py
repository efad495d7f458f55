"""The values that travel between the gateway, the poller and the ingest side.

An :class:`Observation` is one answer of the carrier gateway about one card
(decision D3): its ``observed_at`` is the gateway's time of answer and is used
all the way through, so a late apply never changes which day or month a
reading belongs to. A :class:`CollectionRecord` is the trace of one poll,
successful or not, written in batches to the partitioned ``collection_record``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import psycopg
from psycopg.rows import TupleRow

from shoal import InvalidInput, Topic

AsyncConn = psycopg.AsyncConnection[TupleRow]

Kind = Literal["traffic", "card_status", "real_name"]
KINDS: tuple[Kind, ...] = ("traffic", "card_status", "real_name")
Step = Literal["traffic", "card_status", "real_name", "plan"]
STEPS: tuple[Step, ...] = ("traffic", "card_status", "real_name", "plan")

# Gateway calls in flight per carrier account (D1; the reference: card polling 41 accounts x 20).
ACCOUNT_CONCURRENCY = 20
# The reference truncates the gateway's raw answer to 4 KB before publishing:
# 4096 bytes of UTF-8, so a multi-byte answer stays within it too.
RAW_LIMIT = 4096
# Network statuses the gateway answers; the last two are a risk answer, on
# which polling stops (decided from the gateway's answer alone, D8).
NETWORK_STATUSES = ("active", "suspended", "deactivated", "risk_blocked")
RISK_STATUSES = frozenset({"deactivated", "risk_blocked"})
# An operator's action on a card, and the network status its confirmation sets.
ACTIONS = {"suspend": "suspended", "reactivate": "active"}
REAL_NAME_STATUSES = ("verified", "unverified")


def should_stop_polling_for_risk(kind: Kind, status: str | None) -> bool:
    """The reference's ``ShouldStopPollingForRisk``: only the gateway's answer decides."""
    return kind == "card_status" and status in RISK_STATUSES


def cut_utf8(text: str, limit_bytes: int) -> str:
    """``text`` cut to at most ``limit_bytes`` bytes of UTF-8, never inside a character."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit_bytes:
        return text
    # The cut may end inside a multi-byte character; "ignore" drops that tail
    # (the bytes before it are whole characters, encoded just above).
    return data[:limit_bytes].decode("utf-8", "ignore")


def _kind(value: Any) -> Kind:
    for kind in KINDS:
        if value == kind:
            return kind
    raise InvalidInput("kind", f"must be one of {', '.join(KINDS)}, got {value!r}")


@dataclass(frozen=True, slots=True)
class Observation:
    observation_id: str
    card_id: str
    account_id: str
    kind: Kind
    observed_at: datetime
    used_kb: int | None = None  # traffic: the month-to-date reading
    status: str | None = None  # card_status: network status; real_name: its status
    raw: str = ""
    # Set when this poll claimed a priority item: applied synchronously, and
    # the item is completed in the apply's transaction (D8).
    priority_item_id: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "observation_id": self.observation_id,
            "card_id": self.card_id,
            "account_id": self.account_id,
            "kind": self.kind,
            "observed_at": self.observed_at.isoformat(),
            "used_kb": self.used_kb,
            "status": self.status,
            "raw": cut_utf8(self.raw, RAW_LIMIT),
            "priority_item_id": self.priority_item_id,
        }

    @classmethod
    def from_json(cls, doc: Any) -> Observation:
        if not isinstance(doc, dict):
            raise InvalidInput("observation", "must be a JSON object")
        try:
            return cls(
                observation_id=str(doc["observation_id"]),
                card_id=str(doc["card_id"]),
                account_id=str(doc["account_id"]),
                kind=_kind(doc["kind"]),
                observed_at=datetime.fromisoformat(doc["observed_at"]),
                used_kb=None if doc.get("used_kb") is None else int(doc["used_kb"]),
                status=doc.get("status"),
                raw=str(doc.get("raw") or ""),
                priority_item_id=doc.get("priority_item_id"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInput("observation", f"malformed: {exc}") from exc


@dataclass(frozen=True, slots=True)
class CollectionRecord:
    observation_id: str
    observed_at: datetime
    card_id: str
    kind: Kind
    ok: bool
    value: dict[str, Any] | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "observation_id": self.observation_id,
            "observed_at": self.observed_at.isoformat(),
            "card_id": self.card_id,
            "kind": self.kind,
            "ok": self.ok,
            "value": self.value,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, doc: Any) -> CollectionRecord:
        if not isinstance(doc, dict):
            raise InvalidInput("collection record", "must be a JSON object")
        try:
            return cls(
                observation_id=str(doc["observation_id"]),
                observed_at=datetime.fromisoformat(doc["observed_at"]),
                card_id=str(doc["card_id"]),
                kind=_kind(doc["kind"]),
                ok=bool(doc["ok"]),
                value=doc.get("value"),
                error=doc.get("error"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInput("collection record", f"malformed: {exc}") from exc

    @classmethod
    def of(cls, observation: Observation) -> CollectionRecord:
        """The success record of an applied observation."""
        value: dict[str, Any] = (
            {"used_kb": observation.used_kb}
            if observation.kind == "traffic"
            else {"status": observation.status}
        )
        return cls(
            observation.observation_id,
            observation.observed_at,
            observation.card_id,
            observation.kind,
            ok=True,
            value=value,
        )


# The reference's card.ingest and card.collection.
OBSERVATIONS = Topic(
    "polling.observation", decode=Observation.from_json, encode=Observation.to_json
)
COLLECTION = Topic(
    "polling.collection", decode=CollectionRecord.from_json, encode=CollectionRecord.to_json
)
MODE_KEY = "polling.ingest.mode"
