"""The batch and ingest layers reach the queue's tables only through the queue's functions.

What each layer's statements run (its ``queries.sql`` and ``inspect.sql``,
and the database functions those call, followed through the functions of the
layer's own migrations) never names a table the queue's migrations create:
where it needs jobs it calls a function of the queue layer (the contract,
docs/architecture.md). Functions of released migrations that no statement
calls any more are not checked: they stay for the workers of that release.
"""

from __future__ import annotations

import re
from importlib import resources

import pytest

from shoal.db.migrate import load_migrations

_CREATE_TABLE = re.compile(r"CREATE TABLE \{schema\}\.(\w+)")
_CREATE_FUNCTION = re.compile(r"CREATE (?:OR REPLACE )?FUNCTION \{schema\}\.(\w+)\(")
_NAMED = re.compile(r"\{schema\}\.(\w+)")
_COMMENT = re.compile(r"--[^\n]*")


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
    """Each database function's latest definition: name -> (layer package, body)."""
    found: dict[str, tuple[str, str]] = {}
    for m in load_migrations():
        for match in _CREATE_FUNCTION.finditer(m.text):
            start = m.text.index("$$", match.end()) + 2
            body = m.text[start : m.text.index("$$", start)]
            found[match[1]] = (m.package, _code(body))
    return found


def _layer_sql(layer: str) -> dict[str, str]:
    return {
        f"shoal/{layer}/{entry.name}": entry.read_text(encoding="utf-8")
        for entry in resources.files(f"shoal.{layer}").iterdir()
        if entry.name.endswith(".sql")
    }


def _reach(statements: dict[str, str]) -> dict[str, set[str]]:
    """Where these statements, or the non-queue functions they call, name a queue table."""
    tables = _queue_tables()
    functions = _functions()
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
            if owner is not None and owner[0] != "shoal.queue.migrations":
                seen.add(name)
                texts[f"function {name} ({owner[0]})"] = owner[1]
    return found


@pytest.mark.parametrize("layer", ["batch", "ingest"])
def test_a_layer_above_the_queue_names_no_queue_table_in_what_it_runs(layer: str) -> None:
    statements = _layer_sql(layer)
    assert "queries.sql" in " ".join(statements)
    assert _reach(statements) == {}


def test_the_check_finds_a_queue_table_named_directly_or_through_a_layers_own_function() -> None:
    # claim_messages_v1, an ingest function of an earlier migration, updates
    # the job table itself: a statement calling it reaches the table.
    found = _reach(
        {
            "direct": "-- name: depth\nSELECT count(*) FROM {schema}.job WHERE queue = %(q)s",
            "called": "SELECT * FROM {schema}.claim_messages_v1(%(q)s, 1, NULL, '1 s')",
            "contract": "SELECT * FROM {schema}.claim_jobs_leased_v1(%(q)s, 1, NULL, '1 s')",
            "comment": "-- not {schema}.job\nSELECT 1",
        }
    )
    assert found == {
        "direct": {"job"},
        "function claim_messages_v1 (shoal.ingest.migrations)": {"job", "paused_queue"},
    }
