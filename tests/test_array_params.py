"""Arrays bound as their PostgreSQL text (shoal.db.queries) read back as the values given."""

from __future__ import annotations

import psycopg

from shoal.db.queries import float_array, int_array, text_array

AWKWARD = ["", "NULL", "null", 'a "quoted" word', "back\\slash", "{braces}", "a,b", " spaced ",
           "ü-ñ-日本", "\\\"", "'single'", "tab\tand\nnewline"]  # fmt: skip


async def test_text_int_and_float_arrays_read_back_unchanged(db_url: str) -> None:
    floats = [0.0, 86400.0, 0.1, 1e-9, 12345.678901234567, -3.5]
    ints = [0, 1, -7, 2**62]
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute(
            "SELECT %s::text[], %s::float8[], %s::bigint[], %s::text[]",
            (text_array(AWKWARD), float_array(floats), int_array(ints), text_array([])),
        )
        row = await cur.fetchone()
    assert row == (AWKWARD, floats, ints, [])
