"""The schema name is checked at the edge: one that shoal's SQL cannot carry is refused by name.

The first migration (released, so its text is fixed) names the job sequence
inside a string literal, so a quote in the schema name ended the literal and
``shoal --schema "sch'ema" migrate`` died with a SQL syntax error; a name past
58 bytes made every send fail on its notification channel. Such names are now
refused before anything connects, with one line naming the schema and why.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from shoal import InvalidInput, Shoal
from shoal.db.migrate import migrate
from shoal.db.pool import MAX_SCHEMA_NAME, Database
from shoal.db.queries import load_queries

ROOT = Path(__file__).parent.parent
LONGEST = "Sh-" + "x" * (MAX_SCHEMA_NAME - 3)
BAD_SCHEMAS = ["sch'ema", "a$$b", "back\\slash", "", "s\n", "x" * (MAX_SCHEMA_NAME + 1)]


def shoal_cli(*args: str, db_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shoal.cli", "--database-url", db_url, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "60"},  # a narrow terminal must not wrap the error
        cwd=ROOT,
        timeout=120,
    )


def schemas(db_url: str) -> set[str]:
    with psycopg.connect(db_url) as conn:
        return {row[0] for row in conn.execute("SELECT nspname FROM pg_namespace").fetchall()}


def test_migrate_with_a_quote_in_the_schema_fails_with_one_line_naming_it(db_url: str) -> None:
    before = schemas(db_url)
    result = shoal_cli("--schema", "sch'ema", "migrate", db_url=db_url)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith('error: schema: "sch\'ema" cannot be used'), lines[0]
    assert "Traceback" not in result.stderr and "SyntaxError" not in result.stderr
    assert schemas(db_url) == before


@pytest.mark.parametrize("schema", BAD_SCHEMAS)
async def test_every_entry_point_refuses_an_unusable_schema_naming_it(
    db_url: str, schema: str
) -> None:
    before = schemas(db_url)
    with pytest.raises(InvalidInput) as raised:
        Database(db_url, schema=schema)
    assert raised.value.field == "schema"
    assert repr(schema) in str(raised.value)
    with pytest.raises(InvalidInput, match="schema"):
        await Shoal.connect(db_url, schema=schema)
    async with Database(db_url) as db:
        with pytest.raises(InvalidInput, match="schema"):
            await migrate(db, schema=schema)
    assert schemas(db_url) == before


async def test_the_longest_allowed_schema_migrates_sends_and_works_a_job(db_url: str) -> None:
    result = shoal_cli("--schema", LONGEST, "migrate", db_url=db_url)
    assert result.returncode == 0, result.stderr
    boss = await Shoal.connect(db_url, schema=LONGEST)
    try:
        job_id = await boss.send("q", {"n": 1})  # notifies <schema>_jobs: 63 bytes
        assert job_id is not None
        (job,) = await boss.fetch("q")
        assert job.id == job_id
        assert await boss.complete(job)
        assert (await boss.get_job(job_id)).state == "completed"
    finally:
        await boss.close()


def test_queue_statements_name_the_job_sequence_in_a_literal_that_quotes_the_schema() -> None:
    # The runtime queries never splice the identifier into a string literal,
    # whatever the name (the edge check is what keeps such names out today).
    queries = load_queries("shoal.queue", "sch'ema", regclasses=["job_id_seq"])
    for name in ("insert_jobs", "redrive"):
        text = queries[name].as_string()
        assert "nextval('\"sch''ema\".\"job_id_seq\"')" in text, name
        assert "'\"sch'ema\"" not in text, name
