"""``llm``: an OpenAI-compatible chat-completions endpoint asked for JSON.

A paper is cut into chunks (:mod:`shoal_extract.chunking`: by page and
section); for each field the chunks are ranked by BM25 against the field's
name and description, and one call gets, within a token budget
(``max_prompt_tokens``), the front matter (title, authors, abstract) and
each field's best chunks in turn. Fields the model answers ``null`` that still have
unseen ranked chunks are asked again over those (up to ``max_calls`` calls a
document), so a field may be filled from a chunk late in a long paper. The
whole text is never cut at a fixed length.

The model must answer one JSON object with every field asked, ``null`` for
what the chunks do not state, and ``_quotes``: for each value, the passage
it copied it from (checked against the paper by the evidence step). The
answer is checked against the template; an invalid one gets exactly one
repair attempt (the model is shown what was wrong), then the item fails for
good.

How failures are classified, so the batch layer does the right thing:

=====================================  ==========================================
what happened                          what the item does
=====================================  ==========================================
429 with ``Retry-After``               every worker's calls to the model pause
                                       (:mod:`shoal_extract.budget`); this call
                                       waits, then is made again: no retry spent
429 without it, 5xx, timeout,          transient (:class:`ModelUnavailable`):
connection error, a 200 whose body     retried with backoff
is not a completion
other 4xx (bad key, unknown model)     permanent: retrying sends the same request
answer invalid after one repair        permanent
=====================================  ==========================================

Every call is recorded (outcome, tokens, cost) through the context's
recorder, so the money spent on an item is known, retries included.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from shoal import PermanentError
from shoal_extract.chunking import (
    CHARS_PER_TOKEN,
    Chunk,
    ChunkIndex,
    chunk_document,
    front_matter,
    select,
)
from shoal_extract.extractors.base import CallContext, CallRecord, Extraction, Usage
from shoal_extract.parsing import ParsedText
from shoal_extract.templates import Template

DEFAULT_TIMEOUT_S = 60.0
# Tokens of paper per call: the best chunks of ten fields with room to spare,
# well inside any current model's context.
DEFAULT_MAX_PROMPT_TOKENS = 6_000
# Calls per document (repairs not counted): the first over every field's best
# chunks, the rest for fields still null over chunks not yet shown.
DEFAULT_MAX_CALLS = 3
# Longest an item waits, in total, on pauses an endpoint asked for (429 with
# Retry-After) before it gives up this attempt as a transient failure.
DEFAULT_MAX_PAUSE_S = 600.0
QUOTES = "_quotes"  # never a field name: those start with a letter
# A model's confidence in a value (no log-probabilities asked for): the value
# appears in the passage it quotes, or the quote only supports it.
QUOTED, PARAPHRASED = 0.8, 0.6
TOKENS_PER_MILLION = 1_000_000
# Sent with each call so an endpoint (or its logs) can tell which item asked.
ITEM_HEADER = "X-Shoal-Item"

SYSTEM_PROMPT = """\
You extract structured data from one scientific paper.
Answer with ONE JSON object and nothing else. Its keys are exactly the fields below.
Give a field the value the paper states; use null when the paper does not state it.
Never guess, never infer from other papers. Copy text values as printed.
The paper is shown as chunks, each labelled with its page; a field the chunks
do not state is null.
Add the key "_quotes": an object giving, for each field with a value, the
shortest passage of the paper (a sentence or less) that states it, copied
character for character.

Fields:
{fields}

The answer must match this JSON Schema:
{schema}"""

REPAIR_PROMPT = """\
Your answer was not valid: {problems}.
Reply with the corrected JSON object only, with exactly the keys {keys}."""

_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


class ModelUnavailable(Exception):
    """The endpoint could not answer now (rate limit, overload, timeout): worth retrying."""


@dataclass(frozen=True, slots=True)
class LlmSettings:
    """Where the model is and what it costs; read from the environment at the CLI edge."""

    base_url: str
    model: str
    api_key: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    price_in_per_mtok: float = 0.0  # USD per million prompt tokens
    price_out_per_mtok: float = 0.0  # USD per million completion tokens
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS
    max_calls: int = DEFAULT_MAX_CALLS
    max_pause_s: float = DEFAULT_MAX_PAUSE_S
    # Across every worker, through PostgreSQL (shoal_extract.budget); None: unlimited.
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return round(
            (prompt_tokens * self.price_in_per_mtok + completion_tokens * self.price_out_per_mtok)
            / TOKENS_PER_MILLION,
            6,
        )


@dataclass(frozen=True, slots=True)
class Answer:
    content: str
    usage: Usage
    response_id: str | None


def answer_schema(template: Template) -> dict[str, Any]:
    """The template's JSON Schema, plus the optional ``_quotes`` object."""
    schema = template.json_schema()
    schema["properties"][QUOTES] = {
        "type": "object",
        "additionalProperties": {"type": ["string", "null"]},
        "description": "field -> the passage of the paper its value was copied from",
    }
    return schema


def quotes_of(content: str) -> dict[str, str]:
    """The ``_quotes`` of an answer that :func:`check_answer` accepted (strings only)."""
    match = _FENCE.match(content)
    raw = json.loads(match.group(1) if match else content).get(QUOTES)
    if not isinstance(raw, dict):
        return {}
    return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str) and v}


def check_answer(content: str, template: Template) -> tuple[dict[str, Any] | None, list[str]]:
    """The answer's values, or None and what is wrong with it."""
    match = _FENCE.match(content)
    text = match.group(1) if match else content
    try:
        answer = json.loads(text)
    except ValueError as exc:
        return None, [f"not JSON ({exc})"]
    if not isinstance(answer, dict):
        return None, [f"not a JSON object but {type(answer).__name__}"]
    problems = []
    extra = sorted(set(answer) - set(template.field_names) - {QUOTES})
    if extra:
        problems.append(f"unknown keys {extra}")
    missing = [name for name in template.field_names if name not in answer]
    if missing:
        problems.append(f"missing keys {missing}")
    for spec in template.fields:
        if spec.name in answer:
            why = spec.check_value(answer[spec.name])
            if why:
                problems.append(f"{spec.name}: {why}")
    if problems:
        return None, problems
    return {name: answer[name] for name in template.field_names}, []


class LlmExtractor:
    """The ``llm`` extractor: one chat completion per document, validated, repaired once."""

    name = "llm"

    def __init__(self, settings: LlmSettings, *, client: httpx.AsyncClient | None = None) -> None:
        self.settings = settings
        self._client = client or httpx.AsyncClient(timeout=httpx.Timeout(settings.timeout_s))
        self._owns_client = client is None

    async def close(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    def messages(self, chunks: Sequence[Chunk], template: Template) -> list[dict[str, str]]:
        fields = "\n".join(
            f"- {f.name} ({f.type.value}{', required' if f.required else ''}): {f.description}"
            for f in template.fields
        )
        text = "\n\n".join(f"{c.label()}\n{c.text}" for c in chunks)
        return [
            {
                "role": "system",
                "content": SYSTEM_PROMPT.format(
                    fields=fields, schema=json.dumps(answer_schema(template))
                ),
            },
            {
                "role": "user",
                "content": f"The paper (the chunks most likely to hold the fields):\n\n{text}",
            },
        ]

    async def extract(
        self, document: ParsedText, template: Template, *, context: CallContext
    ) -> Extraction:
        chunks = chunk_document(document)
        index = ChunkIndex(chunks)
        values: dict[str, Any] = dict.fromkeys(template.field_names)
        quotes: dict[str, str] = {}
        confidence: dict[str, float] = {}
        shown: set[int] = set()
        pending = list(template.fields)
        usage = Usage()
        response_id: str | None = None
        calls = 0
        while pending and calls < self.settings.max_calls:
            ranked = {f.name: index.ranked(f) for f in pending}
            asked = Template(template.name, tuple(pending), template.description)
            budget = self.settings.max_prompt_tokens - _tokens(self.messages([], asked))
            front = front_matter(chunks)
            exclude = frozenset(shown - {c.index for c in front})
            chosen = select(ranked, budget, always=front, exclude=exclude)
            if calls and not {c.index for c in chosen} - shown:
                break  # nothing new to show the fields still missing
            answered, found, spent, response_id = await self._ask(chosen, asked, context)
            calls += 1
            usage = usage + spent
            shown |= {c.index for c in chosen}
            for name, value in answered.items():
                if value is not None:
                    values[name] = value
                    if name in found:
                        quotes[name] = found[name]
                        confidence[name] = _confidence(value, found[name])
            pending = [
                f
                for f in pending
                if values[f.name] is None and any(c.index not in shown for c in ranked[f.name])
            ]
        notes = {
            name: f"not found in the {len(shown)} of {len(chunks)} chunks shown"
            for name, value in values.items()
            if value is None
        }
        return Extraction(
            values=values,
            notes=notes,
            usage=usage,
            model=self.settings.model,
            response_id=response_id,
            quotes=quotes,
            confidence=confidence,
            chunks_shown=tuple(sorted(shown)),
        )

    async def _ask(
        self, chunks: Sequence[Chunk], template: Template, context: CallContext
    ) -> tuple[dict[str, Any], dict[str, str], Usage, str | None]:
        """One question over ``chunks``: values, quotes, usage, response id (repaired once)."""
        messages = self.messages(chunks, template)
        first = await self._call(messages, context)
        values, problems = check_answer(first.content, template)
        usage = first.usage
        answer = first
        if values is None:
            await context.record(
                CallRecord("invalid", self.settings.model, first.usage, first.response_id)
            )
            messages = [
                *messages,
                {"role": "assistant", "content": first.content},
                {
                    "role": "user",
                    "content": REPAIR_PROMPT.format(
                        problems="; ".join(problems), keys=list(template.field_names)
                    ),
                },
            ]
            answer = await self._call(messages, context)
            usage = usage + answer.usage
            values, problems = check_answer(answer.content, template)
            if values is None:
                await context.record(
                    CallRecord("invalid", self.settings.model, answer.usage, answer.response_id)
                )
                raise PermanentError(
                    "the model's answer is invalid after a repair attempt: " + "; ".join(problems)
                )
        await context.record(
            CallRecord("answered", self.settings.model, answer.usage, answer.response_id)
        )
        return values, quotes_of(answer.content), usage, answer.response_id

    async def _call(self, messages: list[dict[str, str]], context: CallContext) -> Answer:
        """One chat completion; records the calls that fail, raises by the table above."""
        settings = self.settings
        headers = {ITEM_HEADER: f"{context.task_id}/{context.item_id}/{context.attempt}"}
        if settings.api_key:
            headers["Authorization"] = f"Bearer {settings.api_key}"
        body = {
            "model": settings.model,
            "messages": messages,
            "temperature": 0,
            "response_format": {"type": "json_object"},
        }
        url = settings.base_url.rstrip("/") + "/chat/completions"
        estimate = _tokens(messages)
        gate = context.gate
        paused_s = 0.0
        while True:
            if gate is not None:
                await gate.acquire(settings.model, estimate)
            try:
                response = await self._client.post(url, json=body, headers=headers)
            except httpx.TimeoutException as exc:
                await context.record(CallRecord("timeout", settings.model, Usage(calls=1)))
                raise ModelUnavailable(
                    f"no answer from {url} within {settings.timeout_s:g}s ({type(exc).__name__})"
                ) from None
            except httpx.TransportError as exc:
                await context.record(CallRecord("unavailable", settings.model, Usage(calls=1)))
                raise ModelUnavailable(f"cannot reach {url}: {type(exc).__name__}: {exc}") from None
            status = response.status_code
            wait = retry_after(response) if status == 429 else None
            if wait is None or gate is None:
                break
            await context.record(CallRecord("paused", settings.model, Usage(calls=1, paused=1)))
            if paused_s + wait > settings.max_pause_s:
                raise ModelUnavailable(
                    f"{url} asked to wait {wait:g}s more (429 Retry-After) after "
                    f"{paused_s:g}s of pauses, over the limit of {settings.max_pause_s:g}s "
                    "(SHOAL_LLM_MAX_PAUSE_S)"
                )
            paused_s += wait
            # Every worker's calls to this model wait; this one too, then asks again.
            await gate.pause(settings.model, wait)
        if status == 429 or status >= 500:
            await context.record(CallRecord("unavailable", settings.model, Usage(calls=1)))
            raise ModelUnavailable(f"{url} answered {status}: {_excerpt(response)}")
        if status >= 400:
            await context.record(CallRecord("rejected", settings.model, Usage(calls=1)))
            raise PermanentError(f"{url} refused the request ({status}): {_excerpt(response)}")
        try:
            payload = response.json()
            content = payload["choices"][0]["message"]["content"]
            if not isinstance(content, str):
                raise TypeError(f"content is {type(content).__name__}")
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            await context.record(CallRecord("unavailable", settings.model, Usage(calls=1)))
            raise ModelUnavailable(
                f"{url} answered 200 without a chat completion ({type(exc).__name__}: {exc})"
            ) from None
        tokens = payload.get("usage") if isinstance(payload.get("usage"), dict) else {}
        prompt = _count(tokens.get("prompt_tokens"))
        completion = _count(tokens.get("completion_tokens"))
        usage = Usage(
            calls=1,
            prompt_tokens=prompt,
            completion_tokens=completion,
            cost_usd=settings.cost(prompt, completion),
        )
        response_id = payload.get("id") if isinstance(payload.get("id"), str) else None
        if gate is not None and prompt + completion:
            await gate.settle(settings.model, estimate, prompt + completion)
        return Answer(content, usage, response_id)


def retry_after(response: httpx.Response) -> float | None:
    """The seconds a ``Retry-After`` header asks for.

    Delta-seconds, or an HTTP date counted from the response's own ``Date``
    (the server's clock, not this machine's); None when there is none.
    """
    raw = response.headers.get("retry-after", "").strip()
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(raw)
        sent = parsedate_to_datetime(response.headers.get("date", ""))
    except (TypeError, ValueError):
        return None
    return max(0.0, (_utc(when) - _utc(sent)).total_seconds())


def _utc(when: datetime) -> datetime:
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _confidence(value: Any, quote: str) -> float:
    """How sure a model's value is, without log-probabilities: does its own quote carry it?"""
    flat = " ".join(quote.split()).casefold()
    return QUOTED if " ".join(str(value).split()).casefold() in flat else PARAPHRASED


def _tokens(messages: list[dict[str, str]]) -> int:
    return sum(len(m["content"]) for m in messages) // CHARS_PER_TOKEN + 1


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _excerpt(response: httpx.Response) -> str:
    return " ".join(response.text.split())[:200] or "(empty body)"


__all__ = [
    "LlmExtractor",
    "LlmSettings",
    "ModelUnavailable",
    "answer_schema",
    "check_answer",
    "quotes_of",
    "retry_after",
]
