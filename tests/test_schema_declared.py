"""The migrations build exactly the declared schema (tests/schema/shoal.txt).

Replayed into an empty database, shoal's migrations must give the catalog the
repository declares: a table, column, index, constraint or function that
appears, goes or changes without the file changing with it is drift, and
fails here. ``SHOAL_WRITE_SCHEMA=1 pytest tests/test_schema_declared.py``
rewrites the file from the migrations, for a change that is meant. The
upgrade test (test_upgrade.py) checks a database upgraded from the last
release against the same file.
"""

from __future__ import annotations

import difflib

from shoal.db import Database, migrate
from shoal.db.migrate import load_migrations

from .schema_catalog import DECLARED, WRITE, describe

# The SQL API users call by a name that stays across releases; each only
# calls a versioned function, which a later release may repoint it from.
PUBLIC_SQL_FUNCTIONS = {"create_task", "send"}


def drift(actual: str) -> str:
    """A unified diff from the declared schema to ``actual`` ('' when they match)."""
    declared = DECLARED.read_text() if DECLARED.exists() else ""
    return "".join(
        difflib.unified_diff(
            declared.splitlines(keepends=True),
            actual.splitlines(keepends=True),
            fromfile=str(DECLARED.name),
            tofile="migrated",
        )
    )


async def test_the_migrations_replayed_into_an_empty_schema_build_the_declared_one(
    empty_db_url: str,
) -> None:
    async with Database(empty_db_url) as db:
        applied = await migrate(db)
    assert applied == [m.version for m in load_migrations()]
    actual = await describe(empty_db_url)
    if WRITE:
        DECLARED.write_text(actual)
    assert not drift(actual), (
        "the migrations build a schema other than tests/schema/shoal.txt; if that is "
        "meant, rerun with SHOAL_WRITE_SCHEMA=1 and review the diff:\n" + drift(actual)
    )


def test_the_code_calls_only_versioned_database_functions_that_the_schema_declares() -> None:
    """A layer's statements name functions as ``{schema}.name_vN(``, each one declared.

    The unversioned functions of the first migrations stay in the schema
    only for the workers of the previous release; nothing in this code calls
    them, so a later migration may drop them.
    """
    import re
    from importlib import resources

    declared = set(re.findall(r"^function (\w+)\(", DECLARED.read_text(), re.MULTILINE))
    called: dict[str, set[str]] = {}
    texts = {
        f"shoal.{layer}/queries.sql": resources.files(f"shoal.{layer}")
        .joinpath("queries.sql")
        .read_text()
        for layer in ("queue", "batch", "ingest")
    }
    # The live definitions (functions.sql) call functions too.
    texts.update(
        {
            f"shoal.{layer}/functions.sql": resources.files(f"shoal.{layer}")
            .joinpath("functions.sql")
            .read_text()
            for layer in ("queue", "batch", "ingest")
        }
    )
    for where, text in texts.items():
        # CREATE FUNCTION and DROP FUNCTION name a function without calling it.
        for name in re.findall(r"(?<!FUNCTION )\{schema\}\.(\w+)\(", text):
            called.setdefault(name, set()).add(where)
    unversioned = {
        n: w
        for n, w in called.items()
        if not re.search(r"_v\d+$", n) and n not in PUBLIC_SQL_FUNCTIONS
    }
    assert not unversioned, f"calls of unversioned functions: {unversioned}"
    assert set(called) <= declared, (
        f"functions not in the declared schema: {set(called) - declared}"
    )
