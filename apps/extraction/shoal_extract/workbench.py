"""The workbench's operations: import documents, start an extraction, read its results.

>>> bench = Workbench(batches, store)                                      # doctest: +SKIP
>>> docs = await bench.import_folder(Path("corpus"))                       # doctest: +SKIP
>>> created = await bench.start([d.id for d in docs.documents], "clinical_trial")  # doctest: +SKIP

Everything here goes through shoal's public batch API (``Batches``): a task
is one shoal task of kind ``extraction.document`` with one item per document,
created in one transaction. Bad input raises :class:`~shoal.InvalidInput`
naming the field, before anything is written.

The whole flow, import to export with the review between, is one run of
workflow ``extraction`` (:mod:`shoal_extract.flow`), through shoal's
``Workflows``:

>>> run = await bench.start_run(ids, "clinical_trial")                     # doctest: +SKIP
>>> await bench.finish_review(task_id, reviewer="alice")  # the run exports  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from shoal import Batches, Conflict, Created, InvalidInput, NotFound, RunStatus, TaskView, Workflows
from shoal.workflow import RunView, Started
from shoal_extract.budget import BudgetState, ModelGate
from shoal_extract.evaluate import KeyEntry, Report, ResultRow, score
from shoal_extract.extractors.base import Usage
from shoal_extract.kinds import (
    DEFAULT_EXTRACTOR,
    DEFAULT_REVIEW_TIMEOUT,
    EXTRACTORS,
    FLOW,
    KIND,
    RUN_PARAM,
    FlowInput,
    review_key,
)
from shoal_extract.page_view import DEFAULT_SCALE, Highlight, quote_boxes, render_page
from shoal_extract.parsing import EXTENSIONS, DocumentFormat
from shoal_extract.store import (
    DocumentRow,
    ExtractStore,
    NewDocument,
    NewReview,
    Review,
    template_payload,
)
from shoal_extract.templates import StoredTemplate

# A paper is rarely over a few MB; a 50 MB "paper" is a scanned book or a mistake.
MAX_DOCUMENT_BYTES = 50 * 1024 * 1024
MAX_FILENAME = 255
MAX_TASK_DOCUMENTS = 10_000
MAX_REF = 512
MAX_REVIEWER = 200
# What a reviewer does to a value (the API's words) -> what is stored.
REVIEW_ACTIONS = {"accept": "accepted", "correct": "corrected"}


@dataclass(frozen=True, slots=True)
class Upload:
    filename: str
    content: bytes


@dataclass(frozen=True, slots=True)
class ImportReport:
    documents: tuple[DocumentRow, ...]
    skipped: tuple[str, ...] = ()  # files in the folder of a kind the workbench does not read

    @property
    def new(self) -> int:
        return sum(d.created for d in self.documents)


@dataclass(frozen=True, slots=True)
class ResultLine:
    """One document's outcome in a task: the item, its document, its values, its usage."""

    item_id: int
    document_id: int | None
    file: str
    sha256: str
    status: str
    attempts: int  # runs since the item was created or last retried
    failed_runs: int  # every failed run, retries of failed items included
    fields: dict[str, Any]
    field_errors: dict[str, str]
    error: str | None
    usage: Usage
    extractor: str | None = None
    response_id: str | None = None
    # field -> {page, quote, confidence, verified, source}; fields with a value only
    evidence: dict[str, dict[str, Any]] = field(default_factory=dict)
    flagged: tuple[str, ...] = ()  # fields whose quote is not in the source text
    # field -> the newest review of its value; ``fields`` holds the reviewed values,
    # ``extracted`` what the extractor gave (the two differ where a value was corrected)
    reviews: dict[str, Review] = field(default_factory=dict)
    extracted: dict[str, Any] = field(default_factory=dict)
    # rules+llm: {status, asked, filled, error}, what came of asking the model
    llm_fill: dict[str, Any] | None = None

    @property
    def corrected(self) -> tuple[str, ...]:
        return tuple(f for f, r in self.reviews.items() if r.action == "corrected")

    def as_dict(self) -> dict[str, Any]:
        return {
            "item_id": self.item_id,
            "document_id": self.document_id,
            "file": self.file,
            "sha256": self.sha256,
            "status": self.status,
            "attempts": self.attempts,
            "failed_runs": self.failed_runs,
            "fields": self.fields,
            "field_errors": self.field_errors,
            "evidence": self.evidence,
            "flagged": list(self.flagged),
            "corrected": list(self.corrected),
            "reviews": {f: r.as_dict() for f, r in self.reviews.items()},
            "error": self.error,
            "usage": self.usage.as_dict(),
            "llm_fill": self.llm_fill,
        }


@dataclass(frozen=True, slots=True)
class ResultsPage:
    lines: tuple[ResultLine, ...]
    next_cursor: int | None
    fields: tuple[str, ...] = field(default=())


def check_upload(upload: Upload, *, where: str = "filename") -> NewDocument:
    """The document an upload becomes; InvalidInput names what is wrong with it."""
    name = upload.filename
    if not isinstance(name, str) or not name.strip():
        raise InvalidInput(where, "a file name is required (it says the format: .pdf, .txt, .md)")
    name = Path(name.replace("\\", "/")).name.strip()
    if not name or len(name) > MAX_FILENAME or any(ord(c) < 32 for c in name):
        raise InvalidInput(
            where, f"must be 1-{MAX_FILENAME} printable characters, got {upload.filename!r:.80}"
        )
    suffix = Path(name).suffix.lower()
    if suffix not in EXTENSIONS:
        raise InvalidInput(
            where,
            f"{name!r:.80} is not a supported file type; send PDF, plain text or Markdown "
            f"({', '.join(sorted(EXTENSIONS))})",
        )
    if not upload.content:
        raise InvalidInput("body" if where == "filename" else where, f"{name!r:.80} is empty")
    if len(upload.content) > MAX_DOCUMENT_BYTES:
        raise InvalidInput(
            "body" if where == "filename" else where,
            f"{name!r:.80} has {len(upload.content)} bytes, over the cap of {MAX_DOCUMENT_BYTES}",
        )
    return NewDocument(
        sha256=hashlib.sha256(upload.content).hexdigest(),
        filename=name,
        format=EXTENSIONS[suffix],
        content=upload.content,
    )


class Workbench:
    """Documents, templates and extraction tasks over one shoal :class:`Batches`;
    runs of the flow over its :class:`Workflows`, when given one."""

    def __init__(
        self, batches: Batches, store: ExtractStore, *, workflows: Workflows | None = None
    ) -> None:
        self.batches = batches
        self.store = store
        # The flow's runs (start_run, finish_review); None: tasks only.
        self.workflows = workflows
        self.gate = ModelGate(store, store.clock)  # to show the model budgets

    # -- documents ---------------------------------------------------------------------

    async def upload(self, uploads: Sequence[Upload]) -> list[DocumentRow]:
        """Store uploaded files, all or none: one invalid file and nothing is written."""
        where = "filename" if len(uploads) == 1 else "files[{}]"
        docs = [check_upload(u, where=where.format(i)) for i, u in enumerate(uploads)]
        return await self.store.insert_documents(docs)

    async def import_folder(self, folder: Path) -> ImportReport:
        """Every PDF, text and Markdown file under ``folder`` (recursively), deduplicated."""
        uploads, skipped = await asyncio.to_thread(_read_folder, folder)
        if not uploads:
            raise InvalidInput("folder", f"{str(folder)!r} holds no PDF, text or Markdown file")
        docs = [check_upload(u, where=u.filename) for u in uploads]
        rows = await self.store.insert_documents(docs)
        return ImportReport(tuple(rows), tuple(skipped))

    async def documents(self, *, cursor: int = 0, limit: int = 100) -> list[DocumentRow]:
        return await self.store.list_documents(after_id=cursor, limit=limit)

    async def page_image(
        self, document_id: int, page: int, *, scale: float = DEFAULT_SCALE
    ) -> tuple[DocumentRow, bytes]:
        """Page ``page`` of a stored PDF as a PNG (see :mod:`shoal_extract.page_view`)."""
        row, content = await self._pdf(document_id)
        return row, await asyncio.to_thread(render_page, content, page, scale=scale)

    async def quote_on_page(self, document_id: int, page: int, quote: str) -> Highlight:
        """The boxes of ``quote`` on page ``page`` of a stored PDF; none if it is not there."""
        _, content = await self._pdf(document_id)
        return await asyncio.to_thread(quote_boxes, content, page, quote)

    async def _pdf(self, document_id: int) -> tuple[DocumentRow, bytes]:
        found = await self.store.document_content(document_id)
        if found is None:
            raise NotFound(f"no document {document_id}", field="document_id")
        if found.row.format is not DocumentFormat.PDF:
            raise InvalidInput(
                "document_id",
                f"document {document_id} ({found.row.filename!r:.80}) is "
                f"{found.row.format.value}, not a PDF: it has no pages to render",
            )
        return found.row, found.content

    async def all_documents(self) -> list[DocumentRow]:
        rows: list[DocumentRow] = []
        while True:
            page = await self.store.list_documents(after_id=rows[-1].id if rows else 0, limit=1000)
            rows.extend(page)
            if len(page) < 1000:
                return rows

    # -- tasks -------------------------------------------------------------------------

    async def template(self, name: object) -> StoredTemplate:
        if not isinstance(name, str) or not name:
            raise InvalidInput("template", f"must be a template name, got {name!r:.80}")
        stored = await self.store.template_by_name(name)
        if stored is None:
            known = ", ".join(t.template.name for t in await self.store.latest_templates())
            raise InvalidInput("template", f"unknown template {name!r:.80}; known: {known}")
        return stored

    async def plan(
        self,
        document_ids: Sequence[int],
        template: str,
        *,
        extractor: str = DEFAULT_EXTRACTOR,
        template_version: int | None = None,
        rerun_of: str | None = None,
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The items and params of a task over ``document_ids``; checked, nothing written.

        The newest version of ``template`` unless ``template_version`` names one.
        """
        if extractor not in EXTRACTORS:
            raise InvalidInput(
                "extractor", f"must be one of {', '.join(EXTRACTORS)}, got {extractor!r:.40}"
            )
        ids = _document_ids(document_ids)
        stored = await self.template(template)
        if template_version is not None and template_version != stored.version:
            older = await self.store.template_version(stored.template.name, template_version)
            if older is None:
                raise InvalidInput(
                    "template_version",
                    f"template {stored.template.name!r} has no version {template_version!r:.20} "
                    f"(versions 1-{stored.version})",
                )
            stored = older
        found = await self.store.documents_by_id(ids)
        for i, doc_id in enumerate(ids):
            if doc_id not in found:
                raise InvalidInput(f"document_ids[{i}]", f"no document {doc_id}")
        items: list[dict[str, Any]] = [
            {
                "ref": f"{doc_id}:{found[doc_id].filename}"[:MAX_REF],
                "data": {"document_id": doc_id},
            }
            for doc_id in ids
        ]
        params: dict[str, Any] = {**template_payload(stored), "extractor": extractor}
        if rerun_of is not None:
            params["rerun_of"] = rerun_of
        return items, params

    async def start(
        self,
        document_ids: Sequence[int],
        template: str,
        *,
        extractor: str = DEFAULT_EXTRACTOR,
        idempotency_key: str | None = None,
        template_version: int | None = None,
        rerun_of: str | None = None,
    ) -> Created:
        """One extraction task over ``document_ids``: task, items and jobs in one transaction.

        The newest version of ``template`` unless ``template_version`` names one.
        Nothing waits for its review: :meth:`start_run` runs the whole flow.
        """
        items, params = await self.plan(
            document_ids,
            template,
            extractor=extractor,
            template_version=template_version,
            rerun_of=rerun_of,
        )
        return await self.batches.create(
            KIND, items, params=params, idempotency_key=idempotency_key
        )

    # -- the flow as one workflow ------------------------------------------------------

    def _workflows(self) -> Workflows:
        if self.workflows is None:
            raise InvalidInput(
                "workflow",
                "this workbench was opened without the workflow API "
                "(Workbench(batches, store, workflows=app.workflows(boss)))",
            )
        return self.workflows

    async def start_run(
        self,
        document_ids: Sequence[int],
        template: str,
        *,
        extractor: str = DEFAULT_EXTRACTOR,
        review_timeout: timedelta = DEFAULT_REVIEW_TIMEOUT,
        run_id: str | None = None,
    ) -> Started:
        """Start the whole flow over stored documents as one run of workflow ``extraction``.

        The run extracts them (one task, as :meth:`start`), waits for
        :meth:`finish_review` (or ``review_timeout``), then writes the export.
        Checked before anything is written; idempotent by ``run_id``.
        """
        workflows = self._workflows()
        request = FlowInput(
            template,
            extractor,
            review_timeout,
            document_ids=tuple(_document_ids(document_ids)),
        )
        await self.plan(document_ids, template, extractor=extractor)  # refuse bad input now
        return await workflows.start(FLOW, request.as_data(), id=run_id)

    async def start_folder_run(
        self,
        folder: Path,
        template: str,
        *,
        extractor: str = DEFAULT_EXTRACTOR,
        review_timeout: timedelta = DEFAULT_REVIEW_TIMEOUT,
        run_id: str | None = None,
    ) -> Started:
        """:meth:`start_run` over the files of ``folder``, imported by the run's first step."""
        workflows = self._workflows()
        if not await asyncio.to_thread(folder.is_dir):
            raise InvalidInput("folder", f"{str(folder)!r} is not a folder")
        where = await asyncio.to_thread(folder.resolve)
        request = FlowInput(template, extractor, review_timeout, folder=str(where))
        await self.template(template)
        return await workflows.start(FLOW, request.as_data(), id=run_id)

    async def run(self, run_id: str) -> RunView:
        """A run of the flow and its steps; NotFound for another workflow's run."""
        view = await self._workflows().get(run_id)
        if view.run.name != FLOW:
            raise NotFound(f"no extraction run {run_id!r}", field="run_id")
        return view

    async def finish_review(self, task_id: str, *, reviewer: str) -> str:
        """Say a task's review is done: the run waiting for it exports; the run's id.

        Only a task started by :meth:`start_run`, whose run waits for its
        review now, can be finished (else :class:`~shoal.Conflict`): an
        event sent to nobody would be kept for a wait that never comes.
        """
        view = await self.task(task_id)
        params = view.params if isinstance(view.params, dict) else {}
        run_id = params.get(RUN_PARAM)
        if not isinstance(run_id, str):
            raise InvalidInput(
                "task_id",
                f"task {view.task_id} was started on its own, not as a run of the flow "
                "(POST /v1/extraction/runs): nothing waits for its review",
            )
        run = (await self._workflows().get(run_id)).run
        key = review_key(view.task_id)
        if run.status is not RunStatus.WAITING or run.wait_key != key:
            still = run.finished_at is None and run.wait_key != key
            raise Conflict(
                f"run {run_id} of task {view.task_id} is {run.status.value} and does not wait "
                "for its review"
                + (" yet: its documents are still being extracted" if still else ""),
                field="task_id",
            )
        await self._workflows().signal(key, {"reviewer": reviewer})
        return run_id

    async def rerun(
        self,
        task_id: str,
        documents: Sequence[int] | str,
        *,
        template: str | None = None,
        template_version: int | None = None,
        extractor: str | None = None,
        idempotency_key: str | None = None,
    ) -> tuple[Created, list[int]]:
        """Extract some documents of a task again, as a new task; its id and the documents.

        ``documents`` is ``"failed"`` (the task's documents in error) or ids of
        documents in the task. The template (its newest version unless
        ``template_version`` names one) and the extractor default to the
        task's. The task itself is left as it is: its results, and the reviews
        of them, stay what they were; the new task says which it re-runs.
        """
        view = await self.task(task_id)
        params = view.params if isinstance(view.params, dict) else {}
        rows = await self.batches.export_rows(view.task_id)
        in_task = {
            r.data["document_id"]: r
            for r in rows
            if isinstance(r.data, dict) and isinstance(r.data.get("document_id"), int)
        }
        if documents == "failed":
            ids = [d for d, r in in_task.items() if r.status.value == "error"]
            if not ids:
                raise InvalidInput("documents", f"task {view.task_id} has no failed documents")
        elif isinstance(documents, str):
            raise InvalidInput(
                "documents", f'must be "failed" or a list of document ids, got {documents!r:.40}'
            )
        else:
            ids = _document_ids(documents)
            for i, doc_id in enumerate(ids):
                if doc_id not in in_task:
                    raise InvalidInput(
                        f"documents[{i}]", f"document {doc_id} is not in task {view.task_id}"
                    )
        if template is None:
            template = str(params.get("template", ""))
            if template_version is None and isinstance(params.get("template_version"), int):
                template_version = params["template_version"]
        created = await self.start(
            ids,
            template,
            extractor=extractor or str(params.get("extractor", DEFAULT_EXTRACTOR)),
            idempotency_key=idempotency_key,
            template_version=template_version,
            rerun_of=view.task_id,
        )
        return created, ids

    async def review(
        self,
        task_id: str,
        item_id: object,
        field_name: object,
        action: object,
        *,
        reviewer: str,
        value: Any = None,
    ) -> Review:
        """Accept one extracted value, or correct it to ``value``; stored with who and when.

        The value must be of its field's type (``None``: the paper does not
        state it). Only a completed document's values can be reviewed.
        """
        if action not in REVIEW_ACTIONS:
            raise InvalidInput("action", f"must be accept or correct, got {action!r:.40}")
        if not reviewer or len(reviewer) > MAX_REVIEWER:
            raise InvalidInput("reviewer", f"must be 1-{MAX_REVIEWER} characters")
        view = await self.task(task_id)
        if isinstance(item_id, bool) or not isinstance(item_id, int) or not 0 < item_id < 2**63:
            raise InvalidInput("item_id", f"must be an item id, got {item_id!r:.40}")
        page = await self.batches.items(view.task_id, cursor=item_id - 1, limit=1)
        item = page.items[0] if page.items and page.items[0].id == item_id else None
        if item is None:
            raise InvalidInput("item_id", f"task {view.task_id} has no item {item_id}")
        if item.status.value != "completed":
            raise InvalidInput(
                "item_id",
                f"item {item_id} is {item.status.value}: only completed values are reviewed",
            )
        stored = await self._stored_template(view)
        if stored is None:
            raise InvalidInput("task_id", f"task {view.task_id} names no stored template")
        spec = next((f for f in stored.template.fields if f.name == field_name), None)
        if spec is None:
            raise InvalidInput(
                "field",
                f"{field_name!r:.80} is not a field of {stored.template.name} "
                f"v{stored.version}; its fields: {', '.join(stored.template.field_names)}",
            )
        result = item.result if isinstance(item.result, dict) else {}
        original = (result.get("fields") or {}).get(spec.name)
        if action == "accept":
            value = original
        elif value is not None:
            why = spec.check_value(value)
            if why:
                raise InvalidInput("value", f"{spec.name}: {why}")
        data = item.data if isinstance(item.data, dict) else {}
        return await self.store.insert_review(
            NewReview(
                task_id=view.task_id,
                item_id=item_id,
                document_id=int(data["document_id"]),
                template_id=stored.id,
                field=spec.name,
                action=REVIEW_ACTIONS[str(action)],
                original=original,
                value=value,
                reviewer=reviewer,
            )
        )

    async def reviewed_key(self, task_id: str) -> dict[str, KeyEntry]:
        """The reviewed values of every task of this task's template, as a key to score with.

        A value a person accepted or corrected is the truth for that document
        and field; fields nobody reviewed are not scored.
        """
        view = await self.task(task_id)
        stored = await self._stored_template(view)
        if stored is None:
            return {}
        reviewed = await self.store.reviews_of_template(stored.template.name)
        return {
            sha: KeyEntry(file=file, sha256=sha, expected="completed", fields=values)
            for sha, (file, values) in reviewed.items()
        }

    async def tasks(self, *, limit: int = 50) -> list[TaskView]:
        """The newest extraction tasks (shoal tasks of this kind), newest first."""
        views = await self.batches.tasks(limit=500)
        return [v for v in views if v.kind == KIND][:limit]

    async def task(self, task_id: str) -> TaskView:
        view = await self.batches.get(task_id)
        if view.kind != KIND:
            raise InvalidInput("task_id", f"task {task_id} is not an extraction task")
        return view

    async def results(
        self,
        task_id: str,
        *,
        cursor: int | None = None,
        limit: int = 100,
        status: str | None = None,
    ) -> ResultsPage:
        view = await self.task(task_id)
        page = await self.batches.items(view.task_id, status=status, cursor=cursor, limit=limit)
        return ResultsPage(
            tuple(await self._lines(view, page.items)),
            page.next_cursor,
            await self._field_names(view),
        )

    async def all_results(self, task_id: str) -> ResultsPage:
        view = await self.task(task_id)
        rows = await self.batches.export_rows(view.task_id)
        return ResultsPage(
            tuple(await self._lines(view, rows)), None, await self._field_names(view)
        )

    async def budget(self) -> list[BudgetState]:
        """Each model's shared budget: a pause in force, the rate buckets."""
        return await self.gate.states()

    async def usage(self, task_id: str) -> Usage:
        total = Usage()
        for usage in (await self.store.usage_by_item(task_id)).values():
            total = total + usage
        return total

    async def evaluate(self, task_id: str, key: dict[str, KeyEntry]) -> Report:
        """Per-field accuracy of a task's results against a key file."""
        page = await self.all_results(task_id)
        # The extractor is scored on what it extracted, never on a person's corrections.
        rows = [ResultRow(r.sha256, r.file, r.status, r.extracted) for r in page.lines]
        return score(rows, key, page.fields)

    async def _stored_template(self, view: TaskView) -> StoredTemplate | None:
        params = view.params if isinstance(view.params, dict) else {}
        template_id = params.get("template_id")
        if isinstance(template_id, bool) or not isinstance(template_id, int):
            return None
        return await self.store.template_by_id(template_id)

    async def _field_names(self, view: TaskView) -> tuple[str, ...]:
        stored = await self._stored_template(view)
        return stored.template.field_names if stored else ()

    async def _lines(self, view: TaskView, items: Sequence[Any]) -> list[ResultLine]:
        doc_ids = [
            i.data["document_id"]
            for i in items
            if isinstance(i.data, dict) and isinstance(i.data.get("document_id"), int)
        ]
        docs = await self.store.documents_by_id(doc_ids) if doc_ids else {}
        usage = await self.store.usage_by_item(view.task_id)
        reviews = await self.store.reviews_of_task(view.task_id)
        lines = []
        for item in items:
            data = item.data if isinstance(item.data, dict) else {}
            doc = docs.get(data.get("document_id", -1))
            result = item.result if isinstance(item.result, dict) else {}
            extracted = dict(result.get("fields") or {})
            reviewed = reviews.get(item.id, {}) if item.status.value == "completed" else {}
            lines.append(
                ResultLine(
                    item_id=item.id,
                    document_id=doc.id if doc else None,
                    file=doc.filename if doc else item.ref,
                    sha256=doc.sha256 if doc else "",
                    status=item.status.value,
                    attempts=item.attempts,
                    failed_runs=len(item.errors),
                    fields=extracted | {f: r.value for f, r in reviewed.items()},
                    field_errors=dict(result.get("field_errors") or {}),
                    error=item.error,
                    usage=usage.get(item.id, Usage()),
                    extractor=result.get("extractor"),
                    response_id=result.get("response_id"),
                    evidence=dict(result.get("evidence") or {}),
                    flagged=tuple(result.get("flagged") or ()),
                    reviews=reviewed,
                    extracted=extracted,
                    llm_fill=result.get("llm_fill"),
                )
            )
        return lines


def _read_folder(folder: Path) -> tuple[list[Upload], list[str]]:
    """The readable files under ``folder`` and the names of the others."""
    if not folder.is_dir():
        raise InvalidInput("folder", f"{str(folder)!r} is not a folder")
    uploads: list[Upload] = []
    skipped: list[str] = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        if path.suffix.lower() in EXTENSIONS and path.stat().st_size > 0:
            uploads.append(Upload(path.name, path.read_bytes()))
        else:
            skipped.append(str(path.relative_to(folder)))
    return uploads, skipped


def _document_ids(raw: object) -> list[int]:
    if not isinstance(raw, Sequence) or isinstance(raw, str | bytes):
        raise InvalidInput("document_ids", "must be a list of document ids")
    if not raw:
        raise InvalidInput("document_ids", "is empty: pick at least one document")
    if len(raw) > MAX_TASK_DOCUMENTS:
        raise InvalidInput(
            "document_ids", f"has {len(raw)} entries, over the cap of {MAX_TASK_DOCUMENTS}"
        )
    seen: set[int] = set()
    ids = []
    for i, value in enumerate(raw):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**63:
            raise InvalidInput(f"document_ids[{i}]", f"must be a document id, got {value!r:.40}")
        if value in seen:
            raise InvalidInput(f"document_ids[{i}]", f"duplicate document id {value}")
        seen.add(value)
        ids.append(value)
    return ids


__all__ = [
    "ImportReport",
    "ResultLine",
    "ResultsPage",
    "Upload",
    "Workbench",
    "check_upload",
]
