"""The batch kind that extracts one document, declared on a shoal :class:`~shoal.App`.

>>> extraction = ExtractionApp(WorkerSettings())                # doctest: +SKIP
>>> await extraction.app.run(boss, stop=stop)                   # doctest: +SKIP

Each item of an extraction task is one document (``data = {"document_id"}``);
the task's ``params`` name the template version and the extractor. The
handler loads the document's bytes, parses them, runs the extractor and
returns the values; shoal's batch layer does the rest (phantom guard,
retries, fencing, the aggregator). A file that cannot be parsed is a
permanent error carrying the parser's message.

The extractors: ``rules`` (offline, the default), ``llm`` (a model endpoint)
and ``rules+llm`` (the rules, then the model for the fields they leave empty:
:mod:`shoal_extract.extractors.fill`; without an endpoint, the rules alone,
and the result says so).

A document is parsed once per parser version: the parse is stored under the
file's content hash, and every later item over the same bytes (another
template, another extractor, a retry) reads it from there. Likewise a model's
answer is stored under the content hash, the template version, the model and
the fields asked (``rules+llm`` asks fewer than the template has): an item
asking the same again (a re-run, another task) reuses it without a call, and
the cache hit is recorded in the ledger.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from shoal import App, Clock, Item, PermanentError, Shoal, SystemClock
from shoal_extract.budget import ModelGate, Rates
from shoal_extract.evidence import FLAG, Evidence, check_evidence
from shoal_extract.extractors.base import CallContext, CallRecord, Extraction, Extractor, Usage
from shoal_extract.extractors.fill import RulesThenLlm
from shoal_extract.extractors.llm import LlmExtractor, LlmSettings
from shoal_extract.extractors.rules import RulesExtractor
from shoal_extract.flow import declare_flow
from shoal_extract.kinds import DEFAULT_EXTRACTOR, EXTRACTORS, KIND
from shoal_extract.parsing import ParsedText, ParseError, ParseLimits, parse_document
from shoal_extract.schema import DEFAULT_SCHEMA, ensure_schema
from shoal_extract.store import CallFor, ExtractStore
from shoal_extract.templates import SHIPPED_TEMPLATES, StoredTemplate, Template
from shoal_extract.workbench import Workbench

DEFAULT_CONCURRENCY = 8
# Enough retries to ride out a rate-limit burst: with backoff from 2 s the
# last retry comes about a minute after the first failure.
DEFAULT_RETRY_LIMIT = 5
DEFAULT_RETRY_DELAY = timedelta(seconds=2)
DEFAULT_ZOMBIE_TIMEOUT = timedelta(minutes=2)
# Documents parsed at once in one worker process (OCR runs in Tesseract's own
# processes, so a second thread keeps a core busy while the other waits on it).
PARSE_THREADS = 2
DEFAULT_EXPORT_DIR = Path("exports")


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    concurrency: int = DEFAULT_CONCURRENCY
    retry_limit: int = DEFAULT_RETRY_LIMIT
    retry_delay: timedelta = DEFAULT_RETRY_DELAY
    zombie_timeout: timedelta = DEFAULT_ZOMBIE_TIMEOUT
    llm: LlmSettings | None = None
    schema: str = DEFAULT_SCHEMA
    limits: ParseLimits = field(default_factory=ParseLimits)
    # Where a run of the flow writes its export (shoal-extract: $SHOAL_EXTRACT_DIR/exports).
    export_dir: Path = DEFAULT_EXPORT_DIR


class ExtractionApp:
    """The workbench's :class:`~shoal.App`: batch kind ``extraction.document`` and workflow
    ``extraction``, the whole flow from import to export (:mod:`shoal_extract.flow`).

    ``app.run(boss, ...)`` (or ``shoal-extract worker``) runs it; the start
    hook creates the workbench's tables and the shipped templates first.
    """

    def __init__(self, settings: WorkerSettings, *, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self.app = App()
        # Set by attach() (the worker's start hook, or the caller); read by the handler.
        self.store: ExtractStore | None = None
        self.workbench: Workbench | None = None  # read by the flow's steps
        self.gate: ModelGate | None = None
        self._templates: dict[int, StoredTemplate] = {}
        self._parsing = asyncio.Semaphore(PARSE_THREADS)
        self._rules = RulesExtractor()
        self._llm = LlmExtractor(settings.llm) if settings.llm is not None else None
        self.app.on_start(self._on_start)
        self.app.batch(
            KIND,
            concurrency=settings.concurrency,
            retry_limit=settings.retry_limit,
            retry_delay=settings.retry_delay,
            zombie_timeout=settings.zombie_timeout,
            permanent=(ParseError,),
        )(self.extract_item)
        declare_flow(self.app, self._workbench, export_dir=settings.export_dir)

    async def attach(self, boss: Shoal) -> ExtractStore:
        """Create (or upgrade) the workbench's tables, store the shipped templates; the store."""
        if self.store is None or self.store.db is not boss.db:
            await ensure_schema(boss.db, self.settings.schema)
            store = ExtractStore(boss.db, schema=self.settings.schema, clock=self.clock)
            for template in SHIPPED_TEMPLATES:
                await store.save_template(template)
            llm = self.settings.llm
            rates = Rates(llm.requests_per_minute, llm.tokens_per_minute) if llm else Rates()
            self.gate = ModelGate(store, self.clock, rates)
            self.store = store
            self.workbench = Workbench(
                self.app.batches(boss), store, workflows=self.app.workflows(boss)
            )
        return self.store

    def _workbench(self) -> Workbench:
        assert self.workbench is not None, "attach() runs before any run (the start hook)"
        return self.workbench

    async def close(self) -> None:
        if self._llm is not None:
            await self._llm.close()

    async def _on_start(self, boss: Shoal) -> None:
        await self.attach(boss)

    def check_extractor(self, name: object) -> str:
        """``name`` when this worker can run it; else a PermanentError saying why not."""
        if not isinstance(name, str) or name not in EXTRACTORS:
            raise PermanentError(f"unknown extractor {name!r}; known: {', '.join(EXTRACTORS)}")
        if name == "llm" and self._llm is None:
            raise PermanentError(
                "the llm extractor is not configured on this worker: set SHOAL_LLM_BASE_URL "
                "and SHOAL_LLM_MODEL (apps/extraction/README.md)"
            )
        return name

    async def _template(self, store: ExtractStore, template_id: int) -> StoredTemplate:
        # Versions never change once stored, so caching them is safe.
        if template_id not in self._templates:
            stored = await store.template_by_id(template_id)
            if stored is None:
                raise PermanentError(f"template version {template_id} does not exist")
            self._templates[template_id] = stored
        return self._templates[template_id]

    async def parsed(self, store: ExtractStore, document_id: int) -> ParsedText:
        """The document's parse: stored by an earlier item, else parsed now and stored."""
        rows = await store.documents_by_id([document_id])
        if document_id not in rows:
            raise PermanentError(f"document {document_id} does not exist")
        row = rows[document_id]
        parsed = await store.parsed_text(row.sha256)
        if parsed is None:
            document = await store.document_content(document_id)
            if document is None:
                raise PermanentError(f"document {document_id} does not exist")
            limits = self.settings.limits
            # Parsing is CPU-bound Python: threads beyond the cores only fight
            # over the GIL and slow the event loop (heartbeats, model calls).
            async with self._parsing:
                parsed = await asyncio.to_thread(
                    parse_document, document.content, row.format, limits
                )
            await store.store_parsed(row.sha256, parsed)
        elif parsed.pages > self.settings.limits.max_pages:
            raise ParseError(
                f"the document has {parsed.pages} pages, over the limit of "
                f"{self.settings.limits.max_pages} (SHOAL_EXTRACT_MAX_PAGES)"
            )
        return parsed

    async def extract_item(self, item: Item) -> dict[str, Any]:
        """Parse one document and extract the task's template from it."""
        store = self.store
        assert store is not None, "attach() runs before any item (the worker's start hook)"
        data = item.data if isinstance(item.data, dict) else {}
        params = item.params if isinstance(item.params, dict) else {}
        document_id = data.get("document_id")
        template_id = params.get("template_id")
        if not isinstance(document_id, int) or not isinstance(template_id, int):
            raise PermanentError(f"item {item.id}: needs data.document_id and params.template_id")
        stored = await self._template(store, template_id)
        name = self.check_extractor(params.get("extractor", DEFAULT_EXTRACTOR))
        parsed = await self.parsed(store, document_id)
        call = CallFor(str(item.task_id), int(item.id), item.attempt, document_id)

        async def record(entry: CallRecord) -> None:
            await store.record_call(call, entry)

        context = CallContext(
            task_id=call.task_id,
            item_id=call.item_id,
            attempt=call.attempt,
            document_id=document_id,
            record=record,
            gate=self.gate,
            last_attempt=item.is_last_attempt,
        )
        model: Extractor | None = None
        if self._llm is not None and name != "rules":  # the rules cost nothing: no cache
            sha256 = (await store.documents_by_id([document_id]))[document_id].sha256
            model = CachedModel(self._llm, store, sha256, stored)
        extractor: Extractor
        if name == "rules":
            extractor = self._rules
        elif name == "llm":
            assert model is not None, "check_extractor refuses llm without an endpoint"
            extractor = model
        else:
            extractor = RulesThenLlm(self._rules, model)
        extraction = await extractor.extract(parsed, stored.template, context=context)
        evidence = await asyncio.to_thread(
            check_evidence,
            parsed,
            extraction.values,
            extraction.quotes,
            extraction.confidence,
        )
        return result_of(extraction, stored, name, pages=parsed.pages, evidence=evidence)


class CachedModel:
    """The llm extractor behind the model cache, for one document and template version.

    An answer is stored under the document's content hash, the template
    version, the model and the fields asked: the template's own fields are
    keyed by the model's name alone (as before the rules+llm mode), a subset
    (the fields the rules left empty) by the model's name and those fields.
    The same question again is answered from there: no call, nothing spent,
    a ``cached`` entry in the ledger.
    """

    name = "llm"

    def __init__(
        self, llm: LlmExtractor, store: ExtractStore, sha256: str, stored: StoredTemplate
    ) -> None:
        self.llm = llm
        self.store = store
        self.sha256 = sha256
        self.stored = stored

    def key(self, template: Template) -> str:
        model = self.llm.settings.model
        if template.field_names == self.stored.template.field_names:
            return model
        return f"{model} fields={','.join(template.field_names)}"

    async def extract(
        self, document: ParsedText, template: Template, *, context: CallContext
    ) -> Extraction:
        model, key = self.llm.settings.model, self.key(template)
        cached = await self.store.cached_result(self.sha256, self.stored.id, key)
        if cached is not None:
            extraction = extraction_of(cached, model)
            await context.record(
                CallRecord("cached", model, Usage(cached=1), extraction.response_id)
            )
            return extraction
        extraction = await self.llm.extract(document, template, context=context)
        await self.store.store_result(self.sha256, self.stored.id, key, cacheable(extraction))
        return extraction


def cacheable(extraction: Extraction) -> dict[str, Any]:
    """What the model cache keeps of an extraction (all but who asked)."""
    return {
        "values": extraction.values,
        "notes": extraction.notes,
        "quotes": extraction.quotes,
        "confidence": extraction.confidence,
        "chunks_shown": list(extraction.chunks_shown),
        "response_id": extraction.response_id,
        "usage": extraction.usage.as_dict(),  # what the first answer cost
    }


def extraction_of(cached: Mapping[str, Any], model: str) -> Extraction:
    """A cached answer as this item's extraction: it cost this item nothing."""
    return Extraction(
        values=dict(cached.get("values") or {}),
        notes=dict(cached.get("notes") or {}),
        usage=Usage(cached=1),
        model=model,
        response_id=cached.get("response_id"),
        quotes=dict(cached.get("quotes") or {}),
        confidence={k: float(v) for k, v in (cached.get("confidence") or {}).items()},
        chunks_shown=tuple(cached.get("chunks_shown") or ()),
    )


def result_of(
    extraction: Extraction,
    stored: StoredTemplate,
    extractor: str,
    *,
    pages: int,
    evidence: Mapping[str, Evidence] | None = None,
) -> dict[str, Any]:
    """The item's result: values with their evidence, per-field errors, what produced them.

    A value whose quote is not in the source text keeps its place in
    ``fields`` for review, is listed in ``flagged`` and has a field error.
    """
    evidence = evidence or {}
    sources = extraction.sources
    field_errors = {}
    for spec in stored.template.fields:
        note = extraction.notes.get(spec.name)
        if extraction.values.get(spec.name) is None:
            note = note or "not found"
            field_errors[spec.name] = f"{note} (required)" if spec.required else note
        elif spec.name in evidence and not evidence[spec.name].verified:
            field_errors[spec.name] = f"{FLAG} (flagged)"
    return {
        "template": stored.template.name,
        "template_version": stored.version,
        "extractor": extractor,
        "fields": {name: extraction.values.get(name) for name in stored.template.field_names},
        "field_errors": field_errors,
        # Each value's evidence names the extractor it came from (rules+llm: either).
        "evidence": {
            name: ev.as_dict() | {"source": sources.get(name, extractor)}
            for name, ev in evidence.items()
        },
        "flagged": [name for name, ev in evidence.items() if not ev.verified],
        "pages": pages,
        "chunks_shown": list(extraction.chunks_shown),
        "model": extraction.model,
        "response_id": extraction.response_id,
        "usage": extraction.usage.as_dict(),
        "cached": extraction.usage.cached > 0,
        # rules+llm: what the model was asked, what it filled, why it failed or was not asked
        "llm_fill": None if extraction.fill is None else extraction.fill.as_dict(),
    }


__all__ = [
    "DEFAULT_EXTRACTOR",
    "EXTRACTORS",
    "KIND",
    "CachedModel",
    "ExtractionApp",
    "WorkerSettings",
    "result_of",
]
