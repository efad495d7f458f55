"""``llm``: an OpenAI-compatible chat-completions endpoint asked for JSON.

The model gets the template's fields (with their descriptions and a JSON
Schema) and the document's text, and must answer one JSON object with every
field, ``null`` for what the paper does not state. The answer is checked
against the template; an invalid one gets exactly one repair attempt (the
model is shown what was wrong), then the item fails for good.

How failures are classified, so the batch layer does the right thing:

=====================================  ==========================================
what happened                          what the item does
=====================================  ==========================================
429, 5xx, timeout, connection error,   transient (:class:`ModelUnavailable`):
a 200 whose body is not a completion   retried with backoff
other 4xx (bad key, unknown model)     permanent: retrying sends the same request
answer invalid after one repair        permanent
=====================================  ==========================================

Every call is recorded (outcome, tokens, cost) through the context's
recorder, so the money spent on an item is known, retries included.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import httpx

from shoal import PermanentError
from shoal_extract.extractors.base import CallContext, CallRecord, Extraction, Usage
from shoal_extract.parsing import ParsedText
from shoal_extract.templates import Template

DEFAULT_TIMEOUT_S = 60.0
# The part of a paper sent: title page, abstract, methods and results fit in
# this many characters; the rest (discussion, references) costs tokens and
# rarely holds a field.
DEFAULT_MAX_CHARS = 24_000
TOKENS_PER_MILLION = 1_000_000
# Sent with each call so an endpoint (or its logs) can tell which item asked.
ITEM_HEADER = "X-Shoal-Item"

SYSTEM_PROMPT = """\
You extract structured data from one scientific paper.
Answer with ONE JSON object and nothing else. Its keys are exactly the fields below.
Give a field the value the paper states; use null when the paper does not state it.
Never guess, never infer from other papers. Copy text values as printed.

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
    max_chars: int = DEFAULT_MAX_CHARS

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
    extra = sorted(set(answer) - set(template.field_names))
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

    def messages(self, document: ParsedText, template: Template) -> list[dict[str, str]]:
        fields = "\n".join(
            f"- {f.name} ({f.type.value}{', required' if f.required else ''}): {f.description}"
            for f in template.fields
        )
        text = document.text[: self.settings.max_chars]
        if len(document.text) > self.settings.max_chars:
            text += "\n[... the rest of the paper is left out ...]"
        return [
            {
                "role": "system",
                "content": SYSTEM_PROMPT.format(
                    fields=fields, schema=json.dumps(template.json_schema())
                ),
            },
            {"role": "user", "content": f"The paper:\n\n{text}"},
        ]

    async def extract(
        self, document: ParsedText, template: Template, *, context: CallContext
    ) -> Extraction:
        messages = self.messages(document, template)
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
        notes = {name: "not found" for name, value in values.items() if value is None}
        return Extraction(
            values=values,
            notes=notes,
            usage=usage,
            model=self.settings.model,
            response_id=answer.response_id,
        )

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
        return Answer(content, usage, response_id)


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _excerpt(response: httpx.Response) -> str:
    return " ".join(response.text.split())[:200] or "(empty body)"


__all__ = ["LlmExtractor", "LlmSettings", "ModelUnavailable", "check_answer"]
