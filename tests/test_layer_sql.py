"""The layers above the queue reach its tables only through the queue's functions.

What each layer's statements run (its ``queries.sql`` and other ``.sql`` files,
and the database functions those call, followed through the live definitions
of the layer's own ``functions.sql``) never names a table the queue's
migrations create: where it needs jobs it calls a function of the queue layer
(the contract, docs/architecture.md). Functions kept only for the workers of
a release, which no statement calls, are not checked.

The contract table of docs/architecture.md is checked against the same walk:
its last column must list exactly the queue functions a layer reaches, and a
function its middle column names must be the latest of its versions.

The console (shoal/console/console.sql) is not held to this: it reads every
layer's tables, and sits above them all (docs/architecture.md).
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest

from shoal.db.migrate import load_migrations

_CREATE_TABLE = re.compile(r"CREATE TABLE \{schema\}\.(\w+)")
_CREATE_FUNCTION = re.compile(r"CREATE (?:OR REPLACE )?FUNCTION \{schema\}\.(\w+)\(")
_NAMED = re.compile(r"\{schema\}\.(\w+)")
_COMMENT = re.compile(r"--[^\n]*")
_QUOTED = re.compile(r"`(\w+)`")
_VERSIONED = re.compile(r"^(\w+)_v(\d+)$")
_STATEMENT = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
ARCHITECTURE = Path(__file__).parent.parent / "docs" / "architecture.md"


def _code(text: str) -> str:
    return _COMMENT.sub("", text)


def _queue_tables() -> set[str]:
    return {
        name
        for m in load_migrations()
        if m.package == "shoal.queue.migrations"
        for name in _CREATE_TABLE.findall(m.text)
    }


def _functions() -> dict[str, tuple[str, str]]:
    """Each database function's live definition (functions.sql): name -> (layer, body)."""
    found: dict[str, tuple[str, str]] = {}
    for layer in ("queue", "batch", "ingest", "workflow"):
        text = resources.files(f"shoal.{layer}").joinpath("functions.sql").read_text()
        for match in _CREATE_FUNCTION.finditer(text):
            start = text.index("$$", match.end()) + 2
            body = text[start : text.index("$$", start)]
            found[match[1]] = (layer, _code(body))
    return found


def _layer_sql(layer: str) -> dict[str, str]:
    return {
        f"shoal/{layer}/{entry.name}": entry.read_text(encoding="utf-8")
        for entry in resources.files(f"shoal.{layer}").iterdir()
        if entry.name.endswith(".sql") and entry.name != "functions.sql"
    }


def _reach(
    statements: dict[str, str], functions: dict[str, tuple[str, str]] | None = None
) -> dict[str, set[str]]:
    """Where these statements, or the non-queue functions they call, name a queue table."""
    tables = _queue_tables()
    functions = _functions() if functions is None else functions
    texts = {place: _code(text) for place, text in statements.items()}
    found: dict[str, set[str]] = {}
    seen: set[str] = set()
    while texts:
        place, text = texts.popitem()
        names = set(_NAMED.findall(text))
        if names & tables:
            found[place] = names & tables
        for name in names - seen:
            owner = functions.get(name)
            # The queue's own functions are the contract; other layers' are followed.
            if owner is not None and owner[0] != "queue":
                seen.add(name)
                texts[f"function {name} ({owner[0]})"] = owner[1]
    return found


@pytest.mark.parametrize("layer", ["batch", "ingest", "workflow"])
def test_a_layer_above_the_queue_names_no_queue_table_in_what_it_runs(layer: str) -> None:
    statements = _layer_sql(layer)
    assert "queries.sql" in " ".join(statements)
    assert _reach(statements) == {}


def test_the_check_finds_a_queue_table_named_directly_or_through_a_layers_own_function() -> None:
    # A batch function that named the job table itself is reached through a
    # statement that calls it; the queue's functions (the contract) are not
    # followed, and a comment names nothing.
    functions = {**_functions(), "peek_v1": ("batch", "SELECT 1 FROM {schema}.job")}
    found = _reach(
        {
            "direct": "-- name: depth\nSELECT count(*) FROM {schema}.job WHERE queue = %(q)s",
            "called": "SELECT {schema}.peek_v1()",
            "contract": "SELECT * FROM {schema}.claim_jobs_leased_v2(%(q)s, 1, NULL, '1 s')",
            "comment": "-- not {schema}.job\nSELECT 1",
        },
        functions,
    )
    assert found == {"direct": {"job"}, "function peek_v1 (batch)": {"job"}}


def _queue_functions_reached(layer: str) -> set[str]:
    """The queue's functions a layer's statements call, directly or through its own functions."""
    functions = _functions()
    texts = {place: _code(text) for place, text in _layer_sql(layer).items()}
    reached: set[str] = set()
    followed: set[str] = set()
    while texts:
        _, text = texts.popitem()
        for name in set(_NAMED.findall(text)):
            owner = functions.get(name)
            if owner is None:
                continue
            if owner[0] == "queue":
                reached.add(name)
            elif name not in followed:
                followed.add(name)
                texts[name] = owner[1]
    return reached


def _contract_rows() -> dict[str, tuple[str, str]]:
    """docs/architecture.md's contract table: layer -> (what it needs, the queue's functions)."""
    rows: dict[str, tuple[str, str]] = {}
    for line in ARCHITECTURE.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 3 and cells[0] not in ("caller", "---"):
            rows[cells[0].split()[0]] = (cells[1], cells[2])
    return rows


@pytest.mark.parametrize("layer", ["batch", "ingest", "workflow"])
def test_the_architecture_page_lists_the_queue_functions_a_layer_calls(layer: str) -> None:
    row = _contract_rows().get(layer)
    assert row is not None, f"docs/architecture.md has no contract row for {layer}"
    listed = set(_QUOTED.findall(row[1]))
    assert listed == _queue_functions_reached(layer), (
        f"docs/architecture.md lists {sorted(listed)} for {layer}; "
        f"its statements reach {sorted(_queue_functions_reached(layer))}"
    )


def test_the_architecture_page_names_the_latest_version_of_a_function() -> None:
    latest: dict[str, int] = {}
    for name in _functions():
        match = _VERSIONED.match(name)
        if match:
            latest[match[1]] = max(latest.get(match[1], 0), int(match[2]))
    named = [n for needs, _ in _contract_rows().values() for n in _QUOTED.findall(needs)]
    versioned = [(n, _VERSIONED.match(n)) for n in named]
    assert any(match for _, match in versioned), "the page names no versioned function"
    stale = [
        name for name, match in versioned if match and latest.get(match[1], 0) != int(match[2])
    ]
    assert not stale, f"docs/architecture.md names superseded functions: {stale}"


def test_no_statement_name_is_defined_in_two_sql_files() -> None:
    # Two statements of one name in two files (list_jobs once did) drift
    # apart unseen: each is read only by its own file's runner.
    where: dict[str, list[str]] = {}
    for layer in ("queue", "batch", "ingest", "workflow", "console"):
        for place, text in _layer_sql(layer).items():
            for name in _STATEMENT.findall(text):
                where.setdefault(name, []).append(place)
    assert {name: places for name, places in where.items() if len(places) > 1} == {}
