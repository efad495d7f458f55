"""Batch tasks from synchronous code (SyncBatches) and SQL (shoal.create_task), run by a worker."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from shoal import (
    App,
    Batches,
    BatchKind,
    Conflict,
    IdempotencyMismatch,
    InvalidInput,
    Item,
    NotFound,
    Shoal,
    StillCreating,
    SyncBatches,
    SyncClient,
    TaskOutcome,
    TaskStatus,
)
from shoal.hooks import Event
from shoal.testing import Probe

from .conftest import require_program

KIND = "sync.kind"


async def noop(item: Item) -> None:
    return None


@pytest.fixture
def client(db_url: str) -> Iterator[SyncClient]:
    with SyncClient.connect(db_url, max_size=2) as sync_client:
        yield sync_client


@pytest.fixture
async def batches(boss: Shoal) -> Batches:
    """The async API over a kind whose settings are stored, as a worker's start stores them."""
    kinds = {
        KIND: BatchKind(KIND, noop, retry_limit=5),
        "sync.other": BatchKind("sync.other", noop),
    }
    api = Batches(boss, kinds)
    await api.store_kinds()
    return api


def counts(url: str) -> tuple[int, int, int]:
    """Tasks, items and jobs in the database."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM shoal.task), (SELECT count(*) FROM shoal.item),"
            " (SELECT count(*) FROM shoal.job)"
        ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def sql_create(url: str, kind: Any, items: Any, options: Any = None) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT shoal.create_task(%s, %s, %s)::text",
            (kind, Jsonb(items), None if options is None else Jsonb(options)),
        ).fetchone()
    assert row is not None
    return str(row[0])


async def test_a_task_created_from_sync_code_is_run_by_a_worker_until_it_completes(
    boss: Shoal, db_url: str
) -> None:
    app = App()

    @app.batch("sync.upper", concurrency=4)
    def upper(item: Item) -> dict[str, Any]:  # a plain def, run in the kind's threads
        return {"ref": item.ref.upper(), "data": item.data, "params": item.params}

    started = asyncio.Event()

    @app.on_start
    async def ready(shoal: Shoal) -> None:
        started.set()

    probe = Probe(boss)
    stop = asyncio.Event()
    runner = asyncio.create_task(app.run(boss, stop=stop, maintenance=False, scheduler=False))
    try:
        await asyncio.wait_for(started.wait(), timeout=30)  # the kinds are stored by now
        with SyncClient.connect(db_url, max_size=1) as client:
            sync = SyncBatches(client)
            items: list[str | dict[str, Any]] = ["a", {"ref": "b", "data": {"n": 2}}, {"ref": "c"}]
            created = await asyncio.to_thread(
                sync.create, "sync.upper", items, params={"run": 1}, idempotency_key="k1"
            )
            assert created.created

            def closes_it(event: Event) -> bool:
                return any(t.id == created.task_id for t in event["report"].closed)

            # The last item's worker wakes the aggregator, which closes the task.
            await probe.aggregator_pass(closes_it)
            view = await asyncio.to_thread(sync.get, created.task_id)
        assert (view.status, view.outcome) == (TaskStatus.COMPLETED, TaskOutcome.COMPLETED)
        assert view.progress.completed == 3 and view.params == {"run": 1}
        rows = await app.batches(boss).export_rows(created.task_id)
        assert [r.result for r in rows] == [
            {"ref": "A", "data": None, "params": {"run": 1}},
            {"ref": "B", "data": {"n": 2}, "params": {"run": 1}},
            {"ref": "C", "data": None, "params": {"run": 1}},
        ]
    finally:
        stop.set()
        await runner


async def test_a_create_in_the_callers_transaction_exists_only_if_it_commits(
    batches: Batches, client: SyncClient, db_url: str
) -> None:
    sync = SyncBatches(client)
    with psycopg.connect(db_url) as conn:
        with pytest.raises(RuntimeError), conn.transaction():
            conn.execute("CREATE TABLE upload (id int)")
            sync.create(KIND, ["a", "b"], conn=conn)
            raise RuntimeError("rolled back")
        assert counts(db_url) == (0, 0, 0)

        listener = psycopg.connect(db_url, autocommit=True)
        listener.execute("LISTEN shoal_jobs")
        with conn.transaction():
            conn.execute("CREATE TABLE upload (id int)")
            created = sync.create(KIND, ["a", "b"], idempotency_key="u1", conn=conn)
            assert counts(db_url) == (0, 0, 0)  # not visible before the commit
            # Read in the same transaction, before the commit.
            assert sync.get(created.task_id, conn=conn).progress.pending == 2
            # A refused create leaves the caller's transaction usable.
            with pytest.raises(InvalidInput, match=r"items\[1\].ref: duplicate ref 'a'"):
                sync.create(KIND, ["a", "a"], conn=conn)
            conn.execute("INSERT INTO upload VALUES (1)")
        assert counts(db_url) == (1, 2, 2)
        # Idle workers of the kind are woken when the caller commits.
        woken = [n.payload for n in listener.notifies(timeout=10, stop_after=1)]
        listener.close()
        assert woken == [f"batch.{KIND}"]

    # An autocommit connection gets a transaction of its own: all or nothing.
    with psycopg.connect(db_url, autocommit=True) as conn:
        again = sync.create(KIND, ["a", "b"], idempotency_key="u1", conn=conn)
        other = sync.create(KIND, ["x"], conn=conn)
    assert (again.task_id, again.created) == (created.task_id, False)
    assert other.created and counts(db_url) == (2, 3, 3)

    # The task's settings and its jobs' options are the stored kind's.
    row = await batches.store.get_task(created.task_id)
    assert row is not None and row.kind == KIND
    with psycopg.connect(db_url) as conn:
        jobs = conn.execute("SELECT DISTINCT queue, retry_limit FROM shoal.job").fetchall()
    assert jobs == [(f"batch.{KIND}", 5)]
    with pytest.raises(IdempotencyMismatch, match="'u1' was used for a different request"):
        sync.create(KIND, ["a", "c"], idempotency_key="u1")


async def test_a_create_bigger_than_one_deadline_sets_the_callers_statement_timeout_back(
    batches: Batches, client: SyncClient, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shoal.batch import plans

    # Tasks of more than 2 items get a longer statement timeout for their insert.
    monkeypatch.setattr(plans, "ITEMS_PER_DEADLINE", 2)
    sync = SyncBatches(client)
    with psycopg.connect(db_url) as conn:
        for setting in ("0", "1min", "5s"):
            with conn.transaction():
                conn.execute("SELECT set_config('statement_timeout', %s, true)", (setting,))
                created = sync.create(KIND, ["a", "b", "c", "d", "e"], conn=conn)
                shown = conn.execute("SHOW statement_timeout").fetchone()
            assert shown is not None and shown[0] == setting
    assert (await batches.get(created.task_id)).progress.total == 5
    assert counts(db_url) == (3, 15, 15)


def test_a_create_behind_an_identical_one_in_flight_is_told_it_is_still_being_created(
    batches: Batches, client: SyncClient, db_url: str
) -> None:
    sync = SyncBatches(client)

    def in_a_transaction_that_goes_on() -> Any:
        with psycopg.connect(db_url) as conn, conn.transaction():
            conn.execute("SELECT 1")
            with pytest.raises(StillCreating):
                sync.create(KIND, ["a"], idempotency_key="busy", conn=conn)
            return conn.execute("SELECT 2").fetchone()  # only the create was undone

    with psycopg.connect(db_url) as holder:
        sync.create(KIND, ["a"], idempotency_key="busy", conn=holder)  # holds the key
        # The three wait side by side, each for the 5 s of IDEMPOTENCY_WAIT.
        with ThreadPoolExecutor(3) as pool:
            from_sync = pool.submit(sync.create, KIND, ["a"], idempotency_key="busy")
            from_sql = pool.submit(sql_create, db_url, KIND, ["a"], {"idempotency_key": "busy"})
            in_caller = pool.submit(in_a_transaction_that_goes_on)
            with pytest.raises(StillCreating, match="'busy': an identical request is still"):
                from_sync.result(timeout=60)
            with pytest.raises(psycopg.errors.LockNotAvailable, match="'busy': an identical"):
                from_sql.result(timeout=60)
            assert in_caller.result(timeout=60) == (2,)
        holder.rollback()
    assert counts(db_url) == (0, 0, 0)


async def test_get_and_cancel_from_sync_code(batches: Batches, client: SyncClient) -> None:
    sync = SyncBatches(client)
    created = sync.create(KIND, [str(i) for i in range(5)])
    view = sync.cancel(created.task_id)
    assert view.progress.cancelled == 5 and view.status is TaskStatus.PROCESSING
    await batches.aggregator.run_once()
    closed = sync.get(created.task_id)
    assert (closed.status, closed.outcome) == (TaskStatus.CANCELLED, TaskOutcome.CANCELLED)
    assert closed == await batches.get(created.task_id)
    with pytest.raises(Conflict, match="is already cancelled"):
        sync.cancel(created.task_id)
    for missing in ("nope", "00000000-0000-0000-0000-000000000000"):
        with pytest.raises(NotFound, match="does not exist"):
            sync.get(missing)


def test_psql_creates_a_task_and_is_told_which_field_is_wrong(
    batches: Batches, db_url: str
) -> None:
    psql = require_program("psql", "postgresql-client")
    made = subprocess.run(
        [psql, db_url, "-XAtq", "-v", "ON_ERROR_STOP=1", "-c",
         f"""SELECT shoal.create_task('{KIND}', '["doc-1", {{"ref": "doc-2", "data": {{"p": 3}}}}]',
                                      '{{"idempotency_key": "k", "params": {{"model": "m"}}}}')"""],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    refused = subprocess.run(
        [psql, db_url, "-XAtq", "-c", f"""SELECT shoal.create_task('{KIND}', '["a", ""]')"""],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "items[1].ref: must be a non-empty string" in refused.stderr
    task_id = made.stdout.strip()
    with psycopg.connect(db_url) as conn:
        task = conn.execute(
            "SELECT kind, total, params, max_attempts, item_queue FROM shoal.task WHERE id = %s",
            (task_id,),
        ).fetchone()
        items = conn.execute("SELECT ref, data FROM shoal.item ORDER BY id").fetchall()
        jobs = conn.execute("SELECT queue, retry_limit FROM shoal.job ORDER BY id").fetchall()
    assert task == (KIND, 2, {"model": "m"}, 6, f"batch.{KIND}")
    assert items == [("doc-1", None), ("doc-2", {"p": 3})]
    assert jobs == [(f"batch.{KIND}", 5)] * 2
    # The same request with its key answers the same task; another request does not.
    options = {"idempotency_key": "k", "params": {"model": "m"}}
    assert sql_create(db_url, KIND, ["doc-1", {"ref": "doc-2", "data": {"p": 3}}], options) == (
        task_id
    )
    with pytest.raises(psycopg.errors.UniqueViolation, match="'k' was used for a different"):
        sql_create(db_url, KIND, ["doc-1"], options)


async def test_sql_create_from_a_trigger_runs_in_the_callers_transaction(
    batches: Batches, db_url: str
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"""
            CREATE TABLE upload (id bigint PRIMARY KEY, files jsonb NOT NULL);
            CREATE FUNCTION upload_extract() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM shoal.create_task('{KIND}', NEW.files,
                    jsonb_build_object('idempotency_key', 'upload-' || NEW.id));
                RETURN NEW;
            END $$;
            CREATE TRIGGER upload_extract AFTER INSERT ON upload
                FOR EACH ROW EXECUTE FUNCTION upload_extract();
        """)
        with pytest.raises(RuntimeError), conn.transaction():
            conn.execute("""INSERT INTO upload VALUES (1, '["a.pdf", "b.pdf"]')""")
            raise RuntimeError("rolled back")
        assert counts(db_url) == (0, 0, 0)
        with conn.transaction():
            conn.execute("""INSERT INTO upload VALUES (2, '["a.pdf", "b.pdf", "c.pdf"]')""")
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="items: is empty"):
            conn.execute("""INSERT INTO upload VALUES (3, '[]')""")
        key = conn.execute("SELECT id::text, idempotency_key FROM shoal.task").fetchall()
    assert counts(db_url) == (1, 3, 3)
    (task_id, idempotency_key), = key  # fmt: skip
    assert idempotency_key == "upload-2"
    view = await batches.get(task_id)
    assert (view.kind, view.progress.pending) == (KIND, 3)


BAD_CREATES: list[tuple[Any, Any, dict[str, Any]]] = [
    ("nope", ["a"], {}),
    (None, ["a"], {}),
    (KIND, ["a"], {"idempotency_key": ""}),
    (KIND, ["a"], {"idempotency_key": 7}),
    (KIND, ["a"], {"idempotency_key": "k" * 256}),
    (KIND, ["a"], {"deadline": "soon"}),
    (KIND, ["a"], {"deadline": True}),
    (KIND, ["a"], {"deadline": 0}),
    (KIND, ["a"], {"deadline": -1.5}),
    (KIND, ["a"], {"deadline": 10**10}),
    (KIND, [], {}),
    (KIND, {"ref": "a"}, {}),
    (KIND, "a", {}),
    (KIND, ["a", "b", "a"], {}),
    (KIND, ["a", {"ref": "b"}, {"ref": "b", "data": 1}], {}),
    (KIND, ["a", ""], {}),
    (KIND, ["a", 5], {}),
    (KIND, ["a", None], {}),
    (KIND, ["a", [1, 2]], {}),
    (KIND, ["a", "r" * 513], {}),
    (KIND, ["a", {"data": 1}], {}),
    (KIND, ["a", {"ref": "b", "date": 1, "Extra": 2}], {}),
    (KIND, ["a", {"ref": "b", "data": "x" * 9000}], {}),
    (KIND, ["a", "", "a"], {}),
    (KIND, ["a", "a", ""], {}),
    (KIND, ["a", {"ref": "b", "partition_key": True}], {}),
    (KIND, ["a", {"ref": "b", "partition_key": 1.5}], {}),
    (KIND, ["a", {"ref": "b", "partition_key": ["k"]}], {}),
    (KIND, ["a", {"ref": "b", "partition_key": "k" * 513}], {}),
    (KIND, [{"ref": "a", "partition_key": {}}, "a"], {}),
    (KIND, ["a", {"ref": "b", "partition_key": "k", "key": 1}], {}),
    (KIND, ["a"], {"params": "x" * 9000}),
]


async def test_bad_input_gets_the_same_message_from_python_sync_python_and_sql(
    batches: Batches, client: SyncClient, db_url: str
) -> None:
    sync = SyncBatches(client)
    for kind, items, options in BAD_CREATES:
        with pytest.raises(InvalidInput) as from_async:
            await batches.create(kind, items, **options)
        with pytest.raises(InvalidInput) as from_sync:
            sync.create(kind, items, **options)
        with pytest.raises(psycopg.errors.InvalidParameterValue) as from_sql:
            sql_create(db_url, kind, items, options)
        case = (kind, str(items)[:40], str(options)[:40])
        assert str(from_sync.value) == str(from_async.value), case
        assert from_sql.value.diag.message_primary == str(from_async.value), case
        assert from_sql.value.diag.column_name == from_async.value.field, case
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="retry_limit: unknown task"):
        sql_create(db_url, KIND, ["a"], {"retry_limit": 1})
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="options: must be a JSON"):
        sql_create(db_url, KIND, ["a"], ["k"])
    assert counts(db_url) == (0, 0, 0)


async def test_the_sql_examples_of_the_batch_page_run(boss: Shoal, db_url: str) -> None:
    """docs/batch.md's SQL blocks, in order, on a database with the kind they use."""
    import re
    from pathlib import Path

    await Batches(boss, {"extract_paper": BatchKind("extract_paper", noop)}).store_kinds()
    page = (Path(__file__).parent.parent / "docs" / "batch.md").read_text()
    blocks = re.findall(r"^```sql\n(.*?)^```$", page, re.MULTILINE | re.DOTALL)
    assert blocks
    with psycopg.connect(db_url, autocommit=True) as conn:
        for block in blocks:
            conn.execute(block)
        conn.execute("""INSERT INTO uploads (files) VALUES ('["doc-8"]')""")
        tasks = conn.execute(
            "SELECT total, idempotency_key, params FROM shoal.task ORDER BY created_at, total"
        ).fetchall()
    assert sorted(tasks, key=str) == sorted(
        [
            (2, None, None),
            (3, "upload-7", {"model": "small"}),
            (2, "upload-1", None),
            (1, "upload-2", None),
        ],
        key=str,
    )
