"""What shoal's job row costs a claim and a completion, against narrower rows.

    .venv/bin/python -m bench.job_row_cost                # 50,000 jobs a table, 3 rounds
    .venv/bin/python -m bench.job_row_cost --n 100000 --rounds 5

The queue bench compares shoal's drain with a raw SQL loop over an
eight-column table with one partial index. Part of shoal's server CPU per
job above that loop is the row itself: 25 columns, 11 CHECK constraints
(a job's state and its timestamps agree; positive retry settings) and 11
indexes, of which a plain job's claim adds an entry to the lease index
(what finds a dead worker's jobs) and its completion one to the finished
index (what archiving reads). This script measures that part alone.

Each table below gets ``--n`` waiting rows; one connection then claims them
100 at a time (state to active with a lease, attempt + 1, started_at) and
completes them 100 at a time (state to completed, lease cleared, output),
each UPDATE its own transaction, by primary key, so every table does the
same statements and only its shape differs:

- ``shoal``: ``shoal.job`` as migrations make it (LIKE ... INCLUDING ALL,
  and its fillfactor, which every table made from it below keeps too);
- ``no checks``: its columns and indexes, no CHECK constraint;
- ``two indexes``: its columns and checks, only the primary key and the claim index;
- ``lease+finished``: its columns, no check, the primary key, the claim,
  lease and finished indexes (the indexes a plain job's life touches);
- ``bare row``: its columns, no check, the primary key and the claim index;
- ``raw loop``: the queue bench's raw table (eight columns, its two indexes),
  with the raw loop's own claim and completion.

Server CPU is the backend's user + system time (psutil) over the phase,
per job; WAL is the ``pg_current_wal_lsn()`` difference. The rounds run the
tables in turn, so a slower minute of the machine falls on all of them. On a
throwaway cluster of the machine's PostgreSQL (fsync on, synchronous_commit
off for these sessions: the commit's flush is not the row's cost). It
asserts nothing; it prints medians and ratios to the raw loop.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from dataclasses import dataclass, field

import psutil
import psycopg

from bench.machine import STORAGE_OPTIONS_SQL, OwnServer, describe, own_server_settings
from shoal import Shoal

BATCH = 100
WAITING = (
    "INSERT INTO exp.{t} (id, queue, data, retry_limit, retry_delay, retry_backoff,"
    " retry_delay_max, expire_in, created_at, start_after)"
    " SELECT g, 'q', '{{\"n\": 1}}', 2, '1 s', false, '1 h', '15 min', now(), now()"
    " FROM generate_series(1, %s) g"
)
CLAIM = (
    "UPDATE exp.{t} SET state = 'active', attempt = attempt + 1, started_at = now(),"
    " lease_expires_at = now() + interval '15 min', holder = 1"
    " WHERE id = ANY(%s) AND state IN ('created', 'retry')"
)
COMPLETE = (
    "UPDATE exp.{t} SET state = 'completed', finished_at = now(), lease_expires_at = NULL,"
    " output = 'null' WHERE id = ANY(%s) AND lease_expires_at IS NOT NULL"
)
RAW_WAITING = (
    "INSERT INTO exp.{t} (id, queue, data)"
    " SELECT g, 'q', '{{\"n\": 1}}' FROM generate_series(1, %s) g"
)
RAW_CLAIM = (
    "UPDATE exp.{t} SET state = 'running', attempt = attempt + 1, started_at = now()"
    " WHERE id = ANY(%s) AND state = 'queued'"
)
RAW_COMPLETE = (
    "UPDATE exp.{t} SET state = 'done', finished_at = now()"
    " WHERE id = ANY(%s) AND state = 'running'"
)
WAITING_STATES = "WHERE state IN ('created', 'retry')"
TABLES = {
    "shoal": "CREATE TABLE exp.shoal (LIKE shoal.job INCLUDING ALL)",
    "no checks": "CREATE TABLE exp.no_checks (LIKE shoal.job INCLUDING DEFAULTS INCLUDING INDEXES)",
    "two indexes": f"""
        CREATE TABLE exp.two_indexes (LIKE shoal.job INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
        ALTER TABLE exp.two_indexes ADD PRIMARY KEY (id);
        CREATE INDEX ON exp.two_indexes (queue, priority DESC, id) {WAITING_STATES}""",
    "lease+finished": f"""
        CREATE TABLE exp.lease_finished (LIKE shoal.job INCLUDING DEFAULTS);
        ALTER TABLE exp.lease_finished ADD PRIMARY KEY (id);
        CREATE INDEX ON exp.lease_finished (queue, priority DESC, id) {WAITING_STATES};
        CREATE INDEX ON exp.lease_finished (lease_expires_at) WHERE state = 'active';
        CREATE INDEX ON exp.lease_finished (finished_at)
            WHERE state IN ('completed', 'cancelled', 'failed')""",
    "bare row": f"""
        CREATE TABLE exp.bare_row (LIKE shoal.job INCLUDING DEFAULTS);
        ALTER TABLE exp.bare_row ADD PRIMARY KEY (id);
        CREATE INDEX ON exp.bare_row (queue, priority DESC, id) {WAITING_STATES}""",
    "raw loop": """
        CREATE TABLE exp.raw_loop (
            id bigint PRIMARY KEY, queue text NOT NULL, state text NOT NULL DEFAULT 'queued',
            data jsonb NOT NULL, attempt integer NOT NULL DEFAULT 0,
            created_at timestamptz NOT NULL DEFAULT now(), started_at timestamptz,
            finished_at timestamptz);
        CREATE INDEX ON exp.raw_loop (queue, id) WHERE state = 'queued'""",
}


def table_of(name: str) -> str:
    return name.replace(" ", "_").replace("+", "_")


@dataclass
class Phases:
    claim_us: list[float] = field(default_factory=list)
    complete_us: list[float] = field(default_factory=list)
    wal_b: list[float] = field(default_factory=list)


def backend_cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def wal_lsn(conn: psycopg.Connection[tuple[int]]) -> int:
    row = conn.execute("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint").fetchone()
    assert row is not None
    return int(row[0])


def one_round(
    conn: psycopg.Connection[tuple[int]], pid: int, name: str, n: int
) -> tuple[float, float, float]:
    """Server CPU (us/job) of the claim and the completion, and WAL (B/job) of both."""
    t = table_of(name)
    raw = name == "raw loop"
    conn.execute(f"TRUNCATE exp.{t}")
    conn.execute((RAW_WAITING if raw else WAITING).format(t=t), (n,))
    conn.execute(f"VACUUM ANALYZE exp.{t}")
    batches = [list(range(i, min(i + BATCH, n + 1))) for i in range(1, n + 1, BATCH)]
    wal = wal_lsn(conn)
    spent = []
    for statement in (RAW_CLAIM, RAW_COMPLETE) if raw else (CLAIM, COMPLETE):
        query = statement.format(t=t)
        before = backend_cpu_s(pid)
        for ids in batches:
            conn.execute(query, (ids,))
        spent.append((backend_cpu_s(pid) - before) / n * 1e6)
    return spent[0], spent[1], (wal_lsn(conn) - wal) / n


async def install(url: str) -> None:
    boss = await Shoal.connect(url)  # runs shoal's migrations
    await boss.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--n", type=int, default=50_000, help="jobs a table, each round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    own = OwnServer(own_server_settings(), prefix="shoal-job-row-")
    own.start()
    try:
        asyncio.run(install(own.url))
        print(describe(own.url), flush=True)
        print(f"server: {own.describe()}", flush=True)
        results = {name: Phases() for name in TABLES}
        with psycopg.connect(own.url, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA exp")
            for ddl in TABLES.values():
                conn.execute(ddl)
            # Each table made from shoal.job gets its storage parameters; the
            # raw loop's table keeps the default, as in the queue bench.
            row = conn.execute(STORAGE_OPTIONS_SQL, ("shoal.job",)).fetchone()
            if row is not None and row[0]:
                for name in TABLES:
                    if name != "raw loop":
                        conn.execute(f"ALTER TABLE exp.{table_of(name)} SET ({row[0]})")
            conn.execute("SET synchronous_commit = off")
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            pid = int(row[0])
            for r in range(1, args.rounds + 1):
                for name in TABLES:
                    claim, complete, wal = one_round(conn, pid, name, args.n)
                    results[name].claim_us.append(claim)
                    results[name].complete_us.append(complete)
                    results[name].wal_b.append(wal)
                    print(
                        f"  r{r} {name:15s} claim {claim:5.1f} us  complete {complete:5.1f} us"
                        f"  WAL {wal:6.0f} B",
                        flush=True,
                    )
    finally:
        own.stop()
    print(
        f"\nN = {args.n:,} jobs a table, {args.rounds} rounds, UPDATEs of {BATCH} by primary key; "
        "medians; server CPU in us per job"
    )
    print("| table | claim | complete | both | both vs raw loop | WAL B/job |")
    print("|---|---:|---:|---:|---:|---:|")
    raw = results["raw loop"]
    raw_both = statistics.median(a + b for a, b in zip(raw.claim_us, raw.complete_us, strict=True))
    for name, p in results.items():
        both = statistics.median(a + b for a, b in zip(p.claim_us, p.complete_us, strict=True))
        claim, complete = statistics.median(p.claim_us), statistics.median(p.complete_us)
        print(
            f"| {name} | {claim:.1f} | {complete:.1f} | {both:.1f} | {both / raw_both:.2f}x"
            f" | {statistics.median(p.wal_b):.0f} |"
        )


if __name__ == "__main__":
    main()
