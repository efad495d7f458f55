"""A run stopped by our own shutdown costs no attempt and is not an error."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from shoal import FakeClock, Shoal
from shoal.batch.states import ItemStatus, TaskOutcome, TaskStatus

from .batch_helpers import make_batches
from .conftest import wait_for
from .interruptapp import app

ROOT = Path(__file__).parent.parent


def start_worker(db_url: str, grace_s: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            *("-m", "shoal.cli", "--database-url", db_url),
            *("worker", "--app", "tests.interruptapp:app", "--grace", str(grace_s)),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def sql(db_url: str, query: str, *args: object) -> list[tuple[object, ...]]:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        try:
            cur = await conn.execute(query, args or None)
        except psycopg.errors.UndefinedTable:
            return []
        return await cur.fetchall() if cur.description else []


@pytest.mark.slow
async def test_sigterm_with_a_short_grace_spends_no_attempt_of_a_running_item_or_job(
    db_url: str,
) -> None:
    boss = await Shoal.connect(db_url)
    batches = app.batches(boss)
    # retry_limit=0 for both: a spent attempt would leave no run at all.
    created = await batches.create("interrupt.batch", ["a"])
    job_id = await boss.send("interrupt.plain", {"n": 1}, retry_limit=0)
    first = start_worker(db_url, grace_s=0.5)
    second: subprocess.Popen[bytes] | None = None
    try:
        # Wall-clock waits: a real process's handlers are running (or have run).
        await wait_for(
            lambda: sql(db_url, "SELECT count(*) FROM handler_run HAVING count(*) = 2"), 30
        )
        first.send_signal(signal.SIGTERM)
        assert first.wait(30) == 0
        ((status, attempts, error, errors),) = await sql(
            db_url, "SELECT status::text, attempt - attempt_base, error, errors FROM shoal.item"
        )
        assert (status, attempts, error) == ("pending", 0, None)
        assert [e["type"] for e in errors] == ["Interrupted"]  # type: ignore[attr-defined]
        ((state, attempt, job_errors),) = await sql(
            db_url, "SELECT state::text, attempt, errors FROM shoal.job WHERE id = %s", job_id
        )
        assert (state, attempt) == ("created", 0)
        # A note of the hand-back names the process; it spent no attempt.
        assert [e["type"] for e in job_errors] == ["Interrupted"]  # type: ignore[attr-defined]
        assert f":{first.pid} without spending" in job_errors[0]["message"]  # type: ignore[index]

        second = start_worker(db_url, grace_s=5)
        await wait_for(
            lambda: sql(
                db_url,
                "SELECT 1 FROM shoal.job WHERE id = %s AND state = 'completed'",
                job_id,
            ),
            30,
        )
        await wait_for(
            lambda: sql(db_url, "SELECT 1 FROM shoal.task WHERE status <> 'processing'"),
            30,
        )
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(15)
    view = await batches.get(created.task_id)
    assert (view.status, view.outcome) == (TaskStatus.COMPLETED, TaskOutcome.COMPLETED)
    (item,) = (await batches.items(created.task_id)).items
    assert (item.status, item.attempts, item.error) == (ItemStatus.COMPLETED, 1, None)
    assert [e["type"] for e in item.errors] == ["Interrupted"]
    runs = await sql(db_url, "SELECT what, attempt FROM handler_run ORDER BY what, pid")
    assert sorted(runs) == [("item", 1), ("item", 1), ("job", 1), ("job", 1)]
    await boss.close()


async def test_items_claimed_but_never_started_are_handed_back_without_spending_an_attempt(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    batches = make_batches(fake_boss, retry_limit=0)
    created = await batches.create("test.kind", ["a", "b"])
    runner = batches.runners["test.kind"]
    assert len(await runner.claim("batch.test.kind", 10, now=clock.now())) == 2
    assert await runner.release_unstarted() == 2  # the worker stopped before running them
    items = (await batches.items(created.task_id)).items
    assert [(i.status, i.attempts, i.error) for i in items] == [(ItemStatus.PENDING, 0, None)] * 2
    # They run again, with their one attempt intact.
    claimed = await runner.claim("batch.test.kind", 10, now=clock.now())
    assert [job.data["item"] for job in claimed] == [i.id for i in items]
    assert all(g is not None and g.run == 1 for g in runner._prepared.values())
