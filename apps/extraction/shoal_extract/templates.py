"""Templates: named sets of fields to extract from every document of a task.

A field has a name, a type, a description (what an extractor, person or LLM,
is asked for) and ``required``. A required field that an extractor cannot
find is reported as an error of that field; an optional one is simply "not
found". Either way the value is ``None``: extractors never guess.

>>> template = parse_template({"name": "tiny", "fields": [
...     {"name": "title", "type": "string", "description": "The paper's title"}]})
>>> template.field_names
('title',)

Two templates ship: ``clinical_trial`` and ``metadata``. Templates are stored
in versions: saving a name again with different fields makes a new version,
and a task keeps the version it started with.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from shoal import InvalidInput

MAX_FIELDS = 50
MAX_DESCRIPTION = 500
# Anchored for the JSON Schema that shows them; Python matches them whole (fullmatch):
# with .match, "$" also matched before a trailing newline.
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
DOI_PATTERN = re.compile(r"^10\.\d{4,9}/\S+$")
# Years an extracted publication year may take; anything else is a misread.
MIN_YEAR, MAX_YEAR = 1800, 2100


class FieldType(StrEnum):
    STRING = "string"
    """A short string on one line: a title, a journal, a list of authors."""
    TEXT = "text"
    """A sentence or a paragraph: an outcome, a conclusion."""
    INTEGER = "integer"
    """A whole number >= 0: a sample size."""
    YEAR = "year"
    """A four-digit year."""
    DOI = "doi"
    """A DOI, ``10.<registrant>/<suffix>``, without a resolver prefix."""


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    type: FieldType
    description: str
    required: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type.value,
            "description": self.description,
            "required": self.required,
        }

    def json_schema(self) -> dict[str, Any]:
        """The JSON Schema of this field's value (``null`` when not found)."""
        kind: dict[str, Any]
        if self.type is FieldType.INTEGER:
            kind = {"type": "integer", "minimum": 0}
        elif self.type is FieldType.YEAR:
            kind = {"type": "integer", "minimum": MIN_YEAR, "maximum": MAX_YEAR}
        elif self.type is FieldType.DOI:
            kind = {"type": "string", "pattern": DOI_PATTERN.pattern}
        else:
            kind = {"type": "string", "minLength": 1}
        return {"anyOf": [kind, {"type": "null"}], "description": self.description}

    def check_value(self, value: object) -> str | None:
        """Why ``value`` is not a valid value of this field, or None when it is."""
        if value is None:
            return None
        if self.type in (FieldType.INTEGER, FieldType.YEAR):
            if isinstance(value, bool) or not isinstance(value, int):
                return f"expected an integer, got {type(value).__name__} {value!r:.40}"
            if value < 0:
                return f"expected an integer >= 0, got {value}"
            if self.type is FieldType.YEAR and not MIN_YEAR <= value <= MAX_YEAR:
                return f"expected a year from {MIN_YEAR} to {MAX_YEAR}, got {value}"
            return None
        if not isinstance(value, str) or not value.strip():
            return f"expected a non-empty string, got {type(value).__name__} {value!r:.40}"
        if self.type is FieldType.DOI and not DOI_PATTERN.fullmatch(value.strip()):
            return f"expected a DOI like 10.1234/abc, got {value!r:.60}"
        return None


@dataclass(frozen=True, slots=True)
class Template:
    name: str
    fields: tuple[Field, ...]
    description: str = ""

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "fields": [f.as_dict() for f in self.fields],
        }

    def json_schema(self) -> dict[str, Any]:
        """The JSON Schema an answer must match: every field present, null when not found."""
        return {
            "type": "object",
            "properties": {f.name: f.json_schema() for f in self.fields},
            "required": list(self.field_names),
            "additionalProperties": False,
        }


@dataclass(frozen=True, slots=True)
class StoredTemplate:
    """A template as stored: one version of a name."""

    id: int
    version: int
    template: Template

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "version": self.version, **self.template.as_dict()}


def parse_template(raw: object, *, field: str = "template") -> Template:
    """A :class:`Template` from JSON; InvalidInput names the bad entry (``fields[2].type``)."""
    if not isinstance(raw, Mapping):
        raise InvalidInput(field, "must be an object with name, description and fields")
    unknown = set(raw) - {"name", "description", "fields"}
    if unknown:
        raise InvalidInput(f"{_at(field, sorted(unknown)[0])}", "unknown field")
    name = raw.get("name")
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise InvalidInput(
            _at(field, "name"),
            f"must be 1-63 characters of a-z, 0-9 and _, starting with a letter, got {name!r:.80}",
        )
    description = raw.get("description", "")
    if not isinstance(description, str) or len(description) > MAX_DESCRIPTION:
        raise InvalidInput(
            _at(field, "description"), f"must be a string of at most {MAX_DESCRIPTION} characters"
        )
    fields = raw.get("fields")
    if not isinstance(fields, Sequence) or isinstance(fields, str | bytes) or not fields:
        raise InvalidInput(_at(field, "fields"), "must be a non-empty list of fields")
    if len(fields) > MAX_FIELDS:
        raise InvalidInput(_at(field, "fields"), f"has {len(fields)} fields, over {MAX_FIELDS}")
    parsed: list[Field] = []
    seen: set[str] = set()
    for i, entry in enumerate(fields):
        where = _at(field, f"fields[{i}]")
        parsed.append(_parse_field(entry, where))
        if parsed[-1].name in seen:
            raise InvalidInput(f"{where}.name", f"duplicate field name {parsed[-1].name!r}")
        seen.add(parsed[-1].name)
    return Template(name=name, fields=tuple(parsed), description=description)


def _parse_field(entry: object, where: str) -> Field:
    if not isinstance(entry, Mapping):
        raise InvalidInput(where, "must be an object with name, type, description, required")
    unknown = set(entry) - {"name", "type", "description", "required"}
    if unknown:
        raise InvalidInput(f"{where}.{sorted(unknown)[0]}", "unknown field")
    name = entry.get("name")
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise InvalidInput(
            f"{where}.name",
            f"must be 1-63 characters of a-z, 0-9 and _, starting with a letter, got {name!r:.80}",
        )
    kind = entry.get("type")
    try:
        field_type = FieldType(str(kind))
    except ValueError:
        raise InvalidInput(
            f"{where}.type", f"must be one of {', '.join(FieldType)}, got {kind!r:.40}"
        ) from None
    description = entry.get("description")
    if not isinstance(description, str) or not description.strip():
        raise InvalidInput(f"{where}.description", "must say what to extract (a non-empty string)")
    if len(description) > MAX_DESCRIPTION:
        raise InvalidInput(f"{where}.description", f"is over {MAX_DESCRIPTION} characters")
    required = entry.get("required", False)
    if not isinstance(required, bool):
        raise InvalidInput(f"{where}.required", f"must be true or false, got {required!r:.40}")
    return Field(name, field_type, description.strip(), required)


def _at(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _field(name: str, kind: FieldType, description: str, required: bool = False) -> Field:
    return Field(name, kind, description, required)


CLINICAL_TRIAL = Template(
    name="clinical_trial",
    description="A randomized controlled trial: bibliographic data and the PICO elements.",
    fields=(
        _field("title", FieldType.STRING, "The paper's full title.", True),
        _field("authors", FieldType.STRING, "All authors, as printed, separated by commas.", True),
        _field("year", FieldType.YEAR, "The year the paper was published.", True),
        _field("journal", FieldType.STRING, "The journal that published the paper."),
        _field("doi", FieldType.DOI, "The paper's own DOI (not one of its references)."),
        _field("sample_size", FieldType.INTEGER, "The number of participants randomized."),
        _field("intervention", FieldType.TEXT, "What the intervention group received."),
        _field("comparator", FieldType.TEXT, "What the control group received."),
        _field("primary_outcome", FieldType.TEXT, "The trial's primary outcome."),
        _field("conclusion", FieldType.TEXT, "The conclusion stated in the abstract."),
    ),
)

METADATA = Template(
    name="metadata",
    description="Bibliographic metadata of any paper.",
    fields=(
        _field("title", FieldType.STRING, "The paper's full title.", True),
        _field("authors", FieldType.STRING, "All authors, as printed, separated by commas."),
        _field("year", FieldType.YEAR, "The year the paper was published.", True),
        _field("journal", FieldType.STRING, "The journal that published the paper."),
        _field("doi", FieldType.DOI, "The paper's own DOI (not one of its references)."),
    ),
)

SHIPPED_TEMPLATES: tuple[Template, ...] = (CLINICAL_TRIAL, METADATA)
DEFAULT_TEMPLATE = CLINICAL_TRIAL.name

__all__ = [
    "CLINICAL_TRIAL",
    "DEFAULT_TEMPLATE",
    "METADATA",
    "SHIPPED_TEMPLATES",
    "Field",
    "FieldType",
    "StoredTemplate",
    "Template",
    "parse_template",
]
