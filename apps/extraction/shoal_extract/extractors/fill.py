"""``rules+llm``: the rules first, then the model for the fields they leave empty.

The rules run on every document. Each field of the template they leave empty
(``None``) is asked of the model, in one :class:`~shoal_extract.extractors.llm.LlmExtractor`
extraction over a template of those fields only; a field the rules filled is
never sent to the model, so it is never overwritten. Each value says where it
came from (``Extraction.sources``: ``rules`` or ``llm``), and the model's
values go through the same evidence check as the rules' (the worker runs it
on the merged extraction): a quote not on the page is flagged, its confidence
capped, never verified.

What the model's part came to is :class:`~shoal_extract.extractors.base.LlmFill`:

==================  ==========================================================
``not_needed``      the rules filled every field: no call
``not_configured``  no endpoint is configured: the rules' values, nothing else
``answered``        the model was asked; ``filled`` lists the fields it gave
``failed``          the endpoint failed: those fields stay empty, ``error`` says why
==================  ==========================================================

A failing endpoint never fails the document and never invents a value. A
failure the batch layer would retry (a 5xx, a timeout, a 429 without
``Retry-After``: anything but :class:`~shoal.PermanentError`) is raised while
runs remain (``CallContext.last_attempt`` is False), so the item is retried
with backoff like an ``llm`` item; on the last run, or at once for a permanent
failure (a 400, an answer still invalid after its repair), the rules' values
are kept, the fields asked stay empty and the error is recorded.

>>> extractor = RulesThenLlm(RulesExtractor(), LlmExtractor(settings))   # doctest: +SKIP
>>> found = await extractor.extract(parsed, CLINICAL_TRIAL, context=CallContext())  # doctest: +SKIP
>>> found.sources["sample_size"], found.fill.status                      # doctest: +SKIP
('llm', 'answered')
"""

from __future__ import annotations

from dataclasses import replace

from shoal import PermanentError
from shoal_extract.extractors.base import CallContext, Extraction, Extractor, LlmFill
from shoal_extract.parsing import ParsedText
from shoal_extract.templates import Template

NAME = "rules+llm"
NOT_CONFIGURED = (
    "no LLM endpoint is configured on this worker (SHOAL_LLM_BASE_URL and SHOAL_LLM_MODEL): "
    "the rules' values only"
)
# A field's note carries the start of the endpoint's error (the page shows notes in
# the table's cells); the whole of it is in the document's ``llm_fill``.
NOTE_ERROR_CHARS = 160


class RulesThenLlm:
    """The ``rules+llm`` extractor: ``rules``' values, the model's for the fields left empty.

    ``llm`` is None when no endpoint is configured: the extraction is then the
    rules' (values, quotes, confidence) and its ``fill`` says the model was
    not asked, and why.
    """

    name = NAME

    def __init__(self, rules: Extractor, llm: Extractor | None) -> None:
        self.rules = rules
        self.llm = llm

    async def extract(
        self, document: ParsedText, template: Template, *, context: CallContext
    ) -> Extraction:
        first = await self.rules.extract(document, template, context=context)
        sources = {name: self.rules.name for name, v in first.values.items() if v is not None}
        empty = tuple(f for f in template.fields if first.values.get(f.name) is None)
        asked = tuple(f.name for f in empty)
        if not empty:
            return replace(first, sources=sources, fill=LlmFill("not_needed"))
        if self.llm is None:
            notes = _notes(first, asked, "llm: no endpoint is configured")
            fill = LlmFill("not_configured", asked, error=NOT_CONFIGURED)
            return replace(first, notes=notes, sources=sources, fill=fill)
        question = Template(template.name, empty, template.description)
        try:
            second = await self.llm.extract(document, question, context=context)
        except PermanentError as exc:
            return self._failed(first, sources, asked, str(exc))
        except Exception as exc:
            # The boundary between the two extractors: a failure worth retrying is
            # the batch layer's while runs remain; on the last one the document
            # keeps the rules' values and the failure is recorded, never raised.
            if not context.last_attempt:
                raise
            return self._failed(first, sources, asked, f"{type(exc).__name__}: {exc}")
        values = dict(first.values)
        quotes, confidence, notes = dict(first.quotes), dict(first.confidence), dict(first.notes)
        filled = []
        for name in asked:
            value = second.values.get(name)
            if value is None:
                why = second.notes.get(name, "not found")
                notes[name] = f"rules: {notes.get(name, 'not found')}; llm: {why}"
                continue
            values[name] = value
            sources[name] = self.llm.name
            notes.pop(name, None)
            filled.append(name)
            if name in second.quotes:
                quotes[name] = second.quotes[name]
            if name in second.confidence:
                confidence[name] = second.confidence[name]
        return Extraction(
            values=values,
            notes=notes,
            usage=second.usage,
            model=second.model,
            response_id=second.response_id,
            quotes=quotes,
            confidence=confidence,
            chunks_shown=second.chunks_shown,
            sources=sources,
            fill=LlmFill("answered", asked, tuple(filled)),
        )

    def _failed(
        self, first: Extraction, sources: dict[str, str], asked: tuple[str, ...], error: str
    ) -> Extraction:
        short = error if len(error) <= NOTE_ERROR_CHARS else error[: NOTE_ERROR_CHARS - 3] + "..."
        notes = _notes(first, asked, f"llm: failed ({short})")
        fill = LlmFill("failed", asked, error=error)
        return replace(first, notes=notes, sources=sources, fill=fill)


def _notes(first: Extraction, asked: tuple[str, ...], why: str) -> dict[str, str]:
    """The rules' notes, each field asked saying why the model did not fill it."""
    notes = dict(first.notes)
    for name in asked:
        notes[name] = f"rules: {notes.get(name, 'not found')}; {why}"
    return notes


__all__ = ["NAME", "NOT_CONFIGURED", "RulesThenLlm"]
