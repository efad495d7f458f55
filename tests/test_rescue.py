"""The jobs of a worker process whose heartbeat stopped are handed back promptly.

These stage what a crash leaves (a registered process holding active jobs,
then silent) on a fake clock and call maintenance's ``run_once()``; the real
crash, a SIGKILLed ``shoal worker``, is in tests/test_rescue_processes.py.
"""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest

from shoal import JobId, Shoal
from shoal.api import create_api
from shoal.batch.kinds import BatchKind
from shoal.batch.service import Batches
from shoal.cli.parse import parser
from shoal.clock import FakeClock
from shoal.db import Database
from shoal.db.pool import AsyncConn
from shoal.errors import InvalidInput, TransientError
from shoal.queue.registry import DEFAULT_RESCUE_AFTER, WorkerRegistry
from tests.test_cli_env import resolved

RESCUE_AFTER = timedelta(seconds=10)
# Long enough that no lease runs out in these tests: only the rescue can act.
EXPIRE_IN = timedelta(minutes=15)


@pytest.fixture
async def holder(db_url: str, clock: FakeClock) -> AsyncIterator[Shoal]:
    """A second client on the same clock: the worker process that holds the jobs."""
    db = await Database(db_url, max_size=4).open()
    client = Shoal(db, clock=clock, listen=False, rescue_after=RESCUE_AFTER)
    try:
        yield client
    finally:
        await client.close()


async def registered(client: Shoal, app: str = "billing") -> WorkerRegistry:
    registry = client.process_registry()
    registry.app = app
    await registry.register()
    return registry


async def send(boss: Shoal, count: int) -> list[JobId]:
    ids = []
    for i in range(count):
        job_id = await boss.send("work", {"i": i}, expire_in=EXPIRE_IN, retry_delay=0)
        assert job_id is not None
        ids.append(job_id)
    return ids


async def test_jobs_of_a_silent_process_are_handed_back_with_a_note_naming_it(
    fake_boss: Shoal, holder: Shoal, clock: FakeClock
) -> None:
    registry = await registered(holder)
    ids = await send(fake_boss, 4)
    # Both claims record the process: the worker's and the limited one (fetch).
    claimed = await holder.store.claim("work", 2, now=clock.sql_now())
    fetched = await holder.fetch("work", 2)
    assert {c.id for c in claimed} | {j.id for j in fetched} == set(ids)
    maintenance = fake_boss.maintenance()
    assert (await maintenance.run_once()).rescued == 0

    clock.advance(RESCUE_AFTER)  # silent exactly rescue_after: not yet
    assert (await maintenance.run_once()).rescued == 0
    clock.advance(timedelta(seconds=1))
    report = await maintenance.run_once()

    assert report.rescued == 4
    for job_id in ids:
        record = await fake_boss.get_job(job_id)
        assert record.state == "retry"
        note = record.errors[-1]
        assert note.type == "WorkerGone"
        for part in (socket.gethostname(), f"pid {os.getpid()}", "app billing", registry.id):
            assert part in note.message, (part, note.message)
        assert "stopped heartbeating" in note.message
    (row,) = [w for w in await registry.workers() if w.id == registry.id]
    assert row.gone and row.rescued == 4 and row.rescued_at == clock.now()
    # Handed back once: the next pass finds nothing of that process.
    assert (await maintenance.run_once()).rescued == 0


async def test_jobs_of_a_live_process_are_kept_however_long_they_run(
    fake_boss: Shoal, holder: Shoal, clock: FakeClock
) -> None:
    registry = await registered(holder)
    ids = await send(fake_boss, 3)
    await holder.store.claim("work", 3, now=clock.sql_now())
    maintenance = fake_boss.maintenance()

    # Ten minutes of a slow handler, the process heartbeating as it does.
    for _ in range(120):
        assert (await maintenance.run_once()).rescued == 0
        clock.advance(timedelta(seconds=registry.heartbeat_s))
        await registry.heartbeat()

    assert [(await fake_boss.get_job(i)).state for i in ids] == ["active"] * 3


async def test_each_process_is_judged_by_its_own_rescue_after(
    fake_boss: Shoal, db_url: str, clock: FakeClock
) -> None:
    # A process with a longer setting, judged by a maintenance whose own is short.
    db = await Database(db_url, max_size=4).open()
    patient = Shoal(db, clock=clock, listen=False, rescue_after=timedelta(minutes=5))
    try:
        await registered(patient)
        (job_id,) = await send(fake_boss, 1)
        await patient.store.claim("work", 1, now=clock.sql_now())
        await fake_boss.maintain()
        clock.advance(timedelta(minutes=4))
        assert (await fake_boss.maintain()).rescued == 0
        clock.advance(timedelta(minutes=1, seconds=1))
        assert (await fake_boss.maintain()).rescued == 1
        assert (await fake_boss.get_job(job_id)).state == "retry"
    finally:
        await patient.close()


async def test_a_late_answer_of_the_silent_process_is_refused(
    fake_boss: Shoal, holder: Shoal, clock: FakeClock
) -> None:
    await registered(holder)
    (job_id,) = await send(fake_boss, 1)
    (stale,) = await holder.fetch("work", 1)
    await fake_boss.maintain()
    clock.advance(RESCUE_AFTER + timedelta(seconds=1))
    assert (await fake_boss.maintain()).rescued == 1

    # The job runs again elsewhere; the old holder wakes up and answers.
    (fresh,) = await fake_boss.fetch("work", 1)
    assert fresh.attempt == stale.attempt + 1
    assert await holder.complete(stale, {"by": "old"}) is False
    assert await holder.fail(stale, "late failure") is None
    assert await fake_boss.complete(fresh, {"by": "new"}) is True

    record = await fake_boss.get_job(job_id)
    assert record.state == "completed" and record.output == {"by": "new"}
    assert [e.type for e in record.errors] == ["WorkerGone"]


async def test_jobs_claimed_without_a_registry_row_wait_for_their_lease(
    fake_boss: Shoal, db_url: str, clock: FakeClock
) -> None:
    # A client that runs no workers (register=False) has no row to judge.
    db = await Database(db_url, max_size=4).open()
    loner = Shoal(db, clock=clock, listen=False, register=False)
    try:
        (job_id,) = await send(fake_boss, 1)
        await loner.store.claim("work", 1, now=clock.sql_now())
        await fake_boss.maintain()
        clock.advance(timedelta(minutes=5))
        assert (await fake_boss.maintain()).rescued == 0
        assert (await fake_boss.get_job(job_id)).state == "active"
    finally:
        await loner.close()


async def test_after_the_database_was_away_no_process_is_judged_silent_at_once(
    db_url: str, observer: Shoal, holder: Shoal, clock: FakeClock
) -> None:
    registry = await registered(holder)
    (job_id,) = await send(holder, 1)
    await holder.store.claim("work", 1, now=clock.sql_now())
    # Maintenance in a process whose calls give up after a second.
    db = await Database(db_url, max_size=2, deadline=timedelta(seconds=1)).open()
    rescuer = Shoal(db, clock=clock, listen=False, register=False)
    try:
        maintenance = rescuer.maintenance()
        assert (await maintenance.run_once()).rescued == 0

        # The database is away (here: the registry locked) for minutes: no
        # heartbeat gets through, no maintenance pass either.
        async def outage(conn: AsyncConn) -> None:
            await conn.execute("LOCK TABLE shoal.worker IN ACCESS EXCLUSIVE MODE")
            clock.advance(timedelta(minutes=3))
            with pytest.raises(TransientError):
                await maintenance.run_once()

        await observer.db.run(outage)

        # Back: this pass must not take the holder for dead; its heartbeat
        # comes within rescue_after, and it keeps its job.
        assert (await maintenance.run_once()).rescued == 0
        clock.advance(RESCUE_AFTER / 2)
        await registry.heartbeat()
        clock.advance(RESCUE_AFTER / 2 + timedelta(seconds=1))
        assert (await maintenance.run_once()).rescued == 0
        assert (await holder.get_job(job_id)).state == "active"
        # Silent for rescue_after past the outage: now it is.
        clock.advance(RESCUE_AFTER / 2)
        assert (await maintenance.run_once()).rescued == 1
    finally:
        await rescuer.close()


@pytest.mark.parametrize("bad", [timedelta(0), timedelta(milliseconds=500), 60, None])
async def test_rescue_after_is_validated(db_url: str, bad: object) -> None:
    db = await Database(db_url, max_size=1).open()
    try:
        with pytest.raises(InvalidInput) as caught:
            Shoal(db, rescue_after=bad)  # type: ignore[arg-type]  # the bad values under test
        assert caught.value.field == "rescue_after"
    finally:
        await db.close()


async def test_the_job_page_names_its_holder_and_the_workers_page_what_was_rescued(
    fake_boss: Shoal, holder: Shoal, clock: FakeClock
) -> None:
    registry = await registered(holder)
    (job_id,) = await send(fake_boss, 1)
    await holder.store.claim("work", 1, now=clock.sql_now())
    api = create_api(fake_boss, Batches(fake_boss, {}), token=None)
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        job = (await client.get(f"/v1/jobs/{job_id}")).json()
        assert job["state"] == "active" and job["holder"] == registry.id

        await fake_boss.maintain()
        clock.advance(RESCUE_AFTER + timedelta(seconds=1))
        assert (await fake_boss.maintain()).rescued == 1

        job = (await client.get(f"/v1/jobs/{job_id}")).json()
        assert job["state"] == "retry" and job["holder"] is None
        assert job["errors"][-1]["type"] == "WorkerGone"
        (row,) = [w for w in (await client.get("/v1/workers")).json()["workers"]]
        assert row["id"] == registry.id and row["gone"] is True
        assert row["rescued"] == 1 and row["rescued_at"] == clock.now().isoformat()


def test_batch_items_of_a_dead_process_are_reaped_within_the_default_rescue_after() -> None:
    # An item's job is gone once it runs: its zombie timeout is what brings it
    # back, by default as soon as a dead process's jobs come back.
    kind = BatchKind("k", handler=lambda item: None)
    assert kind.zombie_timeout == DEFAULT_RESCUE_AFTER <= timedelta(seconds=60)


async def test_an_item_reaped_from_a_silent_process_names_it(
    fake_boss: Shoal, holder: Shoal, clock: FakeClock
) -> None:
    registry = await registered(holder, app="papers")
    kind = BatchKind("reaped.kind", handler=lambda item: None, zombie_timeout=RESCUE_AFTER)
    created = await Batches(fake_boss, {kind.name: kind}).create(kind.name, ["a"])
    # The holder's runner claims the item (it is running, named by its number)...
    claimed = (
        await Batches(holder, {kind.name: kind})
        .runners[kind.name]
        .claim(kind.queue, 10, now=clock.now())
    )
    assert len(claimed) == 1
    # ... and goes silent past the zombie timeout; another process's aggregator reaps it.
    clock.advance(RESCUE_AFTER + timedelta(seconds=1))
    batches = Batches(fake_boss, {kind.name: kind})
    assert (await batches.aggregator.run_once()).reaped_to_pending == 1
    (item,) = (await batches.items(created.task_id)).items
    note = item.errors[-1]
    assert note["type"] == "Zombie"
    named = f"from worker process {socket.gethostname()} pid {os.getpid()} (app papers)"
    assert named in note["message"] and registry.id in note["message"]


def test_shoal_worker_takes_rescue_after_from_its_flag_or_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SHOAL_RESCUE_AFTER", raising=False)
    assert resolved("worker", "--app", "m:a").rescue_after == 60.0
    monkeypatch.setenv("SHOAL_RESCUE_AFTER", "20")
    assert resolved("worker", "--app", "m:a").rescue_after == 20.0
    assert resolved("worker", "--app", "m:a", "--rescue-after", "2.5").rescue_after == 2.5
    with pytest.raises(SystemExit) as refused:
        parser().parse_args(["worker", "--app", "m:a", "--rescue-after", "0.5"])
    assert refused.value.code == 2
    assert "argument --rescue-after: must be a number of seconds >= 1, got '0.5'" in (
        capsys.readouterr().err
    )
