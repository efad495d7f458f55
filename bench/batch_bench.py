"""Batch tasks (Level 2) benchmark: shoal beside procrastinate, pgqueuer and raw psycopg.

    .venv/bin/python -m bench.batch_bench                  # N = 1,000, 10,000, 100,000
    .venv/bin/python -m bench.batch_bench --quick          # 1 repetition per size
    .venv/bin/python -m bench.batch_bench --sizes 10000 --libs shoal,raw
    .venv/bin/python -m bench.batch_bench --libs shoal --pg-setting enable_bitmapscan=off

The pattern measured is scatter dispatch + polling aggregation: one create
call writes a task and its N items and sends one job per item; one worker
process (concurrency 10) runs a no-op handler per item behind a guarded
``pending -> running`` update; an aggregator closes the task once nothing is
pending or running; the parent polls the task until it sees it closed.

- shoal: ``App.batch("bench.noop", concurrency=10)``, run by ``shoal worker
  --app bench.batch_bench:app`` (the aggregator runs inside it, every second
  and when workers finish a task's last items); the parent calls
  ``batches.create`` and polls ``batches.get``.
- procrastinate and pgqueuer: the same pattern written the straightforward way
  on each: a task table and an item table of our own, the items' jobs deferred
  in one batch call, a job that does the guarded update then marks the item
  completed, and a 1 s aggregator loop in the worker process.
- raw psycopg: the same tables, no job queue: a loop claims 100 items per
  statement (FOR UPDATE SKIP LOCKED, guarded), completes them in one statement
  per batch, and a 1 s aggregator loop closes the task.
- rawjobs: the limit of issue 40 (bench/batch_limit.py): the task, its items
  and their jobs in one transaction; 100 jobs claimed per statement with the
  phantom guard; each result written to its item's row; the task closed as
  soon as a claim finds nothing pending.

Every worker is a fresh child process per measurement, started and ready
(imports done, connected) before the clock starts; its RSS is sampled with
psutil. Reported per system and N: create latency, end-to-end time (create
start to the parent seeing the task closed), completion-detection latency
(task closed minus last item finished, both by the database clock), items/s,
and worker peak RSS. A fresh database ``shoal_batch_bench`` is created on the
server of DATABASE_URL (default: the local server); every measurement starts
from emptied tables.

Each N is measured 3 times (1 time for 100,000; ``--quick``: once), the
libraries interleaved. procrastinate and pgqueuer are held to a budget so a
full run takes about 8 minutes on 2 cores: skipped at an N that a smaller N
projects past 120 s, cut off (and reported so) at 120 s, and run once at an N
whose first repetition took over 30 s. pgqueuer uses asyncpg, its own first
choice, when installed (``--pgqueuer-driver``): over psycopg, pgqueuer 1.6's
LISTEN loop holds the connection for up to 1 s per query when no NOTIFY
arrives, which drained about 5 jobs/s here. ``--pg-setting NAME=VALUE`` sets a server
setting for every session of the bench database, to test a hypothesis (the
output names it; don't publish such a run as the default one).

This is a measurement script, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import importlib.util
import logging
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench import batch_limit

if TYPE_CHECKING:
    from shoal import App

# Every worker process imports this module (shoal's through ``--app
# bench.batch_bench:app``), and its RSS is measured: so the module imports
# only the standard library and psycopg at the top. shoal, the other queue
# libraries and psutil are imported where they are used.

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
BENCH_DB = "shoal_batch_bench"
ROOT = Path(__file__).resolve().parent.parent
LIBS = ("shoal", "raw", "rawjobs", "pgqueuer", "procrastinate")
# Libraries held to a time budget, so a full run stays under ~8 minutes:
# one is skipped at a large N when a smaller N projects it past SLOW_BUDGET_S,
# cut off (and reported as such) when a run gets there anyway, and not
# repeated at an N whose first repetition took longer than REPEAT_MAX_S.
SLOW_LIBS = ("pgqueuer", "procrastinate")
SLOW_BUDGET_S = 120.0
REPEAT_MAX_S = 30.0
DEFAULT_SIZES = (1_000, 10_000, 100_000)
# Repetitions (median reported) for N up to REPS_SMALL_MAX_N, and above it.
REPS_SMALL, REPS_LARGE, REPS_SMALL_MAX_N = 3, 1, 10_000

KIND = "bench.noop"  # shoal's batch kind
JOB_QUEUE = "bench.noop_job"  # shoal's plain queue of no-op jobs (bench/million_bench.py)
QUEUE = "bench_noop"  # the baselines' queue / entrypoint / task name
CONCURRENCY = 10
RAW_CLAIM_BATCH = 100
AGGREGATE_EVERY_S = 1.0
# How often the parent polls the task (shoal: batches.get; the baselines: the
# task row and one GROUP BY status of the items not completed, the same two
# reads): every POLL_S, or
# POLL_SPACING times the last poll's duration when that is longer (the GROUP BY
# over 100,000 items takes tens of ms), so polling stays under ~1/5 of a core.
POLL_S = 0.05
POLL_SPACING = 4
# How often the parent samples the worker's RSS.
RSS_SAMPLE_S = 0.02
# After a worker says it is ready, let it settle (LISTEN, first empty claim,
# the scheduler's first tick) before the clock starts.
SETTLE_S = 0.5
READY_TIMEOUT_S = 30.0
# A measurement whose finished-item count stops moving this long, or that runs
# longer than RUN_TIMEOUT_S, is reported as an error.
STALL_TIMEOUT_S = 30.0
RUN_TIMEOUT_S = 300.0
STOP_GRACE_S = 10.0
# Worker children get the URL through the environment, not argv, so a password
# in DATABASE_URL never shows in the process list (shoal's CLI reads
# DATABASE_URL itself).
URL_ENV = "SHOAL_BATCH_BENCH_URL"
READY_MARK = "batch-bench-worker-ready"
# Parent connections carry this name; after a worker exits, any other client
# backend still running in the bench database is the dead worker's, and is
# terminated so it cannot slow the next measurement.
PARENT_APP_NAME = "batch_bench_parent"

SCHEMA = {
    "shoal": "shoal",
    "raw": "bench_raw",
    "rawjobs": batch_limit.SCHEMA,
    "pgqueuer": "bench_pgqueuer",
    "procrastinate": "bench_procrastinate",
}

SETTINGS = {
    "shoal": (
        f'@app.batch("{KIND}", concurrency={CONCURRENCY}) no-op handler; worker: '
        f"python -m shoal.cli worker --app bench.batch_bench:app (defaults: pool 10); "
        "create: app.batches(boss).create(kind, refs); poll: batches.get(task_id)"
    ),
    "raw": (
        f"one connection: claim {RAW_CLAIM_BATCH} items per UPDATE ... FROM (SELECT ... "
        "FOR UPDATE SKIP LOCKED LIMIT 100) WHERE status = 'pending' RETURNING, then one "
        "UPDATE ... WHERE id = ANY(ids) AND status = 'running'; LISTEN for new tasks"
    ),
    "rawjobs": batch_limit.SETTINGS,
    "pgqueuer": (
        "PgQueuer.from_{driver}_connection(conn); "
        f"@entrypoint(concurrency_limit={CONCURRENCY}); run() with its defaults (batch_size=10); "
        "jobs: Queries.enqueue(lists) after the task + items commit; item writes through "
        f"a pool of {CONCURRENCY} ({{driver}})"
    ),
    "procrastinate": (
        f"App(PsycopgConnector(default pool)).run_worker_async(concurrency={CONCURRENCY}); "
        "jobs: task.batch_defer_async(*kwargs) after the task + items commit; item writes "
        f"through a psycopg pool of {CONCURRENCY}"
    ),
}


def with_search_path(url: str, schema: str, **extra: str) -> str:
    """``url`` whose sessions resolve bare table names in ``schema``."""
    return make_conninfo(url, options=f"-c search_path={schema}", **extra)


def asyncpg_connect_args(url: str, schema: str, application_name: str = "") -> dict[str, Any]:
    """asyncpg's keyword arguments for the libpq ``url``, resolving names in ``schema``."""
    params = conninfo_to_dict(url)
    settings = {"search_path": schema}
    if application_name:
        settings["application_name"] = application_name
    args = {
        "host": params.get("host"),
        "port": int(str(params["port"])) if params.get("port") else None,
        "user": params.get("user"),
        "password": params.get("password"),
        "database": params.get("dbname"),
    }
    return {k: v for k, v in args.items() if v is not None} | {"server_settings": settings}


def default_pgqueuer_driver() -> str:
    """pgqueuer's own first choice, asyncpg, when installed; else psycopg."""
    return "asyncpg" if importlib.util.find_spec("asyncpg") else "psycopg"


# == shoal's App ===============================================================


@functools.cache
def shoal_app() -> App:
    from shoal import App
    from shoal.batch.item import Item

    app = App()

    @app.batch(KIND, concurrency=CONCURRENCY)
    async def noop(item: Item) -> None:
        return None

    return app


@functools.cache
def shoal_queue_app() -> App:
    """A plain queue's no-op handler, the batch kind's concurrency: million_bench's baseline."""
    from shoal import App, Job

    app = App()

    @app.handler(JOB_QUEUE, concurrency=CONCURRENCY)
    async def noop_job(job: Job) -> None:
        return None

    return app


def __getattr__(name: str) -> Any:
    # ``bench.batch_bench:app`` for ``shoal worker --app``: built on first use,
    # so the baseline workers (which import this module too) never load shoal.
    if name == "app":
        return shoal_app()
    if name == "queue_app":
        return shoal_queue_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# == the baselines' tables and statements ======================================

BASELINE_SCHEMA_SQL = """
CREATE TABLE {schema}.task (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    status       text NOT NULL DEFAULT 'processing' CHECK (status IN ('processing', 'completed')),
    outcome      text,
    total        integer NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    completed_at timestamptz
);
CREATE TABLE {schema}.item (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id     bigint NOT NULL REFERENCES {schema}.task (id),
    ref         text NOT NULL,
    status      text NOT NULL DEFAULT 'pending'
                CHECK (status IN ('pending', 'running', 'completed', 'error')),
    result      jsonb,
    error       text,
    started_at  timestamptz,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE INDEX item_task_status ON {schema}.item (task_id, status);
"""

# The baselines' connections set search_path to their schema: bare names below.
INSERT_TASK = "INSERT INTO task (total) VALUES (%s) RETURNING id"
INSERT_ITEMS = (
    "INSERT INTO item (task_id, ref) SELECT %s, r FROM unnest(%s::text[]) AS r RETURNING id"
)
RAW_CHANNEL = "bench_raw_items"

# The phantom guard of one item (procrastinate and pgqueuer jobs).
GUARD_ITEM = """
UPDATE item SET status = 'running', started_at = now(), updated_at = now()
WHERE id = %s AND status = 'pending'
"""
COMPLETE_ITEM = """
UPDATE item SET status = 'completed', finished_at = now(), updated_at = now()
WHERE id = %s AND status = 'running'
"""

# raw: claim a batch of items (locked rows are skipped; the state is re-checked
# after the lock, which is the guard), then complete them in one statement.
RAW_CLAIM = """
WITH claimed AS (
    SELECT i.id
    FROM item i JOIN task t ON t.id = i.task_id
    WHERE t.status = 'processing' AND i.status = 'pending'
    LIMIT %s
    FOR UPDATE OF i SKIP LOCKED
)
UPDATE item i SET status = 'running', started_at = now(), updated_at = now()
FROM claimed
WHERE i.id = claimed.id AND i.status = 'pending'
RETURNING i.id, i.ref
"""
RAW_COMPLETE = """
UPDATE item SET status = 'completed', finished_at = now(), updated_at = now()
WHERE id = ANY(%s) AND status = 'running'
"""

# The aggregator's pass: close every task with nothing pending or running.
CLOSE_TASKS = """
UPDATE task t
SET status = 'completed', completed_at = now(),
    outcome = CASE WHEN EXISTS (
                  SELECT 1 FROM item i WHERE i.task_id = t.id AND i.status = 'error')
              THEN 'completed_with_errors' ELSE 'completed' END
WHERE t.status = 'processing'
  AND NOT EXISTS (
      SELECT 1 FROM item i WHERE i.task_id = t.id AND i.status IN ('pending', 'running'))
RETURNING t.id
"""

# The parent's poll of a baseline task, with its task row: items by status,
# but for completed ones (the rest of the total), as shoal's batches.get counts.
POLL_UNFINISHED = """
SELECT status, count(*) FROM item
WHERE task_id = %s AND status IN ('pending', 'running', 'error')
GROUP BY status
"""

# What the parent reads once a task is closed (every library, its own schema).
CLOSED_STATS_SQL = """
SELECT extract(epoch FROM t.completed_at - max(i.finished_at))::float8,
       count(*) FILTER (WHERE i.status = 'completed'),
       count(*)
FROM {task} t JOIN {item} i ON i.task_id = t.id
WHERE t.id = %s
GROUP BY t.completed_at
"""

TRUNCATE_SQL = {
    "shoal": (
        "TRUNCATE shoal.item, shoal.item_tally, shoal.task, shoal.job, shoal.job_archive, "
        "shoal.counter"
    ),
    "raw": "TRUNCATE bench_raw.item, bench_raw.task",
    "rawjobs": "TRUNCATE bench_rawjobs.item, bench_rawjobs.task, bench_rawjobs.job",
    "pgqueuer": (
        "TRUNCATE bench_pgqueuer.item, bench_pgqueuer.task, bench_pgqueuer.pgqueuer, "
        "bench_pgqueuer.pgqueuer_log, bench_pgqueuer.pgqueuer_statistics"
    ),
    "procrastinate": (
        "TRUNCATE bench_procrastinate.item, bench_procrastinate.task, "
        "bench_procrastinate.procrastinate_jobs CASCADE"
    ),
}


# == worker children (baselines) ===============================================
#
# ``python -m bench.batch_bench --worker LIB`` runs until SIGTERM. It prints
# READY_MARK on stderr once connected and about to take work.


def ready() -> None:
    print(READY_MARK, file=sys.stderr, flush=True)


async def run_item(pool: Any, item_id: int) -> None:
    """One item's job: the guarded update, the no-op handler, the completion."""
    async with pool.connection() as conn:
        cur = await conn.execute(GUARD_ITEM, (item_id,))
        if cur.rowcount == 0:
            return  # a phantom delivery: the item is running or finished already
        # (the no-op handler)
        await conn.execute(COMPLETE_ITEM, (item_id,))


async def run_item_asyncpg(pool: Any, item_id: int) -> None:
    """``run_item`` over an asyncpg pool (pgqueuer's own driver)."""
    async with pool.acquire() as conn:
        status = await conn.execute(GUARD_ITEM.replace("%s", "$1"), item_id)
        if status == "UPDATE 0":
            return  # a phantom delivery
        # (the no-op handler)
        await conn.execute(COMPLETE_ITEM.replace("%s", "$1"), item_id)


async def aggregate_forever(url: str) -> None:
    """Close finished tasks every AGGREGATE_EVERY_S (the reference polled every 10 s)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while True:
            await conn.execute(CLOSE_TASKS)
            await asyncio.sleep(AGGREGATE_EVERY_S)


async def item_pool(url: str) -> Any:
    from psycopg_pool import AsyncConnectionPool

    pool = AsyncConnectionPool(
        url,
        min_size=CONCURRENCY,
        max_size=CONCURRENCY,
        kwargs={"autocommit": True},
        open=False,
    )
    await pool.open(wait=True)
    return pool


async def work_raw(base_url: str, schema: str, driver: str) -> None:
    url = with_search_path(base_url, schema)
    async with (
        await psycopg.AsyncConnection.connect(url, autocommit=True) as conn,
        await psycopg.AsyncConnection.connect(url, autocommit=True) as listen,
    ):
        await listen.execute(f"LISTEN {RAW_CHANNEL}")
        ready()
        while True:
            cur = await conn.execute(RAW_CLAIM, (RAW_CLAIM_BATCH,))
            rows = await cur.fetchall()
            if not rows:
                # Idle: wait for a create's NOTIFY (or look again after a second).
                async for _ in listen.notifies(timeout=1.0, stop_after=1):
                    pass
                continue
            for _id, _ref in rows:
                pass  # the no-op handler
            await conn.execute(RAW_COMPLETE, ([r[0] for r in rows],))


async def work_rawjobs(base_url: str, schema: str, driver: str) -> None:
    await batch_limit.work(with_search_path(base_url, schema), CLOSE_TASKS, ready)


async def work_pgqueuer(base_url: str, schema: str, driver: str) -> None:
    from pgqueuer import PgQueuer
    from pgqueuer.models import Job as PgqJob

    if driver == "asyncpg":
        import asyncpg

        args = asyncpg_connect_args(base_url, schema)
        pool = await asyncpg.create_pool(min_size=CONCURRENCY, max_size=CONCURRENCY, **args)
        conn = await asyncpg.connect(**args)
        pgq = PgQueuer.from_asyncpg_connection(conn)
        run: Callable[[int], Awaitable[None]] = functools.partial(run_item_asyncpg, pool)
    else:
        url = with_search_path(base_url, schema)
        pool = await item_pool(url)
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        pgq = PgQueuer.from_psycopg_connection(conn)
        run = functools.partial(run_item, pool)

    @pgq.entrypoint(QUEUE, concurrency_limit=CONCURRENCY)
    async def bench_noop(job: PgqJob) -> None:
        assert job.payload is not None
        await run(int(job.payload))

    try:
        ready()
        await pgq.run()
    finally:
        pgq.shutdown.set()
        await conn.close()
        await pool.close()


def procrastinate_app(url: str, handler: Callable[..., Awaitable[None]]) -> tuple[Any, Any]:
    """A procrastinate App (its own schema) and its one task, as its docs set them up."""
    from procrastinate import App as ProcrastinateApp
    from procrastinate import PsycopgConnector

    # The warning is about the procrastinate CLI importing an app by path,
    # which this script never does.
    logging.getLogger("procrastinate.blueprints").addFilter(
        lambda record: getattr(record, "action", None) != "app_defined_in___main__"
    )
    app = ProcrastinateApp(connector=PsycopgConnector(conninfo=url))
    task = app.task(name=QUEUE, queue=QUEUE)(handler)
    return app, task


async def work_procrastinate(base_url: str, schema: str, driver: str) -> None:
    url = with_search_path(base_url, schema)
    pool = await item_pool(url)

    async def bench_noop(item_id: int) -> None:
        await run_item(pool, item_id)

    app, _task = procrastinate_app(url, bench_noop)
    try:
        async with app.open_async():
            ready()
            await app.run_worker_async(
                queues=[QUEUE],
                concurrency=CONCURRENCY,
                wait=True,
                install_signal_handlers=False,
            )
    finally:
        await pool.close()


# Each takes (url, schema, pgqueuer's driver); only pgqueuer has a driver to choose.
BASELINE_WORKERS: dict[str, Callable[[str, str, str], Coroutine[Any, Any, None]]] = {
    "raw": work_raw,
    "rawjobs": work_rawjobs,
    "pgqueuer": work_pgqueuer,
    "procrastinate": work_procrastinate,
}


async def baseline_worker(lib: str, pgqueuer_driver: str) -> None:
    base_url = os.environ[URL_ENV]
    url = with_search_path(base_url, SCHEMA[lib])
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks: list[asyncio.Task[Any]] = [
        asyncio.create_task(
            BASELINE_WORKERS[lib](base_url, SCHEMA[lib], pgqueuer_driver), name=f"{lib}-worker"
        ),
    ]
    if lib != "rawjobs":  # it closes its tasks itself
        tasks.append(asyncio.create_task(aggregate_forever(url), name=f"{lib}-aggregator"))
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait([stopping, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:  # one ending before the stop signal is a failure: raise it
            if task.done():
                task.result()
    finally:
        stopping.cancel()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


# == the parent ================================================================


@dataclass
class Measurement:
    lib: str
    n: int
    create_s: float = 0.0
    e2e_s: float = 0.0
    detect_s: float = 0.0
    rss_mib: float = 0.0  # max of psutil samples
    vm_hwm_mib: float = 0.0  # the kernel's peak, read just before stopping
    load: float = 0.0
    worker_cpu_s: float = 0.0  # the worker's CPU time from create to closed
    # CPU seconds of database backends from create to closed: the worker's
    # (all it has; they start with it) and the parent's (create and polls).
    # None when the server's processes cannot be read (not on this machine).
    db_worker_cpu_s: float | None = None
    db_parent_cpu_s: float | None = None
    cut_off: bool = False  # SLOW_BUDGET_S passed before the task closed
    finished: int = 0  # items finished when cut off
    polls: int = 0
    poll_s: float = 0.0  # total time in the parent's polls
    error: str | None = None
    note: str = ""


@dataclass
class Row:
    """One line of the table: a library at one N, over its repetitions."""

    lib: str
    n: int
    runs: list[Measurement] = field(default_factory=list)
    skipped: str | None = None
    note: str = ""

    @property
    def ok(self) -> list[Measurement]:
        """The runs that closed their task."""
        return [m for m in self.runs if m.error is None and not m.cut_off]

    @property
    def cut_off(self) -> Measurement | None:
        return next((m for m in self.runs if m.cut_off), None)

    def median(self, attr: str) -> float | None:
        values = [getattr(m, attr) for m in self.ok]
        return statistics.median(values) if values else None


# Set by SIGINT / SIGTERM in the parent; read by the measurement loops.
_INTERRUPTED: list[int] = []


def _interrupt(main_task: asyncio.Task[Any]) -> None:
    _INTERRUPTED.append(1)
    main_task.cancel()


def _check_interrupted() -> None:
    if _INTERRUPTED:
        raise asyncio.CancelledError


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the parent dies (Linux)."""
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


# Pids of live worker children; killed at exit whatever happened.
_LIVE_CHILDREN: set[int] = set()


def _kill_live_children() -> None:
    for pid in list(_LIVE_CHILDREN):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _LIVE_CHILDREN.clear()


class WorkerProcess:
    """One worker child: its stderr tail, readiness, RSS samples and shutdown."""

    def __init__(self, lib: str, proc: asyncio.subprocess.Process) -> None:
        self.lib = lib
        self.proc = proc
        self.ready = asyncio.Event()
        self.tail: collections.deque[str] = collections.deque(maxlen=400)
        self.peak_rss = 0
        self._reader = asyncio.create_task(self._read_stderr())
        self._sampler = asyncio.create_task(self._sample_rss())

    @classmethod
    async def start(
        cls, lib: str, url: str, pgqueuer_driver: str, *, app: str = "bench.batch_bench:app"
    ) -> WorkerProcess:
        if lib == "shoal":
            argv = [
                "-m",
                "shoal.cli",
                "worker",
                "--app",
                app,
                "--grace",
                "5",
            ]
            env = dict(os.environ, DATABASE_URL=url)
        else:
            argv = ["-m", "bench.batch_bench", "--worker", lib]
            argv += ["--pgqueuer-driver", pgqueuer_driver]
            env = dict(os.environ, **{URL_ENV: url})
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *argv,
            cwd=ROOT,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            preexec_fn=_die_with_parent,
        )
        _LIVE_CHILDREN.add(proc.pid)
        return cls(lib, proc)

    async def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        async for raw in self.proc.stderr:
            line = raw.decode(errors="replace").rstrip()
            self.tail.append(line)
            # shoal's App.run logs "running N worker(s): ..." once its workers are started.
            if READY_MARK in line or (
                self.lib == "shoal" and "shoal.app" in line and "running " in line
            ):
                self.ready.set()

    async def _sample_rss(self) -> None:
        import psutil

        try:
            ps = psutil.Process(self.proc.pid)
            while True:
                self.peak_rss = max(self.peak_rss, ps.memory_info().rss)
                await asyncio.sleep(RSS_SAMPLE_S)
        except psutil.NoSuchProcess:
            return

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the worker has used so far."""
        import psutil

        with contextlib.suppress(psutil.NoSuchProcess):
            times = psutil.Process(self.proc.pid).cpu_times()
            return float(times.user + times.system)
        return 0.0

    def vm_hwm_kib(self) -> int:
        with contextlib.suppress(OSError), open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        return 0

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    async def wait_ready(self) -> None:
        waiter = asyncio.create_task(self.ready.wait())
        exited = asyncio.create_task(self.proc.wait())
        try:
            await asyncio.wait(
                {waiter, exited}, timeout=READY_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            waiter.cancel()
            exited.cancel()
        if not self.ready.is_set():
            await asyncio.sleep(0.2)  # let the reader catch the last lines
            raise RuntimeError(f"{self.lib} worker never became ready: {self.describe()}")

    def describe(self) -> str:
        state = "running" if self.alive else f"exited {self.proc.returncode}"
        return f"worker {state}; its last stderr lines:\n    " + "\n    ".join(list(self.tail)[-8:])

    def save_log(self) -> str:
        path = os.path.join(tempfile.gettempdir(), f"batch_bench_{self.lib}_worker.stderr")
        with open(path, "w") as f:
            f.write("\n".join(self.tail) + "\n")
        return path

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after STOP_GRACE_S; always reaps the child."""
        try:
            if self.alive:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(self.proc.wait(), STOP_GRACE_S)
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        self.proc.kill()
                    await self.proc.wait()
        finally:
            _LIVE_CHILDREN.discard(self.proc.pid)
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(self._reader, 2)


class Bench:
    def __init__(
        self,
        admin_url: str,
        libs: Sequence[str],
        pgqueuer_driver: str,
        pg_settings: Sequence[str] = (),
    ) -> None:
        self.admin_url = admin_url
        self.pg_settings = pg_settings
        self.pgqueuer_driver = pgqueuer_driver
        self.url = make_conninfo(admin_url, dbname=BENCH_DB)
        self.parent_url = make_conninfo(self.url, application_name=PARENT_APP_NAME)
        self.libs = libs
        self.pg_version = ""
        self.load_at_start = os.getloadavg()
        self.autovacuum = "?"
        self.conns: dict[str, psycopg.AsyncConnection[Any]] = {}
        self.notes: list[str] = []

    # -- setup ------------------------------------------------------------

    async def setup(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.admin_url, autocommit=True) as c:
            cur = await c.execute("SELECT version()")
            row = await cur.fetchone()
            self.pg_version = row[0] if row else "?"
            name = sql.Identifier(BENCH_DB)
            await c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
            await c.execute(sql.SQL("CREATE DATABASE {}").format(name))
            for setting in self.pg_settings:
                key, _, value = setting.partition("=")
                await c.execute(
                    sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                        name, sql.Identifier(*key.strip().split(".")), sql.Literal(value.strip())
                    )
                )
            cur = await c.execute("SELECT current_setting('autovacuum')")
            row = await cur.fetchone()
            self.autovacuum = row[0] if row else "?"
        self.admin = await psycopg.AsyncConnection.connect(self.parent_url, autocommit=True)
        for lib in ("raw", "rawjobs", "pgqueuer", "procrastinate"):
            schema = sql.Identifier(SCHEMA[lib])
            await self.admin.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
            await self.admin.execute(sql.SQL(BASELINE_SCHEMA_SQL).format(schema=schema))
            if lib == "rawjobs":
                await self.admin.execute(sql.SQL(batch_limit.JOB_TABLE_SQL).format(schema=schema))
            self.conns[lib] = await psycopg.AsyncConnection.connect(
                with_search_path(self.url, SCHEMA[lib], application_name=PARENT_APP_NAME),
                autocommit=True,
            )

        from pgqueuer import Queries

        from shoal import Shoal

        self.boss = await Shoal.connect(
            self.url, schema=SCHEMA["shoal"], listen=False, application_name=PARENT_APP_NAME
        )
        self.batches = shoal_app().batches(self.boss)
        # The parent enqueues through the driver the worker uses.
        self.pgq_conn: Any
        if self.pgqueuer_driver == "asyncpg":
            import asyncpg

            self.pgq_conn = await asyncpg.connect(
                **asyncpg_connect_args(self.url, SCHEMA["pgqueuer"], PARENT_APP_NAME)
            )
            self.pgq = Queries.from_asyncpg_connection(self.pgq_conn)
        else:
            self.pgq_conn = await psycopg.AsyncConnection.connect(
                with_search_path(self.url, SCHEMA["pgqueuer"], application_name=PARENT_APP_NAME),
                autocommit=True,
            )
            self.pgq = Queries.from_psycopg_connection(self.pgq_conn)
        await self.pgq.install()

        async def never_run(item_id: int) -> None:  # the parent only defers
            raise AssertionError("the parent process runs no procrastinate job")

        self.proc_app, self.proc_task = procrastinate_app(
            with_search_path(self.url, SCHEMA["procrastinate"], application_name=PARENT_APP_NAME),
            never_run,
        )
        await self.proc_app.open_async()
        await self.proc_app.schema_manager.apply_schema_async()
        # One untimed create per library: the first call on a connection pays
        # for catalog lookups that later calls do not. No worker runs it; the
        # reset before each measurement empties the tables.
        for lib in self.libs:
            await self.create(lib, [f"warmup-{i}" for i in range(100)])

    async def close(self) -> None:
        with contextlib.suppress(AttributeError):
            await self.proc_app.close_async()
        with contextlib.suppress(AttributeError):
            await self.boss.close()
        with contextlib.suppress(AttributeError):
            await self.pgq_conn.close()
        for conn in self.conns.values():
            await conn.close()
        with contextlib.suppress(AttributeError):
            await self.admin.close()

    # -- the pattern, parent side ------------------------------------------

    async def create(self, lib: str, refs: list[str]) -> Any:
        """Create a task of ``refs`` (task + items + their jobs); returns its id."""
        if lib == "shoal":
            return (await self.batches.create(KIND, refs)).task_id
        conn = self.conns[lib]
        if lib == "rawjobs":
            return await batch_limit.create(conn, refs)
        async with conn.transaction():
            cur = await conn.execute(INSERT_TASK, (len(refs),))
            row = await cur.fetchone()
            assert row is not None
            task_id = row[0]
            cur = await conn.execute(INSERT_ITEMS, (task_id, refs))
            ids = [r[0] for r in await cur.fetchall()]
            if lib == "raw":
                await conn.execute(f"NOTIFY {RAW_CHANNEL}")
        # The jobs go through each library's batch call, after the commit.
        if lib == "pgqueuer":
            n = len(ids)
            await self.pgq.enqueue([QUEUE] * n, [str(i).encode() for i in ids], [0] * n)
        elif lib == "procrastinate":
            await self.proc_task.batch_defer_async(*({"item_id": i} for i in ids))
        return task_id

    async def poll(self, lib: str, task_id: Any) -> tuple[bool, int]:
        """(closed?, items finished): shoal's get, or the same two reads on a baseline."""
        if lib == "shoal":
            from shoal.batch.states import TaskStatus

            view = await self.batches.get(task_id)
            return view.status is not TaskStatus.PROCESSING, view.progress.finished
        conn = self.conns[lib]
        cur = await conn.execute("SELECT status, total FROM task WHERE id = %s", (task_id,))
        row = await cur.fetchone()
        assert row is not None
        # As shoal's progress query: completed items are the rest of the total,
        # so they are not read (a big task's poll gets cheaper as it runs).
        cur = await conn.execute(POLL_UNFINISHED, (task_id,))
        counts = dict(await cur.fetchall())
        finished = row[1] - counts.get("pending", 0) - counts.get("running", 0)
        return row[0] != "processing", finished

    async def closed_stats(self, lib: str, task_id: Any) -> tuple[float, int, int]:
        """(detection latency s, items completed, items) of a closed task."""
        schema = sql.Identifier(SCHEMA[lib])
        query = sql.SQL(CLOSED_STATS_SQL).format(
            task=sql.SQL("{}.task").format(schema), item=sql.SQL("{}.item").format(schema)
        )
        cur = await self.admin.execute(query, (task_id,))
        row = await cur.fetchone()
        assert row is not None
        return float(row[0]), int(row[1]), int(row[2])

    async def reset(self, lib: str) -> None:
        await self.admin.execute(TRUNCATE_SQL[lib])

    async def backend_cpu_s(self, *, parent: bool) -> float | None:
        """CPU seconds so far of the bench database's backends: the parent's, or the others.

        Read from /proc, so only when the server runs on this machine (and
        its processes are readable); None otherwise.
        """
        import psutil

        op = "=" if parent else "<>"
        cur = await self.admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s"
            f" AND backend_type = 'client backend' AND application_name {op} %s",
            (BENCH_DB, PARENT_APP_NAME),
        )
        total = 0.0
        for (pid,) in await cur.fetchall():
            try:
                times = psutil.Process(pid).cpu_times()
            except psutil.NoSuchProcess:
                continue  # ended meanwhile
            except psutil.Error:
                return None
            total += times.user + times.system
        return total

    async def end_orphaned_backends(self) -> str:
        """Terminate client backends a stopped worker left running (see PARENT_APP_NAME)."""
        cur = await self.admin.execute(
            "SELECT pid, state, left(query, 60) FROM pg_stat_activity"
            " WHERE datname = %s AND backend_type = 'client backend'"
            " AND application_name <> %s AND pid <> pg_backend_pid()",
            (BENCH_DB, PARENT_APP_NAME),
        )
        rows = await cur.fetchall()
        for pid, _state, _query in rows:
            await self.admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        active = [" ".join(q.split()) for _pid, state, q in rows if state == "active"]
        return f"terminated {len(active)} statement(s) left running: {active}" if active else ""

    # -- one measurement ----------------------------------------------------

    async def measure(self, lib: str, n: int) -> Measurement:
        m = Measurement(lib, n, load=os.getloadavg()[0])
        refs = [f"item-{i}" for i in range(n)]
        await self.reset(lib)
        worker = await WorkerProcess.start(lib, self.url, self.pgqueuer_driver)
        try:
            await worker.wait_ready()
            await asyncio.sleep(SETTLE_S)
            cpu_before = worker.cpu_s()
            db_parent_before = await self.backend_cpu_s(parent=True)
            start = time.perf_counter()
            task_id = await self.create(lib, refs)
            m.create_s = time.perf_counter() - start
            last_finished, last_change = -1, time.perf_counter()
            while True:
                _check_interrupted()
                polled_at = time.perf_counter()
                closed, finished = await self.poll(lib, task_id)
                now = time.perf_counter()
                m.polls += 1
                m.poll_s += now - polled_at
                if closed:
                    m.e2e_s = now - start
                    break
                if not worker.alive:
                    raise RuntimeError(f"{lib} worker died mid-run: {worker.describe()}")
                if finished != last_finished:
                    last_finished, last_change = finished, now
                elif now - last_change > STALL_TIMEOUT_S:
                    raise RuntimeError(
                        f"{lib}: no item finished for {STALL_TIMEOUT_S:.0f} s "
                        f"({finished} of {n} finished); {worker.describe()}"
                    )
                if lib in SLOW_LIBS and now - start > SLOW_BUDGET_S:
                    m.cut_off, m.e2e_s, m.finished = True, now - start, finished
                    break
                if now - start > RUN_TIMEOUT_S:
                    raise RuntimeError(f"{lib}: not closed after {RUN_TIMEOUT_S:.0f} s")
                # A poll of a big task costs tens of ms on the server; spacing
                # them keeps the parent from loading the 2 cores it shares.
                await asyncio.sleep(max(POLL_S, POLL_SPACING * (now - polled_at)))
            m.worker_cpu_s = worker.cpu_s() - cpu_before
            m.db_worker_cpu_s = await self.backend_cpu_s(parent=False)
            db_parent_after = await self.backend_cpu_s(parent=True)
            if db_parent_before is not None and db_parent_after is not None:
                m.db_parent_cpu_s = db_parent_after - db_parent_before
            if m.cut_off:
                m.note = (
                    f"cut off after {m.e2e_s:.0f} s with {m.finished:,} of {n:,} items finished"
                )
            else:
                m.detect_s, completed, total = await self.closed_stats(lib, task_id)
                if completed != n or total != n:
                    m.note = f"closed with {completed} of {total} items completed (N = {n})"
            m.vm_hwm_mib = worker.vm_hwm_kib() / 1024
            m.rss_mib = worker.peak_rss / 2**20
        except Exception as exc:  # one library failing must not hide the others' rows
            m.error = f"{type(exc).__name__}: {exc}"
            m.note = f"worker stderr kept in {worker.save_log()}"
        finally:
            await worker.stop()
            orphans = await self.end_orphaned_backends()
            if orphans:
                m.note = "; ".join(x for x in (m.note, orphans) if x)
        return m


# == the report ================================================================


def fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    return "n/a" if value is None else format(value * scale, spec)


def library_versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    parts = []
    for name in ("psycopg", "pgqueuer", "procrastinate"):
        try:
            parts.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            parts.append(f"{name} (not installed)")
    return ", ".join(parts)


def header(bench: Bench, reps: dict[int, int]) -> list[str]:
    from bench.queue_bench import shoal_version

    load = ", ".join(f"{x:.2f}" for x in bench.load_at_start)
    rep_text = ", ".join(f"N={n:,}: {r}" for n, r in reps.items())
    return [
        f"os.cpu_count() = {os.cpu_count()}; load average at start {load}; "
        f"repetitions (median shown) {rep_text}",
        f"Postgres: {bench.pg_version}; autovacuum = {bench.autovacuum}",
        *(f"diagnostic setting for every session: {s}" for s in bench.pg_settings),
        f"shoal: {shoal_version()}; {library_versions()}",
    ]


def table(rows: list[Row]) -> list[str]:
    lines = [
        "| N | system | create ms | end-to-end s | detection ms | items/s | worker peak RSS MiB |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        label = {"raw": "raw psycopg", "rawjobs": "raw loop with jobs"}.get(row.lib, row.lib)
        if row.skipped:
            lines.append(f"| {row.n:,} | {label} | skipped | | | | |")
            continue
        cut = row.cut_off
        if not row.ok and cut is not None:
            lines.append(
                f"| {row.n:,} | {label} | {cut.create_s * 1000:,.0f} | > {SLOW_BUDGET_S:.0f} "
                f"(cut off) | n/a | ~{cut.finished / cut.e2e_s:,.0f} | {cut.rss_mib:.1f} |"
            )
            continue
        if not row.ok:
            lines.append(f"| {row.n:,} | {label} | error | | | | |")
            continue
        e2e = row.median("e2e_s")
        lines.append(
            f"| {row.n:,} | {label} | {fmt(row.median('create_s'), ',.0f', 1000)} "
            f"| {fmt(e2e, '.2f')} | {fmt(row.median('detect_s'), ',.0f', 1000)} "
            f"| {fmt(row.n / e2e if e2e else None, ',.0f')} "
            f"| {fmt(row.median('rss_mib'), '.1f')} |"
        )
    return lines


def targets(rows: list[Row]) -> list[str]:
    by = {(r.lib, r.n): r for r in rows}

    def e2e(lib: str, n: int) -> float | None:
        row = by.get((lib, n))
        return row.median("e2e_s") if row and row.ok else None

    def verdict(ok: bool | None) -> str:
        return "n/a" if ok is None else ("met" if ok else "MISSED")

    lines = []
    shoal_10k, pgq_10k, raw_10k = e2e("shoal", 10_000), e2e("pgqueuer", 10_000), e2e("raw", 10_000)
    if shoal_10k and pgq_10k:
        ratio = pgq_10k / shoal_10k
        lines.append(
            f"- N=10,000: shoal end-to-end is {ratio:.2f}x faster than pgqueuer "
            f"({shoal_10k:.2f} s vs {pgq_10k:.2f} s; target >= 4x): {verdict(ratio >= 4)}"
        )
    if shoal_10k and raw_10k:
        ratio = shoal_10k / raw_10k
        lines.append(
            f"- N=10,000: shoal end-to-end is {ratio:.2f}x raw psycopg's "
            f"({shoal_10k:.2f} s vs {raw_10k:.2f} s; target <= 3x): {verdict(ratio <= 3)}"
        )
    # Issue 40: Level 2 at the limit.
    limit_10k, shoal_1k = e2e("rawjobs", 10_000), e2e("shoal", 1_000)
    if shoal_10k and limit_10k:
        ratio = shoal_10k / limit_10k
        lines.append(
            f"- N=10,000: shoal end-to-end is {ratio:.2f}x the raw loop with jobs' "
            f"({shoal_10k:.2f} s vs {limit_10k:.2f} s; target <= 1.2x): {verdict(ratio <= 1.2)}"
        )
    if shoal_1k:
        lines.append(
            f"- N=1,000: shoal end-to-end {shoal_1k:.2f} s (target <= 0.2 s): "
            f"{verdict(shoal_1k <= 0.2)}"
        )
    for row in rows:
        detect = row.median("detect_s") if row.lib == "shoal" and row.ok else None
        if detect is not None:
            lines.append(
                f"- N={row.n:,}: shoal closes {detect * 1000:.0f} ms after the last item "
                f"(target <= 50 ms): {verdict(detect <= 0.05)}"
            )
    big = by.get(("shoal", 100_000))
    if big and big.ok:
        t, rss = big.median("e2e_s"), big.median("rss_mib")
        assert t is not None and rss is not None
        lines.append(
            f"- N=100,000: shoal end-to-end {t:.2f} s (target < 10 s): {verdict(t < 10)}; "
            f"worker peak RSS {rss:.1f} MiB (target < 150 MiB): {verdict(rss < 150)}"
        )
    return lines


def details(rows: list[Row]) -> list[str]:
    lines = []
    for row in rows:
        label = f"{row.lib} N={row.n:,}"
        if row.skipped:
            lines.append(f"- {label}: skipped: {row.skipped}")
            continue
        runs = "; ".join(
            (
                f"error ({m.error.splitlines()[0][:200]})"
                if m.error
                else f"create {m.create_s * 1000:.0f} ms, "
                + (
                    f"cut off at {m.e2e_s:.2f} s, "
                    if m.cut_off
                    else f"e2e {m.e2e_s:.2f} s, detect {m.detect_s * 1000:.0f} ms, "
                )
                + f"RSS {m.rss_mib:.1f} MiB "
                f"(VmHWM {m.vm_hwm_mib:.1f}), worker CPU {m.worker_cpu_s:.1f} s, "
                f"database CPU {fmt(m.db_worker_cpu_s, '.1f')} s (worker) + "
                f"{fmt(m.db_parent_cpu_s, '.1f')} s (parent), "
                f"load {m.load:.2f}, "
                f"{m.polls} polls averaging {m.poll_s / max(m.polls, 1) * 1000:.1f} ms"
            )
            + (f" [{m.note}]" if m.note else "")
            for m in row.runs
        )
        lines.append(f"- {label}: {runs}" + (f" ({row.note})" if row.note else ""))
    return lines


def skip_reason(rows: list[Row], lib: str, n: int) -> str | None:
    """Why ``lib`` at ``n`` is not run: a smaller N projects it past SLOW_BUDGET_S."""
    if lib not in SLOW_LIBS:
        return None
    smaller = [r for r in rows if r.lib == lib and r.n < n]
    cut = next((r for r in smaller if r.cut_off is not None), None)
    if cut is not None:
        return f"cut off at N={cut.n:,} already"
    measured = [r for r in smaller if r.ok]
    if not measured:
        return None
    base = max(measured, key=lambda r: r.n)
    e2e = base.median("e2e_s")
    assert e2e is not None
    projected = e2e * n / base.n
    if projected <= SLOW_BUDGET_S:
        return None
    return (
        f"projected ~{projected:.0f} s from N={base.n:,} ({e2e:.2f} s), over the "
        f"~{SLOW_BUDGET_S:.0f} s budget for one run"
    )


async def main_async(args: argparse.Namespace) -> int:
    admin_url = os.environ.get("DATABASE_URL") or DEFAULT_URL
    libs = [lib.strip() for lib in args.libs.split(",") if lib.strip()]
    unknown = set(libs) - set(LIBS)
    if unknown or not libs:
        raise SystemExit(f"--libs: unknown {sorted(unknown)}; choose from {', '.join(LIBS)}")
    try:
        sizes = sorted({int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()})
    except ValueError:
        raise SystemExit(f"--sizes: comma-separated integers, got {args.sizes!r}") from None
    if not sizes or min(sizes) < 1 or max(sizes) > 100_000:
        raise SystemExit("--sizes: each between 1 and 100,000 (shoal's default item cap)")
    reps = {
        n: 1 if args.quick else (REPS_SMALL if n <= REPS_SMALL_MAX_N else REPS_LARGE) for n in sizes
    }
    # SIGINT and SIGTERM cancel the run, so the finally blocks stop the workers.
    # The flag is checked between polls too: a cancellation can be swallowed
    # inside a library call (seen once inside procrastinate's defer).
    main_task = asyncio.current_task()
    assert main_task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, functools.partial(_interrupt, main_task))

    bench = Bench(admin_url, libs, args.pgqueuer_driver, args.pg_setting)
    started = time.perf_counter()
    rows: list[Row] = []
    print(f"shoal batch bench: sizes {sizes}, libs {libs}, database {BENCH_DB}", flush=True)
    try:
        await bench.setup()
        for n in sizes:
            size_rows = {lib: Row(lib, n) for lib in libs}
            for lib in libs:
                size_rows[lib].skipped = skip_reason(rows, lib, n)
                if size_rows[lib].skipped:
                    print(f"  {lib} N={n:,}: skipped: {size_rows[lib].skipped}", flush=True)
            rows.extend(size_rows.values())
            # Repetitions interleave the libraries, so drifting load hits all of them.
            for rep in range(reps[n]):
                for lib in libs:
                    row = size_rows[lib]
                    if row.skipped or row.note:
                        continue
                    _check_interrupted()
                    m = await bench.measure(lib, n)
                    row.runs.append(m)
                    if (
                        lib in SLOW_LIBS
                        and rep + 1 < reps[n]
                        and (m.cut_off or m.e2e_s > REPEAT_MAX_S)
                    ):
                        row.note = (
                            f"run once: its first repetition took {m.e2e_s:.0f} s "
                            f"(> {REPEAT_MAX_S:.0f} s)"
                        )
                    if m.error:
                        print(f"  {lib:<13} N={n:>7,} rep {rep + 1}: ERROR {m.error}", flush=True)
                        continue
                    print(
                        f"  {lib:<13} N={n:>7,} rep {rep + 1}: create {m.create_s * 1000:7.1f} ms"
                        f"  e2e {m.e2e_s:7.2f} s  detect "
                        + ("   n/a" if m.cut_off else f"{m.detect_s * 1000:6.0f}")
                        + " ms"
                        f"  RSS {m.rss_mib:5.1f} MiB  load {m.load:.2f}"
                        + (f"  [{m.note}]" if m.note else ""),
                        flush=True,
                    )
    finally:
        await bench.close()
        _kill_live_children()
    print(
        f"\n(measured in {time.perf_counter() - started:.0f} s; load average at end "
        f"{', '.join(f'{x:.2f}' for x in os.getloadavg())})\n"
    )
    print("\n".join(header(bench, reps)))
    print()
    print("\n".join(table(rows)))
    print("\nTargets (from issues 3 and 40):")
    print("\n".join(targets(rows)) or "- (not measured: needs N=10,000 / 100,000)")
    print("\nPer repetition:")
    print("\n".join(details(rows)))
    print("\nSettings:")
    for lib in libs:
        print(f"- {lib}: {SETTINGS[lib].format(driver=bench.pgqueuer_driver)}")
    print(
        f"- every system: one worker process started per measurement and ready before the "
        f"clock starts (+{SETTLE_S} s settle); the parent polls every {POLL_S * 1000:.0f} ms "
        f"(or {POLL_SPACING}x the last poll's duration, if longer); "
        f"the baselines' aggregator runs every {AGGREGATE_EVERY_S:.0f} s in the worker process"
    )
    return 1 if any(m.error for r in rows for m in r.runs) else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument(
        "--sizes",
        default=",".join(str(n) for n in DEFAULT_SIZES),
        help="comma-separated item counts (default 1000,10000,100000)",
    )
    parser.add_argument(
        "--libs", default=",".join(LIBS), help=f"comma-separated subset of {','.join(LIBS)}"
    )
    parser.add_argument(
        "--quick", action="store_true", help="1 repetition per size (default: 3 up to 10,000)"
    )
    parser.add_argument(
        "--pgqueuer-driver",
        choices=("asyncpg", "psycopg"),
        default=default_pgqueuer_driver(),
        help="pgqueuer's database driver (default: asyncpg when installed)",
    )
    parser.add_argument(
        "--pg-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="diagnostic: ALTER DATABASE shoal_batch_bench SET NAME = VALUE (repeatable)",
    )
    parser.add_argument("--worker", choices=LIBS[1:], help=argparse.SUPPRESS)  # a baseline child
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    if args.worker:
        asyncio.run(baseline_worker(args.worker, args.pgqueuer_driver))
        return
    if str(ROOT) not in sys.path:  # run as a file: make ``bench`` and ``shoal`` importable
        sys.path.insert(0, str(ROOT))
    try:
        code = asyncio.run(main_async(args))
    except (KeyboardInterrupt, asyncio.CancelledError):  # SIGINT, or SIGTERM (see main_async)
        print("interrupted: worker processes stopped", file=sys.stderr)
        code = 130
    finally:
        _kill_live_children()
    sys.exit(code)


if __name__ == "__main__":
    main()
