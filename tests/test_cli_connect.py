"""A database shoal cannot connect to is named in one line, at once.

A URL naming a database that does not exist, a role the server refuses, or a
port nobody listens on used to open a pool that kept retrying in the
background (a warning each time) while the first call waited out its 30 s
timeout and died with "no database connection free in time". The first
connection is now made before the pool starts: its failure ends the command
with one line naming the cause and the URL (never its password), exit 2.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from shoal import CannotConnect, Shoal
from shoal.db.pool import Database, redacted_url

ROOT = Path(__file__).parent.parent
SECRET = "s3cret-pw"


def shoal_cli(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shoal.cli", "--database-url", url, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "60"},  # a narrow terminal must not wrap the error
        cwd=ROOT,
        timeout=120,
    )


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tcp_server(db_url: str) -> str:
    info = conninfo_to_dict(db_url)
    if str(info.get("host", "")).startswith("/"):
        pytest.skip("the test server listens on a Unix socket")
    return db_url


@pytest.fixture
def nosuch_db(pg_server: str) -> str:
    return make_conninfo(tcp_server(pg_server), dbname="shoal_nosuch_db", password=SECRET)


COMMANDS = [
    ["migrate"],
    ["status"],
    ["worker", "--app", "tests.procapp:app"],
    ["api", "--app", "tests.procapp:app", "--port", "0"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_every_command_names_a_missing_database_in_one_line(
    nosuch_db: str, command: list[str]
) -> None:
    result = shoal_cli(*command, url=nosuch_db)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith('error: database "shoal_nosuch_db" does not exist ('), lines[0]
    assert lines[0].endswith("/shoal_nosuch_db)"), lines[0]
    assert SECRET not in result.stderr + result.stdout


def test_a_refused_role_is_named_without_the_password(pg_server: str) -> None:
    url = make_conninfo(tcp_server(pg_server), user="shoal_nosuch_role", password=SECRET)
    result = shoal_cli("status", url=url)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert 'role "shoal_nosuch_role" does not exist' in lines[0], lines[0]
    assert "postgresql://shoal_nosuch_role@" in lines[0], lines[0]
    assert SECRET not in result.stderr + result.stdout


def test_a_port_nobody_listens_on_is_named(pg_server: str) -> None:
    port = closed_port()
    url = make_conninfo(tcp_server(pg_server), host="127.0.0.1", port=port, password=SECRET)
    result = shoal_cli("migrate", url=url)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Connection refused" in lines[0], lines[0]
    assert f"127.0.0.1:{port}/" in lines[0], lines[0]
    assert SECRET not in result.stderr


async def test_opening_a_pool_on_a_missing_database_raises_cannot_connect(nosuch_db: str) -> None:
    with pytest.raises(CannotConnect, match='database "shoal_nosuch_db" does not exist'):
        await Database(nosuch_db).open()
    with pytest.raises(CannotConnect) as raised:
        await Shoal.connect(nosuch_db)
    assert SECRET not in str(raised.value)


def test_the_redacted_url_keeps_where_it_points_and_drops_the_password() -> None:
    url = "postgresql://app:hunter2@db.internal:6543/jobs?sslmode=require"
    assert redacted_url(url) == "postgresql://app@db.internal:6543/jobs"
    assert redacted_url("host=h dbname=d password=x") == "postgresql://h:5432/d"
    multi = "host=a,b port=5433,5434 dbname=d target_session_attrs=read-write password=x"
    assert redacted_url(multi) == "postgresql://a:5433,b:5434/d"
    assert redacted_url("host=a,b port=6000 dbname=d") == "postgresql://a:6000,b:6000/d"


async def test_a_pool_opened_without_the_check_starts_while_its_database_is_away(
    nosuch_db: str,
) -> None:
    # For a process that must come up before its database (an API reporting not-ready).
    db = await Database(nosuch_db).open(check=False)
    await db.close()
