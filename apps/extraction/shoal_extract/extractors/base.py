"""The one interface every extractor implements, and what it returns.

An extractor turns a parsed document and a template into one value per
field, ``None`` where it found nothing. It raises
:class:`~shoal.PermanentError` when retrying cannot help (the model refused
the request, its answer stayed invalid after a repair) and any other
exception when it might (rate limits, timeouts, a server error): the batch
layer retries those with backoff.

Calls that cost money are reported through ``CallContext.record`` as they
happen, failed ones included, so the usage of an item is known even when a
later attempt is the one that succeeds.

An extraction says where each value came from (``sources``: the extractor
that produced it) and, in the ``rules+llm`` mode, what the model was asked
and what came of it (``fill``, an :class:`LlmFill`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from shoal_extract.parsing import ParsedText
from shoal_extract.templates import Template


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens and cost of one or more model calls."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    cached: int = 0  # results reused from an earlier call: no call made, nothing spent
    paused: int = 0  # calls answered 429 with Retry-After: the model's calls paused

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            calls=self.calls + other.calls,
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            cost_usd=round(self.cost_usd + other.cost_usd, 6),
            cached=self.cached + other.cached,
            paused=self.paused + other.paused,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost_usd": self.cost_usd,
            "cached": self.cached,
            "paused": self.paused,
        }


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One model call, as it is written to the usage table."""

    outcome: str  # answered | invalid | rejected | unavailable | timeout | cached | paused
    model: str
    usage: Usage
    response_id: str | None = None


Recorder = Callable[[CallRecord], Awaitable[None]]


async def _no_recording(record: CallRecord) -> None:
    return None


class CallGate(Protocol):
    """The model budget shared by every worker (:class:`shoal_extract.budget.ModelGate`)."""

    async def acquire(self, model: str, tokens: int) -> float: ...

    async def settle(self, model: str, estimated: int, used: int) -> None: ...

    async def pause(self, model: str, seconds: float) -> datetime: ...


@dataclass(frozen=True, slots=True)
class CallContext:
    """Who an extraction is for: sent along to the model endpoint, and where usage goes."""

    task_id: str = ""
    item_id: int = 0
    attempt: int = 1
    document_id: int = 0
    record: Recorder = _no_recording
    gate: CallGate | None = None  # None: no shared budget (a 429 is then a plain retry)
    # No run follows this one: the rules+llm mode then records a model that failed
    # for a reason worth retrying (a 5xx, a timeout) instead of raising it. False
    # while the batch layer would retry the item (the worker sets it per run).
    last_attempt: bool = True


# What came of asking the model in the rules+llm mode (apps/extraction/README.md):
# not_needed: the rules filled every field, the model was not asked;
# not_configured: no endpoint is configured, the rules' values alone;
# answered: the model was asked the fields the rules left empty (a cached answer included);
# failed: the endpoint failed for good (or on the item's last run): those fields stay empty.
FillStatus = Literal["not_needed", "not_configured", "answered", "failed"]


@dataclass(frozen=True, slots=True)
class LlmFill:
    """The model's part in a ``rules+llm`` extraction: what it was asked, what it filled."""

    status: FillStatus
    asked: tuple[str, ...] = ()  # the fields the rules left empty, in the template's order
    filled: tuple[str, ...] = ()  # those the model gave a value
    error: str | None = None  # why it failed (status ``failed``), or why it was not asked

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "asked": list(self.asked),
            "filled": list(self.filled),
            "error": self.error,
        }


@dataclass(frozen=True, slots=True)
class Extraction:
    """The values of one document's fields (``None``: not found) and what it cost."""

    values: dict[str, Any]
    notes: dict[str, str] = field(default_factory=dict)  # field -> why it has no value
    usage: Usage = Usage()
    model: str | None = None
    response_id: str | None = None
    # field -> the passage the value was taken from, as the extractor saw it
    quotes: dict[str, str] = field(default_factory=dict)
    # field -> how sure the extractor is, 0-1 (before the evidence check)
    confidence: dict[str, float] = field(default_factory=dict)
    chunks_shown: tuple[int, ...] = ()  # the llm extractor: which chunks the model saw
    # field -> the extractor that produced its value ("rules", "llm"); a field not
    # listed came from the extractor the task named
    sources: dict[str, str] = field(default_factory=dict)
    fill: LlmFill | None = None  # the rules+llm mode only


class Extractor(Protocol):
    """Extracts a template's fields from a parsed document."""

    name: str

    async def extract(
        self, document: ParsedText, template: Template, *, context: CallContext
    ) -> Extraction: ...


__all__ = [
    "CallContext",
    "CallGate",
    "CallRecord",
    "Extraction",
    "Extractor",
    "FillStatus",
    "LlmFill",
    "Recorder",
    "Usage",
]
