"""Loads a layer's ``queries.sql``: one statement per ``-- name: x`` block.

The text names the schema as ``{schema}``; it is bound as an identifier once,
when the store is built. Values are always bound parameters (``%(name)s``).
"""

from __future__ import annotations

import re
from importlib import resources

from psycopg import sql

_BLOCK = re.compile(r"^-- name: ([a-z_]+)\s*$", re.MULTILINE)


def load_queries(package: str, schema: str) -> dict[str, sql.Composed]:
    """Every named statement in ``package``'s queries.sql, bound to ``schema``."""
    text = resources.files(package).joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _BLOCK.split(text)
    queries: dict[str, sql.Composed] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise RuntimeError(f"{package}/queries.sql defines {name!r} twice")
        statement = body.strip().rstrip(";")
        queries[name] = sql.SQL(statement).format(schema=sql.Identifier(schema))
    return queries
