"""Console benchmark: every console GET route over a big job table, and what the
history sampler costs a drain.

    .venv/bin/python bench/console_bench.py                    # 1,000,000 jobs
    .venv/bin/python bench/console_bench.py --jobs 200000      # a quick run (~2 min)
    .venv/bin/python bench/console_bench.py --jobs 200000 --skip-drain --keep

What it does, in one run against one PostgreSQL server (DATABASE_URL, default
the local one), in a throwaway schema of its own (``console_bench``, dropped
first and, unless ``--keep``, at the end):

1. Fills the schema with set-based SQL (generate_series, one statement per
   table): ``--jobs`` jobs in 12 queues of skewed sizes (half completed,
   ``--failed`` failed (default a tenth), 20% cancelled, 4% retry, 0.2% active,
   the rest (15.8%) waiting; failed and retrying jobs carry an error entry with a
   traceback, a tenth a singleton key), ``--archive`` archived jobs (default
   a tenth of ``--jobs``), ``--items`` batch items in 20 tasks (2% of them
   failed, with their history; 1% of the five processing tasks' items
   running), 24 hours of 10 s history samples and 30 days
   of 5 min ones for every queue, 20 schedules, 6 workers (holding the active
   jobs and running items between them), 3 topics with 10,000
   dead letters. Then VACUUM ANALYZE (the state autovacuum keeps a live table in).
2. Times every console GET route (``--calls`` calls each, after 3 unmeasured
   ones), in this process through the ASGI app (``create_api``), so the
   figures are the route's own work and its queries, without a network hop.
3. The sampler's cost: the drain of queue_bench.py's core (``--drain-jobs``
   no-op jobs worked off by ``boss.work(queue, concurrency=10)``) in the same
   schema, ``--drain-rounds`` times with the sampler off and as often with it
   on (alternating: off, on, on, off, ...). "On" runs the sampler's own
   statements (leader lock, sample, prune) every ``--sample-every`` seconds at
   a resolution of that many seconds, so each call writes a full sample: at the
   default of 1 s that is ten times the real cadence (one sample per 10 s).
   With ``--drain-seconds`` each drain works for that long (a steady drain of
   a ``--drain-jobs`` backlog) instead of to the end; after each drain its
   jobs are deleted and the table vacuumed. Each drain reports the CPU time
   (user + system) of the PostgreSQL server's processes, read from the
   postmaster in the server's data directory when this script can see it
   (same machine, enough rights), and the CPU time of the sampler's own
   backend. It also times one real sampling round (10 s and 5 min samples,
   in a transaction rolled back) on the full table.

The sampler's figures of docs/benchmarks.md:

    .venv/bin/python bench/console_bench.py --calls 3 --routes none \
        --drain-jobs 600000 --drain-seconds 25 --drain-rounds 3 --sample-every 10

This is a measurement script, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import psutil
import psycopg
from psycopg import sql

from bench.machine import server_cpu_s
from shoal.internal import INTERNAL_PREFIX

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
SCHEMA = "console_bench"
QUEUES = 12
TASKS = 20
DRAIN_QUEUE = "bench-drain"
CONCURRENCY = 10
WARMUP_CALLS = 3
TARGET_P99_MS = 100.0

# Each statement fills one table; {schema} is the bench schema, %(name)s the sizes.
FILL_SQL = [
    # Archived jobs take ids 1..archive, live ones the ids after them.
    """
    INSERT INTO {schema}.job_archive (
        id, queue, state, priority, data, attempt, retry_limit, retry_delay, retry_backoff,
        retry_delay_max, expire_in, start_after, created_at, started_at, finished_at, output,
        errors, cost, archived_at)
    SELECT i, 'queue-' || lpad((i %% 12)::text, 2, '0'),
           CASE WHEN i %% 10 = 0 THEN 'failed' ELSE 'completed' END::{schema}.job_state,
           0, jsonb_build_object('to', 'user' || i || '@example.com'), 1, 2,
           interval '1 s', true, interval '1 h', interval '15 min',
           now() - interval '3 days', now() - interval '3 days', now() - interval '3 days',
           now() - interval '3 days' + interval '1 s',
           CASE WHEN i %% 10 = 0 THEN NULL ELSE '{"sent": true}'::jsonb END,
           '[]', 1, now() - interval '2 days'
    FROM generate_series(1, %(archive)s) AS i
    """,
    # Live jobs: the bucket of i % 100 picks the state, a skewed draw the queue.
    """
    INSERT INTO {schema}.job (
        id, queue, state, priority, data, attempt, retry_limit, retry_delay, retry_backoff,
        retry_delay_max, expire_in, singleton_key, start_after, created_at, started_at,
        lease_expires_at, finished_at, output, errors)
    SELECT %(archive)s + g.i, g.queue, g.state, 0,
           jsonb_build_object('to', 'user' || g.i || '@example.com', 'template', 'welcome'),
           CASE WHEN g.state IN ('created') THEN 0 ELSE 1 END, 2,
           interval '1 s', true, interval '1 h', interval '15 min',
           CASE WHEN g.i %% 10 = 0 THEN 'key-' || g.i END,
           g.created, g.created,
           CASE WHEN g.state <> 'created' THEN g.created + interval '500 ms' END,
           CASE WHEN g.state = 'active' THEN now() + interval '15 min' END,
           CASE WHEN g.state IN ('completed', 'failed', 'cancelled')
                THEN g.created + interval '500 ms' + (g.i %% 7) * interval '100 ms' END,
           CASE WHEN g.state = 'completed' THEN '{"sent": true}'::jsonb END,
           CASE WHEN g.state IN ('failed', 'retry') THEN jsonb_build_array(jsonb_build_object(
               'attempt', 1, 'at', g.created + interval '1 s', 'type', 'SMTPError',
               'message', '550 mailbox user' || g.i || '@example.com unavailable',
               'traceback', repeat('  File "app.py", line 12, in send_email' || chr(10), 8)))
                ELSE '[]'::jsonb END
    FROM (
        SELECT i,
               'queue-' || lpad(floor(12 * power((hashint4(i) & 2147483647) / 2147483648.0, 2))
                                ::int::text, 2, '0') AS queue,
               CASE WHEN i %% 1000 < 500 THEN 'completed'
                    WHEN i %% 1000 < 500 + %(failed_pm)s THEN 'failed'
                    WHEN i %% 1000 < 700 + %(failed_pm)s THEN 'cancelled'
                    WHEN i %% 1000 < 702 + %(failed_pm)s THEN 'active'
                    WHEN i %% 1000 < 742 + %(failed_pm)s THEN 'retry'
                    ELSE 'created' END::{schema}.job_state AS state,
               now() - (%(jobs)s - i) * (86400.0 / %(jobs)s) * interval '1 s' AS created
        FROM generate_series(1, %(jobs)s) AS i
    ) g
    """,
    "SELECT setval('{schema}.job_id_seq', %(archive)s + %(jobs)s)",
    # Twenty tasks: the first five still processing, the others completed.
    """
    INSERT INTO {schema}.task (
        id, kind, status, outcome, request_hash, total, max_attempts, zombie_timeout,
        item_queue, created_at, completed_at)
    SELECT ('00000000-0000-4000-8000-' || lpad(t::text, 12, '0'))::uuid,
           CASE WHEN t %% 2 = 0 THEN 'extract' ELSE 'render' END,
           CASE WHEN t <= 5 THEN 'processing' ELSE 'completed' END::{schema}.task_status,
           CASE WHEN t > 5 THEN 'completed_with_errors' END::{schema}.task_outcome,
           'bench', %(items)s / 20, 3, interval '5 min',
           CASE WHEN t %% 2 = 0 THEN 'batch.extract' ELSE 'batch.render' END,
           now() - (21 - t) * interval '1 h',
           CASE WHEN t > 5 THEN now() - (21 - t) * interval '1 h' + interval '30 min' END
    FROM generate_series(1, 20) AS t
    """,
    # Items in contiguous blocks per task; 2% error with two runs of history.
    """
    INSERT INTO {schema}.item (
        task_id, ref, data, status, attempt, result, error, errors, started_at, updated_at,
        finished_at)
    SELECT ('00000000-0000-4000-8000-' || lpad(g.t::text, 12, '0'))::uuid,
           'doc-' || lpad(g.k::text, 7, '0'), jsonb_build_object('page', g.k), g.status,
           CASE WHEN g.status = 'pending' THEN 0 ELSE 1 END,
           CASE WHEN g.status = 'completed' THEN '{"pages": 3}'::jsonb END,
           CASE WHEN g.status = 'error' THEN 'ParseError: doc-' || g.k || ': no text layer' END,
           CASE WHEN g.status = 'error' THEN jsonb_build_array(
               jsonb_build_object('attempt', 1, 'run', 1, 'type', 'ParseError',
                                  'message', 'no text layer', 'started_at', now(), 'at', now()),
               jsonb_build_object('attempt', 2, 'run', 1, 'type', 'ParseError',
                                  'message', 'no text layer', 'started_at', now(), 'at', now()))
                ELSE '[]'::jsonb END,
           CASE WHEN g.status <> 'pending' THEN now() END, now(),
           CASE WHEN g.status IN ('completed', 'error') THEN now() END
    FROM (
        SELECT k, 1 + (k - 1) / (%(items)s / 20) AS t,
               CASE WHEN k %% 50 = 0 THEN 'error'
                    WHEN 1 + (k - 1) / (%(items)s / 20) <= 5 AND k %% 3 = 0 THEN 'pending'
                    WHEN 1 + (k - 1) / (%(items)s / 20) <= 5 AND k %% 100 = 1 THEN 'running'
                    ELSE 'completed' END::{schema}.item_status AS status
        FROM generate_series(1, %(items)s / 20 * 20) AS k
    ) g
    """,
    # History: every queue and '*', 24 h at 10 s and 30 days at 5 min.
    """
    INSERT INTO {schema}.history (resolution, queue, at, completed, failed, waiting, running,
                                  retrying, run_p50_s, run_p95_s, wait_p50_s, wait_p95_s)
    SELECT r.resolution, q.queue,
           to_timestamp(floor(extract(epoch FROM now()) / r.resolution) * r.resolution)
               - s * r.resolution * interval '1 s',
           50 + s % 17, s % 3, 200 + s % 50, 10, s % 5, 0.1, 0.4, 0.5, 2.0
    FROM (VALUES (10, 8640), (300, 8640)) AS r(resolution, n)
    CROSS JOIN (SELECT '*' AS queue UNION ALL
                SELECT 'queue-' || lpad(q::text, 2, '0') FROM generate_series(0, 11) AS q) q
    CROSS JOIN LATERAL generate_series(0, r.n - 1) AS s
    """,
    """
    INSERT INTO {schema}.schedule (name, queue, cron, data, last_tick, created_at, updated_at,
                                   owner)
    SELECT 'schedule-' || s, 'queue-' || lpad((s % 12)::text, 2, '0'), '0 */5 * * * *',
           'null', now() - interval '1 min', now() - interval '1 day', now(), 'bench:app'
    FROM generate_series(1, 20) AS s
    """,
    """
    INSERT INTO {schema}.worker (id, host, pid, app, queues, started_at, heartbeat_at, running,
                                 done)
    SELECT 'worker-' || w, 'host-' || (w % 3), 1000 + w, 'bench:app',
           jsonb_build_object('queue-00', 10, 'queue-01', 5, 'topic.cards', 4),
           now() - interval '1 h', now(), w % 4, 1000 * w
    FROM generate_series(1, 6) AS w
    """,
    # Who runs what (the worker page): each active job and running item is
    # held by one of the six workers.
    """
    UPDATE {schema}.job j SET holder = w.no
    FROM {schema}.worker w
    WHERE j.state = 'active' AND w.id = 'worker-' || (1 + mod(j.id, 6))
    """,
    """
    UPDATE {schema}.item i SET holder = w.no
    FROM {schema}.worker w
    WHERE i.status = 'running' AND w.id = 'worker-' || (1 + mod(i.id, 6))
    """,
    """
    INSERT INTO {schema}.ingest_topic (topic, depth, ready, in_flight, delayed, oldest_age_s,
                                       checked_at)
    SELECT t, 100, 80, 10, 10, 5.0, now() FROM unnest(ARRAY['cards', 'usage', 'events']) AS t
    """,
    """
    INSERT INTO {schema}.ingest_dead (topic, message_id, envelope, reason, error, attempt,
                                      dead_at)
    SELECT 'cards', 'msg-' || d, jsonb_build_object('id', 'msg-' || d, 'body', d),
           'attempts', 'ValueError: card ' || d || ': unknown account', 5, now()
    FROM generate_series(1, 10000) AS d
    """,
    # Workflow runs, a tenth of the jobs: most completed, some failed, asleep,
    # waiting or running; three steps each.
    """
    INSERT INTO {schema}.workflow_run (id, name, input, status, epoch, result, error,
                                       wait_key, created_at, updated_at, finished_at)
    SELECT 'run-' || r, CASE WHEN r %% 4 = 0 THEN 'onboard' ELSE 'order' END,
           jsonb_build_object('n', r), s.status, 1,
           CASE WHEN s.status = 'completed' THEN '{"ok": true}'::jsonb END,
           CASE WHEN s.status = 'failed' THEN 'StepFailed: step 2 failed' END,
           CASE WHEN s.status = 'waiting' THEN 'review:' || r END,
           now() - r * interval '1 s', now(),
           CASE WHEN s.status IN ('completed', 'failed') THEN now() END
    FROM generate_series(1, %(jobs)s / 10) AS r,
         LATERAL (SELECT CASE WHEN r %% 20 = 1 THEN 'failed' WHEN r %% 50 = 2 THEN 'sleeping'
                              WHEN r %% 50 = 3 THEN 'waiting' WHEN r %% 100 = 4 THEN 'running'
                              ELSE 'completed' END AS status) s
    """,
    """
    INSERT INTO {schema}.workflow_step (run_id, seq, name, kind, status, attempts, result,
                                        started_at, finished_at)
    SELECT 'run-' || r, q, 'app.step_' || q, 'step', 'completed', 1, to_jsonb(q), now(), now()
    FROM generate_series(1, %(jobs)s / 10) AS r, generate_series(1, 3) AS q
    """,
]

DRAIN_RATE_NOTE = "no-op jobs/s, boss.work(concurrency=10), sampler statements on a 2nd connection"


@dataclass(frozen=True, slots=True)
class RouteTiming:
    name: str
    path: str
    status: int
    p50_ms: float
    p99_ms: float
    max_ms: float


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (of 50 calls, p99 is the slowest but none)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q * len(ordered) + 0.5)))
    return ordered[rank - 1]


async def fill(url: str, args: argparse.Namespace) -> dict[str, float]:
    from shoal import Shoal

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA))
        )
    boss = await Shoal.connect(url, schema=SCHEMA, listen=False)
    await boss.close()
    timings: dict[str, float] = {}
    failed_pm = max(0, min(250, round(1000 * args.failed / args.jobs)))
    params = {
        "jobs": args.jobs,
        "archive": args.archive,
        "items": args.items,
        "failed_pm": failed_pm,
    }
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for statement in FILL_SQL:
            text = statement.replace("{schema}", SCHEMA)
            # Statements without parameters keep '%' literal; the others double it.
            started = time.perf_counter()
            await conn.execute(text.encode(), params if "%(" in text else None)
            table = text.split("INTO", 1)[1].split("(", 1)[0].strip() if "INTO" in text else "seq"
            timings[table] = time.perf_counter() - started
        started = time.perf_counter()
        for table in (
            "job",
            "job_archive",
            "item",
            "task",
            "history",
            "ingest_dead",
            "workflow_run",
            "workflow_step",
        ):
            await conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(SCHEMA, table)))
        timings["vacuum analyze"] = time.perf_counter() - started
    return timings


async def counts(url: str) -> dict[str, int]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        out: dict[str, int] = {}
        cur = await conn.execute(
            sql.SQL("SELECT state::text, count(*) FROM {} GROUP BY 1").format(
                sql.Identifier(SCHEMA, "job")
            )
        )
        for state, n in await cur.fetchall():
            out[state] = n
        for table in ("job_archive", "item", "history"):
            cur = await conn.execute(
                sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(SCHEMA, table))
            )
            row = await cur.fetchone()
            out[table] = row[0] if row else 0
        return out


async def probe_ids(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Ids the per-object routes ask for: a live failed job, an archived one, keys."""
    live_failed = args.archive + 500 + 1  # i % 1000 == 501: failed
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            sql.SQL(
                "SELECT queue FROM {} WHERE state = 'failed' GROUP BY queue "
                "ORDER BY count(*) LIMIT 1"
            ).format(sql.Identifier(SCHEMA, "job"))
        )
        row = await cur.fetchone()
        small_queue = row[0] if row else "queue-11"
        cur = await conn.execute(
            sql.SQL("SELECT id FROM {} WHERE state = 'active' ORDER BY id LIMIT 1").format(
                sql.Identifier(SCHEMA, "job")
            )
        )
        row = await cur.fetchone()
        active = row[0] if row else live_failed
    return {
        "active_id": active,
        "failed_id": live_failed,
        "archived_id": 7,
        "key": f"key-{(args.jobs // 2) // 10 * 10}",
        "small_queue": small_queue,
        "big_task": "00000000-0000-4000-8000-000000000001",
    }


def route_list(ids: dict[str, Any]) -> list[tuple[str, str | None]]:
    failed, key, small = ids["failed_id"], ids["key"], ids["small_queue"]
    task = ids["big_task"]
    return [
        ("overview 1h", "/v1/overview?window=1h"),
        ("overview 24h", "/v1/overview?window=24h"),
        ("overview 1h one queue", "/v1/overview?window=1h&queue=queue-00"),
        ("queues", "/v1/queues"),
        ("jobs (failed first)", "/v1/jobs"),
        ("jobs page 2 (cursor)", None),  # filled in from the first page's cursor
        ("jobs state=failed", "/v1/jobs?state=failed"),
        ("jobs state=completed", "/v1/jobs?state=completed"),
        ("jobs state=created", "/v1/jobs?state=created"),
        ("jobs state=retry", "/v1/jobs?state=retry"),
        ("jobs state=active", "/v1/jobs?state=active"),
        ("jobs state=cancelled", "/v1/jobs?state=cancelled"),
        ("jobs queue=queue-00", "/v1/jobs?queue=queue-00"),
        ("jobs queue=queue-00 state=failed", "/v1/jobs?queue=queue-00&state=failed"),
        (
            f"jobs queue={small} (smallest) state=completed",
            f"/v1/jobs?queue={small}&state=completed",
        ),
        ("jobs q=<id>", f"/v1/jobs?q={failed}"),
        ("jobs q=<singleton key>", f"/v1/jobs?q={key}"),
        ("job page (live)", f"/v1/jobs/{failed}"),
        ("job page (archived)", f"/v1/jobs/{ids['archived_id']}"),
        ("schedules", "/v1/schedules"),
        ("topics", "/v1/topics"),
        ("topic dead letters", "/v1/topics/cards/dead"),
        ("workers", "/v1/workers"),
        ("worker page (running jobs and items)", "/v1/workers/worker-2"),
        ("job page (active: holder, lease)", f"/v1/jobs/{ids['active_id']}"),
        ("history 1h", "/v1/history?window=1h"),
        ("history 24h", "/v1/history?window=24h"),
        ("tasks", "/v1/tasks"),
        ("tasks kind=extract status=completed", "/v1/tasks?kind=extract&status=completed"),
        ("task", f"/v1/tasks/{task}"),
        ("task items status=error", f"/v1/tasks/{task}/items?status=error"),
        ("task items ref=<search>", f"/v1/tasks/{task}/items?ref=doc-00004"),
        ("workflows", "/v1/workflows"),
        ("workflow runs", "/v1/workflows/runs"),
        ("workflow runs status=failed", "/v1/workflows/runs?status=failed"),
        (
            "workflow runs name=onboard status=waiting",
            "/v1/workflows/runs?name=onboard&status=waiting",
        ),
        ("workflow run page", "/v1/workflows/runs/run-40"),
        ("page /", "/"),
        ("page /tasks", "/tasks"),
    ]


async def time_routes(url: str, args: argparse.Namespace) -> list[RouteTiming]:
    import httpx

    from shoal import Shoal
    from shoal.api import create_api
    from shoal.batch.service import Batches

    ids = await probe_ids(url, args)
    boss = await Shoal.connect(url, schema=SCHEMA, listen=False, max_size=4)
    out: list[RouteTiming] = []
    try:
        api = create_api(boss, Batches(boss, {}), token=None)
        transport = httpx.ASGITransport(app=api)
        # A loopback name: the API answers 421 to any other Host (DNS rebinding).
        base = "http://127.0.0.1"
        async with httpx.AsyncClient(transport=transport, base_url=base) as client:
            first = (await client.get("/v1/jobs")).json()
            for name, path in route_list(ids):
                if path is None:
                    path = f"/v1/jobs?cursor={first['next_cursor']}"
                if args.routes and not any(r in name for r in args.routes.split(",")):
                    continue
                status = 0
                times: list[float] = []
                for call in range(WARMUP_CALLS + args.calls):
                    started = time.perf_counter()
                    response = await client.get(path)
                    elapsed = (time.perf_counter() - started) * 1000
                    status = response.status_code
                    if call >= WARMUP_CALLS:
                        times.append(elapsed)
                out.append(
                    RouteTiming(
                        name,
                        path,
                        status,
                        statistics.median(times),
                        percentile(times, 0.99),
                        max(times),
                    )
                )
                line = out[-1]
                flag = "" if line.p99_ms < TARGET_P99_MS else "  <-- over 100 ms"
                print(
                    f"  {name:48} {status} p50 {line.p50_ms:7.1f} ms  p99 {line.p99_ms:7.1f} ms"
                    f"{flag}",
                    file=sys.stderr,
                )
    finally:
        await boss.close()
    return out


# -- the sampler's cost ---------------------------------------------------------


async def sampling_round_ms(url: str, rounds: int = 10) -> list[float]:
    """One real sampling round (10 s and 5 min samples, pruning), rolled back each time."""
    from shoal import Shoal
    from shoal.queue.history import COARSE_S, FINE_S, RETENTION_S, HistorySampler
    from shoal.queue.registry import GONE_S

    boss = await Shoal.connect(url, schema=SCHEMA, listen=False, max_size=2)
    sampler = HistorySampler(boss)
    queries = sampler.store.sql  # the sampler's statements (history.sql), run by its store
    out = []
    try:
        async with boss.db.pool.connection() as conn:
            for _ in range(rounds):
                started = time.perf_counter()
                async with conn.transaction(force_rollback=True):
                    await conn.execute(queries["plan_switches"])
                    for resolution in (FINE_S, COARSE_S):
                        # The latest sample of this slot is removed (in the
                        # rolled-back transaction), so the round writes one.
                        await conn.execute(
                            sql.SQL(
                                "DELETE FROM {} WHERE resolution = %s AND at >= now() - %s * "
                                "interval '1 s'"
                            ).format(sql.Identifier(SCHEMA, "history")),
                            (resolution, resolution),
                        )
                        await conn.execute(
                            queries["sample"],
                            {
                                "now": None,
                                "resolution": resolution,
                                "finished_cap": sampler.finished_cap,
                                "depth_cap": sampler.depth_cap,
                                "internal_prefix": INTERNAL_PREFIX,
                                "gone_s": GONE_S,
                            },
                        )
                        await conn.execute(
                            queries["prune_history"],
                            {
                                "now": None,
                                "resolution": resolution,
                                "keep_s": RETENTION_S[resolution],
                            },
                        )
                out.append((time.perf_counter() - started) * 1000)
    finally:
        await boss.close()
    return out


def server_pid(data_directory: str) -> int | None:
    """The postmaster's pid from its data directory (None when not readable here)."""
    try:
        with open(os.path.join(data_directory, "postmaster.pid")) as f:
            pid = int(f.readline().strip())
        psutil.Process(pid).cpu_times()
    except (OSError, ValueError, psutil.Error):
        return None
    return pid


def backend_cpu_s(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(times.user + times.system)


async def sample_loop(url: str, every_s: float, spent: list[tuple[float, float]]) -> None:
    """The sampler's statements every ``every_s`` seconds at that resolution (each
    writes), on a connection of their own; ``spent`` gets (wall s, backend CPU s)
    per round (CPU 0 when the backend's process cannot be read here)."""
    from shoal.db.queries import load_queries
    from shoal.queue.history import DEPTH_CAP, FINISHED_CAP, RETENTION_S
    from shoal.queue.registry import GONE_S

    queries = load_queries("shoal.queue", SCHEMA, file="history.sql")
    resolution = max(1, round(every_s))
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute("SELECT pg_backend_pid()")
        row = await cur.fetchone()
        await conn.commit()
        pid = int(row[0]) if row else None
        while True:
            started = time.perf_counter()
            cpu = backend_cpu_s(pid)
            # Leadership is held apart, on the elector's own connection (shoal.db.
            # leadership): a sampling round takes no lock of its own.
            async with conn.transaction():
                await conn.execute(queries["plan_switches"])
                await conn.execute(
                    queries["sample"],
                    {
                        "now": None,
                        "resolution": resolution,
                        "finished_cap": FINISHED_CAP,
                        "depth_cap": DEPTH_CAP,
                        "gone_s": GONE_S,
                    },
                )
                await conn.execute(
                    queries["prune_history"],
                    # What the sampler keeps at this resolution: an hour
                    # for the bench's own ones; 24 h for 10 s samples (a
                    # shorter keep deletes the filled day at the first
                    # call, a cost the real sampler never has).
                    {
                        "now": None,
                        "resolution": resolution,
                        "keep_s": RETENTION_S.get(resolution, 3600),
                    },
                )
            spent.append((time.perf_counter() - started, backend_cpu_s(pid) - cpu))
            await asyncio.sleep(max(0.0, every_s - (time.perf_counter() - started)))


async def checkpoint(url: str) -> None:
    """Write out what the insert dirtied before the drain starts, so no drain
    carries a checkpoint the others do not: a drain writes about 1 KB of WAL a
    job, and one that crossed max_wal_size ran up to 30% slower (full-page
    images after the checkpoint). Skipped without the rights to it."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            await conn.execute("CHECKPOINT")


async def drain_once(
    url: str, n: int, *, sampler_on: bool, every_s: float, seconds: float, pg_pid: int | None
) -> dict[str, float]:
    """Drain ``n`` jobs (or, with ``seconds``, work off jobs for that long); then
    delete the drain's jobs and VACUUM the table, so every run starts alike."""
    from shoal import Job, Shoal

    boss = await Shoal.connect(url, schema=SCHEMA, max_size=12)
    spent: list[tuple[float, float]] = []
    try:
        for start in range(0, n, 50_000):
            await boss.insert(
                [
                    {"queue": DRAIN_QUEUE, "data": {"n": i}}
                    for i in range(start, min(n, start + 50_000))
                ]
            )
        seen = 0
        reached = asyncio.Event()

        async def handler(job: Job) -> None:
            nonlocal seen
            seen += 1
            if seen >= n:
                reached.set()

        await checkpoint(url)
        sampler = asyncio.create_task(sample_loop(url, every_s, spent)) if sampler_on else None
        cpu_before = server_cpu_s(pg_pid) if pg_pid else 0.0
        started = time.perf_counter()
        worker = boss.work(DRAIN_QUEUE, handler, concurrency=CONCURRENCY)
        if seconds:
            await asyncio.sleep(seconds)
            done = worker.stats.completed
        else:
            await asyncio.wait_for(reached.wait(), 900)
            # Recorded, not just handled; the worker has no event for it (2 ms polls).
            while worker.stats.completed < n:  # noqa: ASYNC110 - see the line above
                await asyncio.sleep(0.002)
            done = n
        elapsed = time.perf_counter() - started
        cpu = (server_cpu_s(pg_pid) - cpu_before) if pg_pid else 0.0
        if sampler is not None:
            if sampler.done():
                sampler.result()  # raises what stopped it
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
        await worker.stop()
    finally:
        await boss.close()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        job = sql.Identifier(SCHEMA, "job")
        await conn.execute(sql.SQL("DELETE FROM {} WHERE queue = %s").format(job), (DRAIN_QUEUE,))
        await conn.execute(sql.SQL("VACUUM {}").format(job))
    return {
        "elapsed_s": elapsed,
        "done": done,
        "rate": done / elapsed,
        "samples": len(spent),
        "sampler_s": sum(w for w, _ in spent),
        "sampler_cpu_s": sum(c for _, c in spent),
        "server_cpu_s": cpu,
    }


async def postmaster_pid(url: str) -> int | None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SHOW data_directory")
        row = await cur.fetchone()
    return server_pid(str(row[0])) if row else None


async def sampler_cost(url: str, args: argparse.Namespace) -> dict[str, Any]:
    pg_pid = await postmaster_pid(url)
    order = []
    for r in range(args.drain_rounds):
        order += [False, True] if r % 2 == 0 else [True, False]
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for on in order:
        result = await drain_once(
            url,
            args.drain_jobs,
            sampler_on=on,
            every_s=args.sample_every,
            seconds=args.drain_seconds,
            pg_pid=pg_pid,
        )
        runs[on].append(result)
        print(
            f"  drain sampler {'on ' if on else 'off'}: {result['rate']:8.0f} jobs/s "
            f"over {result['elapsed_s']:.1f} s, server CPU {result['server_cpu_s']:.1f} s "
            f"({result['samples']:.0f} samples, {result['sampler_s'] * 1000:.0f} ms and "
            f"{result['sampler_cpu_s'] * 1000:.0f} ms CPU in them)",
            file=sys.stderr,
        )
    off = statistics.median(r["rate"] for r in runs[False])
    on_rate = statistics.median(r["rate"] for r in runs[True])
    on_runs = [r for r in runs[True] if r["samples"]]
    cpu_known = pg_pid is not None and all(r["server_cpu_s"] > 0 for r in on_runs)
    return {
        "pg_pid": pg_pid,
        "off_runs": runs[False],
        "on_runs": runs[True],
        "off": off,
        "on": on_rate,
        "ratio": on_rate / off,
        "sample_ms_in_drain": statistics.median(
            1000 * r["sampler_s"] / r["samples"] for r in on_runs
        )
        if on_runs
        else None,
        "sample_cpu_ms_in_drain": statistics.median(
            1000 * r["sampler_cpu_s"] / r["samples"] for r in on_runs
        )
        if on_runs
        else None,
        "sampler_share": statistics.median(r["sampler_s"] / r["elapsed_s"] for r in on_runs)
        if on_runs
        else 0.0,
        "cpu_share": [r["sampler_cpu_s"] / r["server_cpu_s"] for r in on_runs] if cpu_known else [],
        "cpu_per_job_off": [r["server_cpu_s"] / r["done"] for r in runs[False]]
        if cpu_known
        else [],
        "cpu_per_job_on": [r["server_cpu_s"] / r["done"] for r in runs[True]] if cpu_known else [],
    }


def machine() -> str:
    load = os.getloadavg()
    return (
        f"{os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
        "(1, 5, 15 min)"
    )


async def main_async(args: argparse.Namespace) -> int:
    url = os.environ.get("DATABASE_URL", DEFAULT_URL)
    started = time.perf_counter()
    load_before = machine()
    print(f"console bench: {load_before}", file=sys.stderr)
    if not args.reuse:
        timings = await fill(url, args)
        print(
            "filled in " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()),
            file=sys.stderr,
        )
    sizes = await counts(url)
    print(f"rows: {sizes}", file=sys.stderr)
    print("routes:", file=sys.stderr)
    routes = await time_routes(url, args)
    rounds = await sampling_round_ms(url)
    cost = None if args.skip_drain else await sampler_cost(url, args)
    load_after = machine()
    if not args.keep:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA))
            )

    print()
    print(f"## Console routes ({args.calls} calls each, after {WARMUP_CALLS} unmeasured)")
    print()
    states = {k: v for k, v in sorted(sizes.items()) if k not in ("job_archive", "item", "history")}
    print(
        f"{sum(states.values()):,} jobs ({', '.join(f'{k} {v:,}' for k, v in states.items())}), "
        f"{sizes['job_archive']:,} archived, {sizes['item']:,} items in {TASKS} tasks, "
        f"{sizes['history']:,} history samples. {load_before} at the start; "
        f"{load_after} at the end."
    )
    print()
    print("| route | status | p50 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|")
    for r in routes:
        mark = "" if r.p99_ms < TARGET_P99_MS else " **over 100**"
        print(
            f"| {r.name} (`{r.path}`) | {r.status} | {r.p50_ms:.1f} | {r.p99_ms:.1f}{mark} | "
            f"{r.max_ms:.1f} |"
        )
    print()
    print(
        "One real sampling round on these tables (10 s and 5 min samples, pruning), "
        f"median of {len(rounds)}: {statistics.median(rounds):.1f} ms "
        f"(every 10 s: {statistics.median(rounds) / 100:.2f}% of one connection's time)."
    )
    if cost is not None:
        print()
        print(
            f"## Sampler cost: drain of {args.drain_jobs:,} jobs, sampler off vs on "
            f"(every {args.sample_every:g} s), {args.drain_rounds} runs each"
        )
        print()
        print("| sampler | drain runs (jobs/s) | median jobs/s | server CPU ms per 1,000 jobs |")
        print("|---|---|---|---|")
        for name, key, rate in (("off", "off_runs", cost["off"]), ("on", "on_runs", cost["on"])):
            rates = ", ".join(f"{r['rate']:,.0f}" for r in cost[key])
            per_job = ", ".join(
                f"{1e6 * r['server_cpu_s'] / r['done']:.0f}" if r["server_cpu_s"] else "-"
                for r in cost[key]
            )
            print(f"| {name} | {rates} | {rate:,.0f} | {per_job} |")
        print()
        shares = ", ".join(f"{100 * x:.2f}%" for x in cost["cpu_share"]) or "unknown"
        print(
            f"on/off drain rate: {cost['ratio']:.3f}; a sample took "
            f"{cost['sample_ms_in_drain'] or 0:.1f} ms "
            f"({cost['sample_cpu_ms_in_drain'] or 0:.1f} ms "
            f"of its backend's CPU) during the drain; the sampler's statements were "
            f"{100 * cost['sampler_share']:.2f}% of the drain's wall time and, of the server's "
            f"CPU during the drains with it on, {shares} (postmaster pid {cost['pg_pid']})."
        )
    print()
    print(f"(whole run {time.perf_counter() - started:.0f} s)")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000, help="live jobs (default 1M)")
    parser.add_argument("--failed", type=int, default=None, help="failed jobs (default jobs/10)")
    parser.add_argument("--archive", type=int, default=None, help="archived jobs (default jobs/10)")
    parser.add_argument("--items", type=int, default=100_000, help="batch items in 20 tasks")
    parser.add_argument("--calls", type=int, default=50, help="timed calls per route")
    parser.add_argument("--routes", default="", help="only routes whose name contains one of these")
    parser.add_argument("--drain-jobs", type=int, default=100_000)
    parser.add_argument(
        "--drain-rounds", type=int, default=2, help="drains with the sampler on (and off)"
    )
    parser.add_argument(
        "--sample-every", type=float, default=1.0, help="seconds between samples while on"
    )
    parser.add_argument(
        "--drain-seconds",
        type=float,
        default=0.0,
        help="work off the drain's jobs for this long (a steady drain) instead of all of them",
    )
    parser.add_argument("--skip-drain", action="store_true", help="routes only")
    parser.add_argument("--keep", action="store_true", help="keep the schema (then --reuse it)")
    parser.add_argument(
        "--reuse", action="store_true", help="refill nothing: the kept schema, same sizes"
    )
    args = parser.parse_args()
    for name in ("jobs", "items", "calls", "drain_jobs", "drain_rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.items < TASKS:
        parser.error(f"--items must be at least {TASKS} (one per task)")
    if args.sample_every <= 0:
        parser.error("--sample-every must be > 0")
    args.failed = args.jobs // 10 if args.failed is None else args.failed
    args.archive = args.jobs // 10 if args.archive is None else args.archive
    if not 0 <= args.failed <= args.jobs * 0.25:
        parser.error("--failed must be between 0 and 25% of --jobs")
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
