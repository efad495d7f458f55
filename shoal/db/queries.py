"""A layer's ``queries.sql``, one statement per ``-- name: x`` block; reading rows by name.

The text names the schema as ``{schema}``; it is bound as an identifier once,
when the store is built. Values are always bound parameters (``%(name)s``).

An object a statement passes by name as a string (``nextval({job_id_seq})``)
is listed in ``regclasses``: its placeholder becomes a string literal of the
quoted, schema-qualified name, never ``'{schema}.job_id_seq'``, in which the
quoted identifier would sit inside a literal it can end.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from typing import Any

from psycopg import AsyncConnection, sql
from psycopg.rows import TupleRow

from shoal.clock import work_seconds

_BLOCK = re.compile(r"^-- name: ([a-z_]+)\s*$", re.MULTILINE)


def load_queries(
    package: str, schema: str, *, regclasses: Iterable[str] = (), file: str = "queries.sql"
) -> dict[str, sql.Composed]:
    """Every named statement in ``package``'s ``file`` (queries.sql), bound to ``schema``.

    Each name in ``regclasses`` fills the placeholder of that name with a
    literal naming ``schema``'s object: ``'"shoal"."job_id_seq"'``.
    """
    text = resources.files(package).joinpath(file).read_text(encoding="utf-8")
    return parse_queries(text, schema, regclasses=regclasses, where=f"{package}/{file}")


def parse_queries(
    text: str, schema: str, *, regclasses: Iterable[str] = (), where: str = "queries"
) -> dict[str, sql.Composed]:
    """The named statements of a queries.sql text, bound to ``schema`` (see load_queries)."""
    names: dict[str, sql.Composable] = {"schema": sql.Identifier(schema)}
    for name in regclasses:
        names[name] = sql.Literal(sql.Identifier(schema, name).as_string())
    parts = _BLOCK.split(text)
    queries: dict[str, sql.Composed] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise RuntimeError(f"{where} defines {name!r} twice")
        statement = body.strip().rstrip(";")
        queries[name] = sql.SQL(statement).format(**names)
    return queries


def int_array(values: Iterable[int]) -> str:
    """``values`` as the text of a PostgreSQL array, to bind where a statement
    casts it (``%(ids)s::bigint[]``).

    A bound value like any other, made ten times faster than psycopg's dump
    of a list (about 0.15 against 1.5 microseconds an element): a worker
    binds a few arrays of hundreds of ids for every batch it records.
    """
    return "{" + ",".join(map(str, values)) + "}"


def float_array(values: Iterable[float]) -> str:
    """``values`` as the text of a PostgreSQL array (``%(x)s::float8[]``), as :func:`int_array`.

    ``repr`` of a float is the shortest text that reads back as the same value.
    """
    return "{" + ",".join(map(repr, map(float, values))) + "}"


def text_array(values: Iterable[str]) -> str:
    """``values`` as the text of a PostgreSQL array (``%(x)s::text[]``), as :func:`int_array`.

    Every element is quoted, with its backslashes and double quotes escaped,
    so any string (empty, ``NULL``, with braces, commas or spaces) reads back
    as itself. NUL cannot be in a PostgreSQL text at all.
    """
    return "{" + ",".join('"' + _escape(v) + '"' for v in values) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


async def fetch_named(
    conn: AsyncConnection[TupleRow], query: sql.Composed, params: Mapping[str, Any]
) -> tuple[tuple[str, ...], list[TupleRow]]:
    """One statement's column names and rows, for a caller that reads rows by name.

    The names come once per statement; a reader turns them into positions once
    (see shoal.queue.store.claim_reader), so each row stays a plain tuple.

    The rows come in binary: the claims that read them return hundreds of
    rows with timestamps and floats, which the server then sends without
    formatting them as text and psycopg reads without parsing text (about a
    microsecond of a claimed job's time, of 13 to 15, on the 2-core
    development machine). The Python values are the same either way.
    """
    cur = await conn.execute(query, params, binary=True)
    if cur.description is None:
        return (), []
    return tuple(c.name for c in cur.description), await cur.fetchall()


async def fetch_named_timed(
    conn: AsyncConnection[TupleRow], query: sql.Composed, params: Mapping[str, Any]
) -> tuple[tuple[str, ...], list[TupleRow], float]:
    """:func:`fetch_named`, and the seconds the statement took on its connection.

    Counted from when the statement is sent to when its last row is in
    (:func:`shoal.clock.work_seconds`), so without the wait for a pooled
    connection: a claim that waited seconds for one while the database failed
    over did not cost the database those seconds (shoal.queue.cursor paces
    its claims from the head of a queue by this cost).
    """
    began = work_seconds()
    columns, rows = await fetch_named(conn, query, params)
    return columns, rows, work_seconds() - began


def positions(names: Sequence[str], wanted: Sequence[str], *, what: str) -> list[int]:
    """Where each of ``wanted`` is in ``names``; a statement that lacks one is a bug."""
    missing = [w for w in wanted if w not in names]
    if missing:
        raise RuntimeError(f"{what}: the statement returns no column {', '.join(missing)}")
    return [names.index(w) for w in wanted]
