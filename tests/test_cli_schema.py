"""Only ``shoal migrate`` (and the worker, the API and the demo) create shoal's schema.

``shoal status`` or ``shoal jobs`` pointed at the wrong database used to
migrate it: 18 tables appeared in a database that never had shoal (issue 35,
item 6). Every other command now connects without migrating; on a database
without the schema, or with migrations pending, it says so in one line and
exits 2, and the database is left as it was.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from shoal.cli import main
from shoal.db.migrate import load_migrations

TASK_ID = "1b4e28ba-2fa1-11d2-883f-0016cb7c7b1b"

READ_AND_ACT_COMMANDS = [
    ["status"],
    ["jobs"],
    ["job", "1"],
    ["job", "retry", "1"],
    ["workers"],
    ["schedule", "list"],
    ["schedule", "pause", "digest"],
    ["queue", "pause", "email_send"],
    ["topic", "dead", "events"],
    ["topic", "redrive", "events"],
    ["config", "list"],
    ["config", "get", "ingest.mode"],
    ["config", "set", "ingest.mode", "async"],
    ["tasks"],
    ["task", TASK_ID],
    ["task", "cancel", TASK_ID],
]


def user_objects(url: str) -> tuple[list[str], list[str]]:
    """The schemas and tables of ``url`` besides PostgreSQL's own."""
    with psycopg.connect(url) as conn:
        schemas = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%' "
            "AND nspname NOT IN ('information_schema', 'public') ORDER BY 1"
        ).fetchall()
        tables = conn.execute(
            "SELECT schemaname || '.' || tablename FROM pg_tables "
            "WHERE schemaname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1"
        ).fetchall()
    return [r[0] for r in schemas], [r[0] for r in tables]


def dbname(url: str) -> str:
    return str(conninfo_to_dict(url)["dbname"])


@pytest.mark.parametrize("command", READ_AND_ACT_COMMANDS, ids=" ".join)
def test_a_command_on_a_database_without_shoal_says_so_and_creates_nothing(
    empty_db_url: str, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--database-url", empty_db_url, *command]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: no shoal schema in {dbname(empty_db_url)} (run shoal migrate)"
    assert user_objects(empty_db_url) == ([], [])


def test_a_schema_other_than_the_default_is_named(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--database-url", db_url, "--schema", "tenant_b", "jobs"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: no shoal schema 'tenant_b' in {dbname(db_url)} (run shoal migrate)"
    assert "tenant_b" not in user_objects(db_url)[0]


def test_a_schema_with_migrations_pending_is_refused_until_migrated(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # As a schema migrated by the previous release looks to this one.
    latest = load_migrations()[-1]
    with psycopg.connect(db_url) as conn:
        conn.execute("DELETE FROM shoal.migration WHERE version = %s", (latest.version,))
    assert main(["--database-url", db_url, "status"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: shoal schema in {dbname(db_url)} lacks migrations {latest.label} of this "
        "release (run shoal migrate)"
    )
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT max(version) FROM shoal.migration").fetchone()
    assert row == (latest.version - 1,)  # the read command applied nothing
    # Recorded as applied again (its objects are all there): the command runs.
    with psycopg.connect(db_url) as conn:
        conn.execute(
            "INSERT INTO shoal.migration (version, name, checksum) VALUES (%s, %s, %s)",
            (latest.version, latest.name, latest.checksum),
        )
    assert main(["--database-url", db_url, "status"]) == 0


def test_migrate_creates_the_schema_the_other_commands_then_use(
    empty_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--database-url", empty_db_url, "migrate"]) == 0
    assert user_objects(empty_db_url)[0] == ["shoal"]
    capsys.readouterr()
    assert main(["--database-url", empty_db_url, "jobs"]) == 0
    assert "error" not in capsys.readouterr().err
