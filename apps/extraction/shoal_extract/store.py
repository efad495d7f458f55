"""The workbench's SQL: documents, templates, model calls. One typed function per query.

Statements live in ``queries.sql`` (``-- name: x`` blocks, ``{schema}`` bound
as an identifier once). Values are always bound parameters. Rows come back
as frozen dataclasses.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from importlib import resources
from typing import Any

from psycopg import sql

from shoal import Clock, Database, SystemClock
from shoal_extract.extractors.base import CallRecord, Usage
from shoal_extract.parsing import PARSER_VERSION, DocumentFormat, ParsedText
from shoal_extract.schema import DEFAULT_SCHEMA, AsyncConn
from shoal_extract.templates import StoredTemplate, Template, parse_template

_BLOCK = re.compile(r"^-- name: ([a-z_]+)\s*$", re.MULTILINE)
# Bytes per insert statement when importing many files: a folder of large PDFs
# goes in several statements rather than one of unbounded size.
MAX_INSERT_BYTES = 32 * 1024 * 1024


def load_queries(schema: str) -> dict[str, sql.Composed]:
    text = resources.files("shoal_extract").joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _BLOCK.split(text)
    queries: dict[str, sql.Composed] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise RuntimeError(f"shoal_extract/queries.sql defines {name!r} twice")
        statement = body.strip().rstrip(";")
        queries[name] = sql.SQL(statement).format(schema=sql.Identifier(schema))
    return queries


@dataclass(frozen=True, slots=True)
class NewDocument:
    sha256: str
    filename: str
    format: DocumentFormat
    content: bytes


@dataclass(frozen=True, slots=True)
class DocumentRow:
    id: int
    sha256: str
    filename: str
    format: DocumentFormat
    size_bytes: int
    created_at: datetime
    created: bool  # inserted by this call (False: the same bytes were stored before)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "sha256": self.sha256,
            "filename": self.filename,
            "format": self.format.value,
            "size_bytes": self.size_bytes,
            "created_at": self.created_at.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class DocumentContent:
    row: DocumentRow
    content: bytes


@dataclass(frozen=True, slots=True)
class CallFor:
    """Which item a model call was made for."""

    task_id: str
    item_id: int
    attempt: int
    document_id: int


def _document(row: Sequence[Any]) -> DocumentRow:
    return DocumentRow(
        id=row[0],
        sha256=row[1],
        filename=row[2],
        format=DocumentFormat(row[3]),
        size_bytes=row[4],
        created_at=row[5],
        created=bool(row[6]),
    )


def _template(row: Sequence[Any]) -> StoredTemplate:
    raw = {"name": row[1], "description": row[3], "fields": row[4]}
    return StoredTemplate(id=row[0], version=row[2], template=parse_template(raw))


class ExtractStore:
    """Every statement the workbench runs, over shoal's :class:`~shoal.Database` pool."""

    def __init__(
        self, db: Database, *, schema: str = DEFAULT_SCHEMA, clock: Clock | None = None
    ) -> None:
        self.db = db
        self.schema = schema
        self.clock = clock or SystemClock()
        self.q = load_queries(schema)

    # -- documents ---------------------------------------------------------------------

    async def insert_documents(self, docs: Sequence[NewDocument]) -> list[DocumentRow]:
        """Store ``docs``, deduplicated by SHA-256: one row per distinct file, in order."""
        distinct = list({d.sha256: d for d in reversed(docs)}.values())[::-1]
        rows: list[DocumentRow] = []
        for chunk in _chunks(distinct, MAX_INSERT_BYTES):
            found = await self.db.fetch(
                self.q["insert_documents"],
                {
                    "sha256": [d.sha256 for d in chunk],
                    "filename": [d.filename for d in chunk],
                    "format": [d.format.value for d in chunk],
                    "content": [d.content for d in chunk],
                    "now": self.clock.sql_now(),
                },
            )
            got = {r[1]: _document(r) for r in found if r[0] is not None}
            missing = [d.sha256 for d in chunk if d.sha256 not in got]
            if missing:
                # Committed by a concurrent import after this statement's snapshot.
                for r in await self.db.fetch(self.q["documents_by_sha"], {"sha256": missing}):
                    got[r[1]] = _document(r)
            rows.extend(got[d.sha256] for d in chunk)
        return rows

    async def list_documents(self, *, after_id: int = 0, limit: int = 100) -> list[DocumentRow]:
        found = await self.db.fetch(
            self.q["list_documents"], {"after_id": after_id, "limit": limit}
        )
        return [_document(r) for r in found]

    async def documents_by_id(self, ids: Sequence[int]) -> dict[int, DocumentRow]:
        found = await self.db.fetch(self.q["documents_by_id"], {"ids": list(ids)})
        return {r[0]: _document(r) for r in found}

    async def document_content(self, document_id: int) -> DocumentContent | None:
        found = await self.db.fetch(self.q["document_content"], {"id": document_id})
        if not found:
            return None
        return DocumentContent(_document(found[0]), bytes(found[0][7]))

    # -- parsed text -------------------------------------------------------------------

    async def parsed_text(self, sha256: str) -> ParsedText | None:
        """The stored parse of the document with these bytes, by the current parser."""
        found = await self.db.fetch(
            self.q["parsed_text"], {"sha256": sha256, "parser_version": PARSER_VERSION}
        )
        return ParsedText.from_dict(found[0][0]) if found else None

    async def store_parsed(self, sha256: str, parsed: ParsedText) -> None:
        await self.db.fetch(
            self.q["store_parsed"],
            {
                "sha256": sha256,
                "parser_version": PARSER_VERSION,
                "parsed": json.dumps(parsed.as_dict(), ensure_ascii=False),
                "pages": parsed.pages,
                "ocr_pages": len(parsed.ocr_pages),
                "now": self.clock.sql_now(),
            },
        )

    async def parse_count(self, sha256s: Sequence[str]) -> int:
        found = await self.db.fetch(self.q["parse_count"], {"sha256": list(sha256s)})
        return int(found[0][0])

    # -- templates ---------------------------------------------------------------------

    async def save_template(self, template: Template) -> tuple[StoredTemplate, bool]:
        """Store ``template`` as a new version unless its newest version is the same.

        Returns the stored version and whether this call created it. Saves of
        one name are serialised by an advisory lock, so racing saves never
        collide on a version number.
        """
        fields = json.dumps([f.as_dict() for f in template.fields])

        async def save(conn: AsyncConn) -> tuple[StoredTemplate, bool]:
            await conn.execute(self.q["lock_template_name"], {"name": template.name})
            cur = await conn.execute(self.q["latest_template"], {"name": template.name})
            latest = await cur.fetchone()
            if latest is not None:
                stored = _template(latest)
                if stored.template == template:
                    return stored, False
            cur = await conn.execute(
                self.q["insert_template"],
                {
                    "name": template.name,
                    "version": 1 if latest is None else latest[2] + 1,
                    "description": template.description,
                    "fields": fields,
                    "now": self.clock.sql_now(),
                },
            )
            row = await cur.fetchone()
            assert row is not None
            return _template(row), True

        return await self.db.run(save)

    async def latest_templates(self) -> list[StoredTemplate]:
        return [_template(r) for r in await self.db.fetch(self.q["latest_templates"], {})]

    async def template_by_name(self, name: str) -> StoredTemplate | None:
        found = await self.db.fetch(self.q["latest_template"], {"name": name})
        return _template(found[0]) if found else None

    async def template_by_id(self, template_id: int) -> StoredTemplate | None:
        found = await self.db.fetch(self.q["template_by_id"], {"id": template_id})
        return _template(found[0]) if found else None

    async def template_version(self, name: str, version: int) -> StoredTemplate | None:
        found = await self.db.fetch(self.q["template_version"], {"name": name, "version": version})
        return _template(found[0]) if found else None

    # -- reviews -----------------------------------------------------------------------

    async def insert_review(self, review: NewReview) -> Review:
        found = await self.db.fetch(
            self.q["insert_review"],
            {
                "task_id": review.task_id,
                "item_id": review.item_id,
                "document_id": review.document_id,
                "template_id": review.template_id,
                "field": review.field,
                "action": review.action,
                "original": json.dumps(review.original, ensure_ascii=False),
                "value": json.dumps(review.value, ensure_ascii=False),
                "reviewer": review.reviewer,
                "now": self.clock.sql_now(),
            },
        )
        return _review(found[0])

    async def reviews_of_task(self, task_id: str) -> dict[int, dict[str, Review]]:
        """The newest review of each value of a task: item id -> field -> review."""
        found = await self.db.fetch(self.q["reviews_of_task"], {"task_id": task_id})
        reviews: dict[int, dict[str, Review]] = {}
        for row in found:
            review = _review(row)
            reviews.setdefault(review.item_id, {})[review.field] = review
        return reviews

    async def reviews_of_template(self, name: str) -> dict[str, tuple[str, dict[str, Any]]]:
        """Reviewed values of every task of template ``name``: sha256 -> (file, field -> value)."""
        found = await self.db.fetch(self.q["reviews_of_template"], {"name": name})
        key: dict[str, tuple[str, dict[str, Any]]] = {}
        for sha256, filename, field_name, value in found:
            key.setdefault(sha256, (filename, {}))[1][field_name] = value
        return key

    # -- model results -----------------------------------------------------------------

    async def cached_result(
        self, sha256: str, template_id: int, model: str
    ) -> dict[str, Any] | None:
        found = await self.db.fetch(
            self.q["cached_result"],
            {
                "sha256": sha256,
                "parser_version": PARSER_VERSION,
                "template_id": template_id,
                "model": model,
            },
        )
        return dict(found[0][0]) if found else None

    async def store_result(
        self, sha256: str, template_id: int, model: str, extraction: Mapping[str, Any]
    ) -> None:
        await self.db.fetch(
            self.q["store_result"],
            {
                "sha256": sha256,
                "parser_version": PARSER_VERSION,
                "template_id": template_id,
                "model": model,
                "extraction": json.dumps(extraction, ensure_ascii=False),
                "now": self.clock.sql_now(),
            },
        )

    # -- model calls -------------------------------------------------------------------

    async def record_call(self, call: CallFor, record: CallRecord) -> None:
        await self.db.fetch(
            self.q["record_call"],
            {
                "task_id": call.task_id,
                "item_id": call.item_id,
                "attempt": call.attempt,
                "document_id": call.document_id,
                "model": record.model,
                "outcome": record.outcome,
                "prompt_tokens": record.usage.prompt_tokens,
                "completion_tokens": record.usage.completion_tokens,
                "cost_usd": Decimal(str(record.usage.cost_usd)),
                "response_id": record.response_id,
                "now": self.clock.sql_now(),
            },
        )

    async def usage_by_item(self, task_id: str) -> dict[int, Usage]:
        found = await self.db.fetch(self.q["usage_by_item"], {"task_id": task_id})
        return {
            r[0]: Usage(
                calls=r[1],
                prompt_tokens=r[2],
                completion_tokens=r[3],
                cost_usd=float(r[4]),
                cached=r[5],
                paused=r[6],
            )
            for r in found
        }


@dataclass(frozen=True, slots=True)
class NewReview:
    task_id: str
    item_id: int
    document_id: int
    template_id: int
    field: str
    action: str  # accepted | corrected
    original: Any
    value: Any
    reviewer: str


@dataclass(frozen=True, slots=True)
class Review:
    """A person's verdict on one value: who, when, what was extracted, what stands."""

    id: int
    item_id: int
    field: str
    action: str  # accepted | corrected
    original: Any
    value: Any
    reviewer: str
    at: datetime

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "item_id": self.item_id,
            "field": self.field,
            "action": self.action,
            "original": self.original,
            "value": self.value,
            "reviewer": self.reviewer,
            "at": self.at.isoformat(),
        }


def _review(row: Sequence[Any]) -> Review:
    return Review(
        id=row[0],
        item_id=row[1],
        field=row[2],
        action=row[3],
        original=row[4],
        value=row[5],
        reviewer=row[6],
        at=row[7],
    )


def _chunks(docs: Sequence[NewDocument], max_bytes: int) -> list[list[NewDocument]]:
    chunks: list[list[NewDocument]] = []
    size = 0
    for doc in docs:
        if not chunks or size + len(doc.content) > max_bytes:
            chunks.append([])
            size = 0
        chunks[-1].append(doc)
        size += len(doc.content)
    return chunks


def template_payload(stored: StoredTemplate) -> Mapping[str, Any]:
    """What a task's params say about its template."""
    return {
        "template_id": stored.id,
        "template": stored.template.name,
        "template_version": stored.version,
    }


__all__ = [
    "CallFor",
    "DocumentContent",
    "DocumentRow",
    "ExtractStore",
    "NewDocument",
    "NewReview",
    "Review",
    "template_payload",
]
