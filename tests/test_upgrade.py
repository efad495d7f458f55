"""A database of the last release, with work in flight, upgraded while nothing is lost.

tests/upgrade/e3c978a.sql is a dump of a database migrated and worked by the
code of commit e3c978a (migrations 0001-0003; tests/upgrade/README.md says
how it was made and what it holds): jobs waiting, active under a dead
worker's lease and in retry; a batch task with pending items and items
running under a dead worker; ingest messages waiting and in flight. It is
restored, upgraded by this code's ``migrate``, checked against the declared
schema, and worked by this code's workers, aggregator, maintenance and ingest
consumer until every job, item and message has run exactly once.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from shoal import FakeClock, Shoal
from shoal.batch.item import Item
from shoal.batch.kinds import BatchKind
from shoal.batch.service import Batches
from shoal.batch.states import TaskOutcome
from shoal.db import Database, migrate
from shoal.db.migrate import load_migrations
from shoal.db.queries import parse_queries
from shoal.db.releases import released_versions
from shoal.ingest.message import Message, Topic
from shoal.ingest.pipeline import Pipeline
from shoal.ingest.postgres import PostgresTransport, topic_queue
from shoal.ingest.transport import Depth
from shoal.queue.job import Job
from shoal.queue.options import JobOptions
from shoal.queue.rows import JobSettings
from shoal.queue.states import JobState
from shoal.testing import Probe

from .batch_helpers import settle, sql, tally_mismatches
from .schema_catalog import describe
from .test_schema_declared import drift

DUMP = Path(__file__).parent / "upgrade" / "e3c978a.sql"
# What tests/upgrade/make_dump.py left in the dump.
START = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
JOBS = "upgrade.jobs"
KIND = "upgrade.items"
TOPIC: Topic[Any] = Topic("upgrade.readings")
# The schema of the release the dump was made with (shoal/db/releases.py).
RELEASED = sorted(released_versions()["0.1.0"])


def restore(url: str) -> None:
    """Replay the dump (plain SQL) into an empty database.

    pg_dump's ``\\restrict`` lines are psql's; nothing else in it needs psql.
    """
    text = "".join(
        line for line in DUMP.read_text().splitlines(keepends=True) if not line.startswith("\\")
    )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(text.encode())


async def test_a_released_database_with_work_in_flight_upgrades_and_every_piece_runs_once(
    empty_db_url: str,
) -> None:
    restore(empty_db_url)
    with psycopg.connect(empty_db_url) as conn:
        versions = conn.execute("SELECT version FROM shoal.migration ORDER BY version").fetchall()
    assert [v for (v,) in versions] == RELEASED
    async with Database(empty_db_url) as db:
        applied = await migrate(db)
    assert applied == [m.version for m in load_migrations() if m.version not in RELEASED]
    # An upgraded database has exactly the schema a new one gets.
    assert not drift(await describe(empty_db_url)), drift(await describe(empty_db_url))
    # The task in flight is counted as its items stand (item_tally, migration 0013).
    assert await sql(empty_db_url, "SELECT count(*) FROM shoal.item_tally") != [(0,)]
    assert await tally_mismatches(empty_db_url) == []

    clock = FakeClock(START)
    db = await Database(empty_db_url, max_size=10).open()
    boss = Shoal(db, clock=clock)
    probe = Probe(boss)
    jobs_ran: Counter[int] = Counter()
    items_ran: Counter[str] = Counter()
    messages_applied: Counter[str] = Counter()

    async def run_job(job: Job) -> None:
        jobs_ran[job.data["n"]] += 1

    async def run_item(item: Item) -> None:
        items_ran[item.ref] += 1

    async def apply(message: Message[Any]) -> None:
        messages_applied[message.id] += 1

    kind = BatchKind(name=KIND, handler=run_item, zombie_timeout=timedelta(seconds=60))
    batches = Batches(boss, {KIND: kind})
    (task,) = await batches.tasks()
    pipeline = Pipeline(boss, PostgresTransport(boss))
    await pipeline.start()
    stop = asyncio.Event()
    worker = boss.work(JOBS, run_job)
    items = batches.work(KIND)
    consumer = asyncio.create_task(
        pipeline.consumer(TOPIC, apply, concurrency=2, poll=timedelta(seconds=1)).run(stop)
    )
    try:
        # What was waiting runs at once: 5 jobs, 5 items, 4 messages.
        await probe.job_finished(JOBS, outcome="completed", count=5)
        await probe.job_finished(kind.queue, outcome="completed", count=5)
        await probe.message_applied(TOPIC.name, count=4)
        # Past the failed jobs' retry delay, the dead workers' leases (jobs:
        # 30 s, messages: the ack wait, 5 min, kept by the move to the topic's
        # table) and the items' zombie timeout: maintenance puts the jobs
        # back, the consumer's next claim takes the messages again, the
        # aggregator reaps the items and sends them new jobs.
        clock.advance(timedelta(minutes=6))
        report = await boss.maintain()
        assert (report.retried, report.failed) == (3, 0)
        assert (await batches.aggregator.run_once()).reaped_to_pending == 3
        await probe.job_finished(JOBS, outcome="completed", count=2)
        await probe.job_finished(kind.queue, outcome="completed", count=3)
        await probe.message_applied(TOPIC.name, count=2)
        # The jobs whose lease expired wait out their retry delay (60 s).
        clock.advance(timedelta(seconds=61))
        await probe.job_finished(JOBS, outcome="completed", count=3)
        await settle(batches, task.task_id)
    finally:
        stop.set()
        await consumer
        await items.stop(grace=timedelta(seconds=5))
        await worker.stop()
        await pipeline.close()

    assert jobs_ran == Counter(range(10))
    assert items_ran == Counter(f"item-{n}" for n in range(8))
    assert messages_applied == Counter(f"m-{n}" for n in range(6))
    assert {j.state for j in await boss.jobs(JOBS, limit=100)} == {JobState.COMPLETED}
    view = await batches.get(task.task_id)
    assert (view.outcome, view.progress.completed) == (TaskOutcome.COMPLETED, 8)
    assert await tally_mismatches(empty_db_url) == []
    # Acknowledged: deleted, and none left behind in the job table.
    assert await boss.jobs(topic_queue(TOPIC.name), limit=100) == []
    assert await PostgresTransport(boss).depth(TOPIC.name, "shoal") == Depth(0, 0, 0, None)
    await boss.close()


def previous_release(layer: str) -> dict[str, Any]:
    """The statements the previous release's workers run (its queries.sql, kept verbatim)."""
    text = (DUMP.parent / "e3c978a_queries" / f"{layer}.sql").read_text()
    return parse_queries(text, "shoal", regclasses=["job_id_seq"], where=f"e3c978a {layer}")


async def test_workers_of_the_previous_release_run_beside_this_ones_on_the_upgraded_schema(
    empty_db_url: str,
) -> None:
    """Mid-roll, old and new workers claim from the same queues: each piece goes to one.

    The previous release's workers are stood in for by its own statements
    (tests/upgrade/e3c978a_queries), which call the unversioned functions
    the upgrade keeps; this release's are its stores, which call the _v1 ones.
    """
    restore(empty_db_url)
    old_queue, old_batch = previous_release("queue"), previous_release("batch")
    clock = FakeClock(START)
    now = clock.now()
    async with Database(empty_db_url) as db:
        await migrate(db)
        boss = Shoal(db, clock=clock, listen=False)
        batches = Batches(boss, {KIND: BatchKind(name=KIND, handler=noop)})
        item_queue = batches.kind(KIND).queue

        async def old(query: Any, **params: Any) -> list[tuple[Any, ...]]:
            return await db.fetch(query, params)

        # Plain jobs. (The previous release's transport claimed ingest
        # messages with the queue's claim_jobs: the upgrade moved them to the
        # topic's table, tests/test_upgrade_topics.py.)
        for queue, waiting in ((JOBS, 5),):
            by_old = await old(old_queue["claim_jobs"], queue=queue, limit=2, now=now)
            by_new = await boss.store.claim(queue, 10, now=now)
            assert len(by_old) == 2 and len(by_new) == waiting - 2
            assert not {r[0] for r in by_old} & {j.id for j in by_new}
            done = await old(
                old_queue["complete_jobs"],
                ids=[r[0] for r in by_old],
                attempts=[r[4] for r in by_old],
                outputs=[],
                now=now,
            )
            assert len(done) == 2
            assert (
                len(await boss.store.complete([(j.id, j.attempt, None) for j in by_new], now=now))
                == waiting - 2
            )

        # Item jobs: the old claim and the new one split the pending items.
        items_old = await old(old_batch["claim_items"], queue=item_queue, limit=2, now=now)
        items_new = (await batches.store.claim_items(item_queue, 10, now=now)).jobs
        assert len(items_old) == 2 and len(items_new) == 3
        assert all(item is not None for _, item in items_new)
        assert not {r[15] for r in items_old} & {item.id for _, item in items_new if item}
        recorded = await old(
            old_batch["complete_items"],
            ids=[r[15] for r in items_old],
            attempts=[r[16] for r in items_old],
            results=[],
            job_ids=[],
            job_attempts=[],
            now=now,
        )
        assert {(what, id_) for what, id_, _ in recorded if what == "item"} == {
            ("item", r[15]) for r in items_old
        }
        # A task the previous release creates (jobs without a turn) is run by this one.
        (task_id,) = (await old(old_batch["insert_task"], **new_task(item_queue)))[0]
        settings = JobSettings.of(item_queue, boss.defaults.merged(batches.kind(KIND).job_options))
        (count,) = (
            await old(
                old_batch["insert_items"],
                task_id=task_id,
                refs=["x", "y"],
                data=[],
                now=now,
                **settings.params(),
            )
        )[0]
        assert count == 2
        taken = (await batches.store.claim_items(item_queue, 10, now=now)).jobs
        assert sorted(item.ref for _, item in taken if item) == ["x", "y"]


async def noop(item: Item) -> None:
    return None


def new_task(item_queue: str) -> dict[str, Any]:
    return {
        "kind": KIND,
        "idempotency_key": None,
        "request_hash": "h",
        "params": "null",
        "total": 2,
        "max_attempts": 3,
        "zombie_timeout_s": 60.0,
        "deadline_s": None,
        "item_queue": item_queue,
        "job_options": "{}",
        "on_complete_queue": None,
        "now": START,
    }


async def test_the_previous_releases_maintenance_archives_on_the_upgraded_schema(
    empty_db_url: str,
) -> None:
    """Its archiving copies job rows into the archive by position: the job table's
    columns, then archived_at. Migration 10 added columns to the job table and
    kept that order in the archive."""
    restore(empty_db_url)
    old_queue = previous_release("queue")
    clock = FakeClock(START)
    async with Database(empty_db_url) as db:
        await migrate(db)
        boss = Shoal(db, clock=clock, listen=False)
        await boss.declare_limits("upgrade.limited", global_concurrency=1, partition_by="k")
        await boss.send("upgrade.limited", {"k": "a"}, cost=3)
        (job,) = await boss.fetch("upgrade.limited")
        assert await boss.complete(job)
        clock.advance(timedelta(seconds=1))
        params = {"retention_s": 0, "limit": 100, "now": clock.now()}

        async def archive(conn: Any) -> int:
            cur = await conn.execute(old_queue["archive_finished"], params)
            return int(cur.rowcount)

        assert await db.run(archive) >= 1
        async with db.connection() as conn:
            cur = await conn.execute(
                "SELECT partition_key, cost, archived_at FROM shoal.job_archive WHERE id = %s",
                (job.id,),
            )
            assert await cur.fetchall() == [("a", 3, clock.now())]
        assert (await boss.get_job(job.id)).state is JobState.COMPLETED
        # A job its code sends to a limited queue has no partition key;
        # maintenance gives it one, and it runs under the queue's limits.
        send_params = {
            **JobSettings.of("upgrade.limited", JobOptions()).params(),
            "option_set": [1],
            "data": ['{"k": "b"}'],
            "singleton_key": [],
            "now": clock.now(),
        }
        for name in (
            "queue",
            "priority",
            "retry_limit",
            "retry_delay_s",
            "retry_backoff",
            "retry_delay_max_s",
            "expire_in_s",
            "dead_letter",
            "start_at",
            "start_in_s",
        ):
            send_params[name] = [send_params[name]]  # fmt: skip
        ((sent,),) = await db.fetch(old_queue["insert_jobs"], send_params)
        assert await boss.fetch("upgrade.limited") == []
        assert (await boss.maintain()).keys_stamped == 1
        assert [j.id for j in await boss.fetch("upgrade.limited")] == [sent]
