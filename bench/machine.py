"""What every bench script says about the machine, and what it measures the database with.

- :func:`describe`: the header line that makes a figure travel: cores, load
  average, and the server's commit rate (a short single-connection loop of
  one-row INSERT commits, each waiting for its WAL flush), which bounds any
  workload that commits on every step. A reader on another machine scales a
  jobs/s figure by their own commit rate, not by a guess.
- :class:`OwnServer`: a throwaway cluster from the machine's PostgreSQL
  binaries, so that WAL bytes and server CPU seconds are those of the bench
  alone (a shared server's WAL and CPU include everyone's).
- :class:`ServerMeter`: WAL bytes, full-page images, server CPU seconds and
  top-level statements between two samples.
- :func:`own_server_settings`: the throwaway cluster's settings, optionally
  with commits made slower (``--slow-commits``), to see a figure on a machine
  whose disk flushes slowly without owning one.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import psycopg

# PostgreSQL refuses to run as root; as root the throwaway cluster runs as this user.
SERVER_USER = "postgres"
COMMIT_PROBE_S = 3.0
COMMIT_PROBE_TABLE = "bench_commit_probe"


# A table's storage parameters as the text ALTER TABLE ... SET (...) takes
# (NULL when it has none). CREATE TABLE ... (LIKE t INCLUDING ALL) copies
# columns, checks and indexes, not these: a bench copying shoal.job gives
# the copy its fillfactor (50) with them, or the copy's updates leave their
# page and log whole rows.
STORAGE_OPTIONS_SQL = (
    "SELECT array_to_string(reloptions, ', ') FROM pg_class WHERE oid = %s::regclass"
)


def commit_rate(url: str, seconds: float = COMMIT_PROBE_S) -> float:
    """Commits per second of one connection inserting one row per transaction.

    ``synchronous_commit`` is the server's (on by default): each commit waits
    for its WAL flush, so on most machines this measures the disk's flush
    latency. The probe table is dropped afterwards.
    """
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {COMMIT_PROBE_TABLE}")
        conn.execute(f"CREATE TABLE {COMMIT_PROBE_TABLE} (n integer)")
        try:
            n = 0
            start = time.perf_counter()
            end = start + seconds
            while time.perf_counter() < end:
                conn.execute(f"INSERT INTO {COMMIT_PROBE_TABLE} VALUES (%s)", (n,))
                n += 1
            return n / (time.perf_counter() - start)
        finally:
            conn.execute(f"DROP TABLE IF EXISTS {COMMIT_PROBE_TABLE}")


def describe(url: str, *, probe_s: float = COMMIT_PROBE_S) -> str:
    """One line: cores, load average, the server's commit rate and settings that matter."""
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    rate = commit_rate(url, probe_s)
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name IN "
            "('fsync', 'synchronous_commit', 'full_page_writes', 'autovacuum', 'commit_delay')"
            " ORDER BY name"
        ).fetchall()
    settings = " ".join(f"{name}={value}" for name, value in rows)
    return (
        f"machine: os.cpu_count() = {os.cpu_count()}; load average {load}; "
        f"commit rate {rate:,.0f}/s (one connection, one-row INSERT per commit, "
        f"{probe_s:.0f} s); server {settings}"
    )


def own_server_settings(slow_commit_us: int = 0) -> dict[str, str]:
    """The bench scripts' throwaway cluster settings beyond initdb's.

    autovacuum off (the stale-statistics cases need it, and a drain is timed
    without a vacuum beside it) and pg_stat_statements to count statements.

    ``slow_commit_us`` > 0 makes every WAL flush wait that many microseconds
    first (``commit_delay`` with ``commit_siblings = 0``): commits become as
    dear as on a slower disk, while fsync and synchronous_commit stay on and
    commits that arrive meanwhile share the flush, as they do when a real
    flush is slow. The delay is a sleep, not CPU. The header's commit rate
    is measured with it, so it says which machine the run stands for.
    """
    settings = {"autovacuum": "off", "shared_preload_libraries": "pg_stat_statements"}
    if slow_commit_us < 0:
        raise SystemExit(f"--slow-commits: {slow_commit_us}: must be >= 0 microseconds")
    if slow_commit_us:
        settings |= {"commit_delay": str(slow_commit_us), "commit_siblings": "0"}
    return settings


def add_slow_commits_option(parser: argparse.ArgumentParser) -> None:
    """``--slow-commits MICROSECONDS``, for :func:`own_server_settings`."""
    parser.add_argument(
        "--slow-commits",
        type=int,
        default=0,
        metavar="MICROSECONDS",
        help="the own cluster waits this long before each WAL flush (commit_delay, "
        "commit_siblings=0): a machine whose commits are dearer; the header's commit "
        "rate is measured with it",
    )


class OwnServer:
    """A fresh cluster from the machine's PostgreSQL binaries, on a free port, removed at the end.

    ``settings`` are passed to the server as ``-c name=value``; everything
    else is initdb's default. Runs as ``postgres`` through ``runuser`` when
    the script runs as root.
    """

    def __init__(self, settings: Mapping[str, str] | None = None, prefix: str = "shoal-bench-"):
        found = sorted(
            (p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "initdb").exists()),
            key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        )
        if not found:
            raise SystemExit("no /usr/lib/postgresql/<n>/bin/initdb to start a server with")
        self.bin_dir = found[-1]
        self.settings = dict(settings or {})
        self.as_root = os.geteuid() == 0
        self.base = Path(tempfile.mkdtemp(prefix=prefix))
        if self.as_root:
            user = pwd.getpwnam(SERVER_USER)
            os.chown(self.base, user.pw_uid, user.pw_gid)
        self.data = self.base / "data"
        from shoal.db.embedded import free_port

        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def run(self, program: str, *args: str) -> None:
        command = [str(self.bin_dir / program), *args]
        if self.as_root:
            command = ["runuser", "-u", SERVER_USER, "--", *command]
        result = subprocess.run(
            command, cwd=self.base, capture_output=True, text=True, stdin=subprocess.DEVNULL
        )
        if result.returncode != 0:
            raise RuntimeError(f"{program} failed: {result.stderr.strip()[-1000:]}")

    def start(self) -> None:
        self.run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        options = " ".join(
            [
                f"-p {self.port}",
                "-c listen_addresses=127.0.0.1",
                f"-k {self.base}",
                *(f"-c {name}={value}" for name, value in self.settings.items()),
            ]
        )
        log = str(self.base / "server.log")
        self.run("pg_ctl", "start", "-w", "-D", str(self.data), "-l", log, "-o", options)

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError):
                self.run("pg_ctl", "stop", "-w", "-m", "fast", "-D", str(self.data))
        shutil.rmtree(self.base, ignore_errors=True)

    def describe(self) -> str:
        named = ", ".join(f"{k}={v}" for k, v in self.settings.items())
        return (
            f"a throwaway cluster (initdb defaults{', ' + named if named else ''}; "
            f"{self.bin_dir}) on 127.0.0.1:{self.port}"
        )


def server_cpu_s(postmaster_pid: int) -> float:
    """CPU seconds of the postmaster, its live children and its exited ones."""
    root = psutil.Process(postmaster_pid)
    times = root.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in root.children(recursive=True):
        try:
            child_times = child.cpu_times()
        except psutil.NoSuchProcess:
            continue  # exited meanwhile: now in the postmaster's children times
        total += child_times.user + child_times.system
    return total


@dataclass(frozen=True)
class Sample:
    wal_lsn: int
    wal_fpi: int
    cpu_s: float | None
    xacts: int


@dataclass(frozen=True)
class Usage:
    """What the server did between two samples."""

    wal_bytes: int
    wal_fpi: int
    cpu_s: float | None  # None: the server's processes could not be read
    # Top-level statements (pg_stat_statements), else transactions committed
    # or rolled back (pg_stat_database); ``statements_source`` says which.
    statements: int
    statements_source: str
    exec_ms: float | None  # pg_stat_statements' total_exec_time, when loaded
    top: list[tuple[str, int, float, int]]  # (query, calls, exec ms, wal bytes), most WAL first


class ServerMeter:
    """Samples the server of ``conn`` before and after a piece of work.

    WAL and CPU are the whole server's: exact on an :class:`OwnServer`, an
    upper bound on a shared one. Statements are counted for ``database``
    only, without those whose text is LIKE ``ignore_like`` (a watcher's polls,
    the bench's own queries) and without the meter's own.
    """

    def __init__(
        self, conn: psycopg.AsyncConnection[Any], database: str, *, ignore_like: str = ""
    ) -> None:
        self.conn = conn
        self.database = database
        self.ignore_like = ignore_like
        self.postmaster: int | None = None
        self.pgss = False

    async def open(self) -> None:
        cur = await self.conn.execute("SELECT pg_backend_pid()")
        row = await cur.fetchone()
        assert row is not None
        try:
            self.postmaster = psutil.Process(row[0]).ppid()
            psutil.Process(self.postmaster).cpu_times()
        except (psutil.Error, OSError):
            self.postmaster = None  # a remote server, or not ours to read
        cur = await self.conn.execute(
            "SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'"
        )
        self.pgss = await cur.fetchone() is not None

    async def sample(self) -> Sample:
        if self.pgss:
            await self.conn.execute("SELECT pg_stat_statements_reset()")
        cur = await self.conn.execute(
            "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn,"
            " (SELECT wal_fpi FROM pg_stat_wal),"
            " (SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s)",
            (self.database,),
        )
        row = await cur.fetchone()
        assert row is not None
        cpu = server_cpu_s(self.postmaster) if self.postmaster is not None else None
        return Sample(int(row[0]), int(row[1]), cpu, int(row[2]))

    async def since(self, before: Sample) -> Usage:
        """Usage since ``before``. Call it after the work's connections closed.

        A backend's counters reach the shared statistics when its session
        ends (or at its next transaction end a second later), so closed
        sessions are counted in full.
        """
        await self.conn.execute("SELECT pg_stat_clear_snapshot()")
        cur = await self.conn.execute(
            "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn,"
            " (SELECT wal_fpi FROM pg_stat_wal),"
            " (SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s)",
            (self.database,),
        )
        row = await cur.fetchone()
        assert row is not None
        cpu = server_cpu_s(self.postmaster) if self.postmaster is not None else None
        wal, fpi, xacts = int(row[0]), int(row[1]), int(row[2])
        top: list[tuple[str, int, float, int]] = []
        exec_ms: float | None = None
        if self.pgss:
            cur = await self.conn.execute(
                "SELECT query, calls, total_exec_time, wal_bytes FROM pg_stat_statements s"
                " JOIN pg_database d ON d.oid = s.dbid"
                " WHERE d.datname = %s AND s.toplevel AND s.query NOT LIKE %s"
                "   AND s.query NOT LIKE '%%pg_current_wal_insert_lsn%%'"
                "   AND s.query NOT LIKE '%%pg_stat_clear_snapshot%%'"
                "   AND s.query NOT LIKE '%%pg_stat_statements%%'"
                " ORDER BY s.wal_bytes DESC, s.calls DESC",
                (self.database, self.ignore_like),
            )
            top = [(" ".join(q.split()), int(c), float(t), int(w)) for q, c, t, w in
                   await cur.fetchall()]  # fmt: skip
            statements = sum(c for _q, c, _t, _w in top)
            exec_ms = sum(t for _q, _c, t, _w in top)
            source = "pg_stat_statements (top-level calls)"
        else:
            statements = xacts - before.xacts
            source = "pg_stat_database (transactions; pg_stat_statements not loaded)"
        return Usage(
            wal_bytes=wal - before.wal_lsn,
            wal_fpi=fpi - before.wal_fpi,
            cpu_s=None if cpu is None or before.cpu_s is None else cpu - before.cpu_s,
            statements=statements,
            statements_source=source,
            exec_ms=exec_ms,
            top=top,
        )
