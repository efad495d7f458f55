"""Each layer's functions.sql holds the live definition of every function its code calls.

``shoal/queue/functions.sql``, ``shoal/batch/functions.sql`` and
``shoal/ingest/functions.sql`` are where a reader finds the SQL of a hot
path: the migrations create the functions, these files repeat the current
definition of each with its reasons. They are checked here against a
database the migrations built: running a layer's file there must change no
function (same arguments, result, settings and body, to the byte), every
function of the schema must be in exactly one file (but those kept only for
the workers of a released version), each in the file of the layer whose
migrations create it, and every function a layer's statements call must be
in its own file or the queue layer's.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from shoal.db.migrate import load_migrations
from shoal.db.releases import released_versions

LAYERS = ("queue", "batch", "ingest", "workflow")
_DEFINED = re.compile(r"^CREATE OR REPLACE FUNCTION \{schema\}\.(\w+)\(", re.MULTILINE)
_CREATED = re.compile(r"CREATE (?:OR REPLACE )?FUNCTION \{schema\}\.(\w+)\(")
_DROPPED = re.compile(r"DROP FUNCTION (?:IF EXISTS )?\{schema\}\.(\w+)\(")
_CALLED = re.compile(r"(?<!FUNCTION )\{schema\}\.(\w+)\(")
_COMMENT = re.compile(r"--[^\n]*")
_DEFINITIONS = """
SELECT p.proname, pg_get_functiondef(p.oid)
FROM pg_proc p WHERE p.pronamespace = 'shoal'::regnamespace
"""


def functions_sql(layer: str) -> str:
    return resources.files(f"shoal.{layer}").joinpath("functions.sql").read_text()


def definitions(conn: psycopg.Connection[tuple[str, str]]) -> dict[str, str]:
    return dict(conn.execute(_DEFINITIONS).fetchall())


def defined(layer: str) -> list[str]:
    return _DEFINED.findall(functions_sql(layer))


def released_only() -> set[str]:
    """Functions the first release created, kept for its workers and called by no code here."""
    first = min(released_versions().values(), key=len)
    return {
        name for m in load_migrations() if m.version in first for name in _CREATED.findall(m.text)
    }


def statements(layer: str) -> dict[str, str]:
    """What a layer runs: its .sql files but the migrations and functions.sql, and its Python."""
    root = Path(str(resources.files(f"shoal.{layer}")))
    found = {}
    for path in sorted(root.rglob("*")):
        if "migrations" in path.parts or path.name == "functions.sql":
            continue
        if path.suffix in (".sql", ".py"):
            found[str(path.relative_to(root.parent))] = path.read_text()
    return found


def test_running_each_layers_functions_sql_on_a_migrated_database_changes_no_function(
    db_url: str,
) -> None:
    with psycopg.connect(db_url) as conn:
        before = definitions(conn)
        for layer in LAYERS:
            text = sql.SQL(functions_sql(layer)).format(schema=sql.Identifier("shoal"))
            conn.execute(text)
        after = definitions(conn)
        conn.rollback()
    changed = sorted(name for name in before if before[name] != after.get(name))
    assert not changed, (
        f"functions.sql differs from what the migrations built for {changed}: make the "
        "file's text the migration's, or write the migration that builds the file's"
    )
    assert set(after) == set(before), "functions.sql created a function no migration creates"


def test_every_function_is_in_exactly_one_layers_file_and_that_layer_creates_it() -> None:
    owner: dict[str, str] = {}
    for m in load_migrations():
        layer = m.package.split(".")[1]
        for name in _CREATED.findall(m.text):
            owner[name] = layer
        for name in _DROPPED.findall(m.text):  # gone since: no functions.sql holds it
            owner.pop(name, None)
    placed: dict[str, list[str]] = {}
    for layer in LAYERS:
        for name in defined(layer):
            placed.setdefault(name, []).append(layer)
    twice = {name: where for name, where in placed.items() if len(where) > 1}
    assert not twice, f"functions defined in more than one functions.sql: {twice}"
    misplaced = {
        name: (where[0], owner.get(name))
        for name, where in placed.items()
        if owner.get(name) != where[0]
    }
    assert not misplaced, f"functions in another layer's file than their migrations': {misplaced}"
    missing = set(owner) - set(placed) - released_only()
    assert not missing, f"functions the migrations create that no functions.sql holds: {missing}"


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_calls_only_functions_of_its_own_file_or_the_queues(layer: str) -> None:
    reachable = set(defined(layer)) | set(defined("queue"))
    calls = {
        (name, where)
        for where, text in statements(layer).items()
        for name in _CALLED.findall(_COMMENT.sub("", text))
    }
    missing = sorted((name, where) for name, where in calls if name not in reachable)
    assert not missing, f"calls of functions no functions.sql of this layer defines: {missing}"


def test_the_check_sees_a_definition_that_differs_from_the_migrated_one(db_url: str) -> None:
    """One byte changed in a body is a difference the first test reports."""
    text = functions_sql("queue").replace("RETURN p_name;", "RETURN  p_name;", 1)
    assert text != functions_sql("queue")
    with psycopg.connect(db_url) as conn:
        before = definitions(conn)
        conn.execute(sql.SQL(text).format(schema=sql.Identifier("shoal")))
        after = definitions(conn)
        conn.rollback()
    assert [n for n in before if before[n] != after[n]] == ["check_queue_name_v1"]
