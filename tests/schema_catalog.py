"""The declared schema: what shoal's migrations build, as a text the tests compare.

``describe`` reads a schema's catalog (types, sequences, tables with their
columns, constraints and indexes, functions with their signatures, settings
and a digest of their bodies) into sorted lines, one object per line and a
table's parts indented under it. ``tests/schema/shoal.txt`` is that text for
a schema built by replaying every migration into an empty database; a test
fails when the migrations build anything else, and rewrites the file when
run with ``SHOAL_WRITE_SCHEMA=1`` (then the diff is reviewed like code).
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg

DECLARED = Path(__file__).parent / "schema" / "shoal.txt"
WRITE = os.environ.get("SHOAL_WRITE_SCHEMA") == "1"

_TYPES = """
SELECT t.typname, string_agg(e.enumlabel, ', ' ORDER BY e.enumsortorder)
FROM pg_type t JOIN pg_enum e ON e.enumtypid = t.oid
WHERE t.typnamespace = %(schema)s::regnamespace
GROUP BY t.typname
"""
_SEQUENCES = """
SELECT c.relname, format_type(s.seqtypid, NULL), s.seqincrement, s.seqcycle
FROM pg_class c JOIN pg_sequence s ON s.seqrelid = c.oid
WHERE c.relnamespace = %(schema)s::regnamespace
"""
_TABLES = """
SELECT c.relname FROM pg_class c
WHERE c.relnamespace = %(schema)s::regnamespace AND c.relkind IN ('r', 'p')
"""
_COLUMNS = """
SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
       pg_get_expr(d.adbin, d.adrelid), a.attidentity,
       CASE WHEN a.attcollation <> t.typcollation THEN co.collname END
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
LEFT JOIN pg_collation co ON co.oid = a.attcollation
WHERE c.relnamespace = %(schema)s::regnamespace AND c.relkind IN ('r', 'p')
  AND a.attnum > 0 AND NOT a.attisdropped
"""
_CONSTRAINTS = """
SELECT c.relname, k.conname, pg_get_constraintdef(k.oid)
FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
WHERE c.relnamespace = %(schema)s::regnamespace
  -- PostgreSQL 18 also records NOT NULL as constraints ('n'); every version
  -- shows it on the column ("not null" above), so it is listed once, there.
  AND k.contype <> 'n'
"""
_INDEXES = """
SELECT c.relname, i.relname, pg_get_indexdef(i.oid)
FROM pg_index x
JOIN pg_class c ON c.oid = x.indrelid
JOIN pg_class i ON i.oid = x.indexrelid
WHERE c.relnamespace = %(schema)s::regnamespace
"""
_FUNCTIONS = """
SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_function_result(p.oid),
       l.lanname, p.provolatile, coalesce(array_to_string(p.proconfig, ', '), ''),
       md5(p.prosrc)
FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
WHERE p.pronamespace = %(schema)s::regnamespace
"""
_VOLATILITY = {"i": "immutable", "s": "stable", "v": "volatile"}


async def describe(url: str, schema: str = "shoal") -> str:
    """The catalog of ``schema`` as sorted lines (see the module's docstring)."""
    args = {"schema": schema}
    lines: list[str] = []
    async with await psycopg.AsyncConnection.connect(url) as conn:

        async def rows(query: str) -> list[tuple[object, ...]]:
            cur = await conn.execute(query, args)  # type: ignore[arg-type]
            return list(await cur.fetchall())

        for name, labels in await rows(_TYPES):
            lines.append(f"type {name} enum ({labels})")
        for name, data_type, increment, cycle in await rows(_SEQUENCES):
            cycles = " cycle" if cycle else ""
            lines.append(f"sequence {name} {data_type} increment {increment}{cycles}")
        parts: dict[str, list[str]] = {str(r[0]): [] for r in await rows(_TABLES)}
        for table, num, column, data_type, notnull, default, identity, collation in sorted(
            await rows(_COLUMNS),
            key=lambda r: (str(r[0]), int(r[1])),  # type: ignore[call-overload]
        ):
            text = f"  column {num} {column} {data_type}"
            text += f' collate "{collation}"' if collation else ""
            text += " not null" if notnull else ""
            text += f" default {default}" if default is not None else ""
            text += f" identity {identity}" if identity else ""
            parts[str(table)].append(text)
        for table, name, definition in await rows(_CONSTRAINTS):
            parts[str(table)].append(f"  constraint {name} {definition}")
        for table, name, definition in await rows(_INDEXES):
            parts[str(table)].append(f"  index {name} {definition}")
        for table in sorted(parts):
            columns = [p for p in parts[table] if p.startswith("  column")]
            rest = sorted(p for p in parts[table] if not p.startswith("  column"))
            lines.append("\n".join([f"table {table}", *columns, *rest]))
        for name, arguments, result, language, volatility, config, digest in await rows(_FUNCTIONS):
            lines.append(
                f"function {name}({arguments}) returns {result} language {language} "
                f"{_VOLATILITY[str(volatility)]} set [{config}] body md5 {digest}"
            )
    return "\n".join(sorted(lines)) + "\n"
