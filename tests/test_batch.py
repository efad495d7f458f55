"""The batch layer: every pattern, anti-pattern row and checklist line of the
scatter-dispatch + polling-aggregation design, against real PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta

import psycopg
import pytest

from shoal import Conflict, FakeClock, InvalidInput, NotFound, PermanentError, Shoal
from shoal.batch.item import Item
from shoal.batch.rows import GuardedItem
from shoal.batch.service import Batches, IdempotencyMismatch
from shoal.batch.states import ItemStatus, TaskOutcome, TaskStatus
from shoal.hooks import Event
from shoal.testing import Probe

from .batch_helpers import make_batches, running, settle, sql
from .conftest import wait_for

# -- creation ------------------------------------------------------------------


async def test_create_writes_task_items_and_one_job_per_item(boss: Shoal, db_url: str) -> None:
    batches = make_batches(boss)
    created = await batches.create("test.kind", ["a", {"ref": "b", "data": {"page": 2}}])
    assert created.created
    view = await batches.get(created.task_id)
    assert (view.status, view.progress.total, view.progress.pending) == (
        TaskStatus.PROCESSING,
        2,
        2,
    )
    jobs = await sql(
        db_url, "SELECT singleton_key, data FROM shoal.job WHERE queue = 'batch.test.kind'"
    )
    keys = sorted(str(k) for k, _ in jobs)
    assert len(keys) == 2 and all(k.startswith("item-") and k.endswith(":0") for k in keys)
    # Jobs carry ids, not documents (and their turn: see tests/test_batch_fairness.py).
    assert all(isinstance(data, dict) and set(data) == {"item", "turn"} for _, data in jobs)


async def test_a_task_bigger_than_one_deadline_is_created_whole(
    boss: Shoal, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shoal.batch import plans

    monkeypatch.setattr(plans, "ITEMS_PER_DEADLINE", 2)  # 5 items: three deadlines
    batches = make_batches(boss)
    assert plans.create_deadline(boss.db.deadline, 5) == 3 * boss.db.deadline
    created = await batches.create("test.kind", ["a", "b", "c", "d", "e"])
    assert [r.ref for r in await batches.export_rows(created.task_id)] == list("abcde")
    assert await sql(db_url, "SELECT count(*) FROM shoal.job") == [(5,)]


async def test_creation_is_one_transaction(boss: Shoal, db_url: str) -> None:
    batches = make_batches(boss)
    await sql(
        db_url,
        "CREATE FUNCTION fail_jobs() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'job table unavailable'; END $$",
    )
    await sql(
        db_url,
        "CREATE TRIGGER no_jobs BEFORE INSERT ON shoal.job "
        "FOR EACH STATEMENT EXECUTE FUNCTION fail_jobs()",
    )
    with pytest.raises(psycopg.Error, match="job table unavailable"):
        await batches.create("test.kind", ["a", "b", "c"])
    # Unlike the reference (task, items and jobs in three steps), nothing is left behind.
    assert await sql(db_url, "SELECT count(*) FROM shoal.task") == [(0,)]
    assert await sql(db_url, "SELECT count(*) FROM shoal.item") == [(0,)]


@pytest.mark.parametrize(
    ("items", "field"),
    [
        ([], "items"),
        (["a", "a"], "items[1].ref"),
        ([""], "items[0].ref"),
        ([{"ref": "a", "data": {"blob": "x" * 9000}}], "items[0].data"),
        ([{"ref": "a", "extra": 1}], "items[0]"),
        ([{"ref": 7}], "items[0].ref"),
        (["nul\x00"], "items[0].ref"),
        ("abc", "items"),
    ],
)
async def test_bad_items_are_rejected_naming_the_entry_and_nothing_is_written(
    boss: Shoal, db_url: str, items: object, field: str
) -> None:
    batches = make_batches(boss)
    with pytest.raises(InvalidInput) as raised:
        await batches.create("test.kind", items)  # type: ignore[arg-type]
    assert raised.value.field == field
    assert await sql(db_url, "SELECT count(*) FROM shoal.task") == [(0,)]


async def test_item_count_cap(boss: Shoal) -> None:
    batches = make_batches(boss)
    batches.max_items = 10
    with pytest.raises(InvalidInput, match="over the cap of 10"):
        await batches.create("test.kind", [str(i) for i in range(11)])


async def test_unknown_kind_is_named(boss: Shoal) -> None:
    with pytest.raises(InvalidInput, match="unknown batch kind 'nope'"):
        await make_batches(boss).create("nope", ["a"])


async def test_idempotent_repeat_returns_the_same_task(boss: Shoal, db_url: str) -> None:
    batches = make_batches(boss)
    first = await batches.create("test.kind", ["a", "b"], idempotency_key="click-1")
    again = await batches.create("test.kind", ["a", "b"], idempotency_key="click-1")
    assert (again.task_id, again.created) == (first.task_id, False)
    assert await sql(db_url, "SELECT count(*) FROM shoal.item") == [(2,)]


async def test_same_key_with_a_different_request_is_refused(boss: Shoal) -> None:
    batches = make_batches(boss)
    await batches.create("test.kind", ["a", "b"], idempotency_key="click-1")
    with pytest.raises(IdempotencyMismatch):
        await batches.create("test.kind", ["a", "c"], idempotency_key="click-1")
    with pytest.raises(IdempotencyMismatch):
        await batches.create("test.kind", ["a", "b"], idempotency_key="click-1", params={"x": 1})


async def test_concurrent_creates_with_one_key_make_one_task(boss: Shoal, db_url: str) -> None:
    batches = make_batches(boss)
    results = await asyncio.gather(
        *(batches.create("test.kind", ["a", "b", "c"], idempotency_key="k") for _ in range(20))
    )
    assert len({r.task_id for r in results}) == 1
    assert sum(r.created for r in results) == 1
    assert await sql(db_url, "SELECT count(*) FROM shoal.task") == [(1,)]
    assert await sql(db_url, "SELECT count(*) FROM shoal.job") == [(3,)]


# -- workers -----------------------------------------------------------------------


async def test_a_task_runs_every_item_and_closes_completed(boss: Shoal) -> None:
    batches = make_batches(boss, concurrency=5)
    created = await batches.create("test.kind", [f"doc-{i}" for i in range(200)])
    async with running(batches):
        await settle(batches, created.task_id)
    view = await batches.get(created.task_id)
    assert (view.status, view.outcome) == (TaskStatus.COMPLETED, TaskOutcome.COMPLETED)
    assert view.progress.as_dict() == {
        "total": 200,
        "pending": 0,
        "running": 0,
        "completed": 200,
        "error": 0,
        "cancelled": 0,
        "percent": 100.0,
    }
    page = await batches.items(created.task_id, limit=3)
    assert [i.result for i in page.items] == [{"ref": "doc-0"}, {"ref": "doc-1"}, {"ref": "doc-2"}]


async def test_workers_never_write_the_task_row(boss: Shoal, db_url: str) -> None:
    batches = make_batches(boss, concurrency=10)
    created = await batches.create("test.kind", [str(i) for i in range(100)])
    (before,) = await sql(db_url, "SELECT xmin::text FROM shoal.task")
    async with running(batches):
        await wait_for(lambda: _completed(batches, created.task_id, 100), timeout_s=30)
    assert (await batches.get(created.task_id)).progress.completed == 100
    (after,) = await sql(db_url, "SELECT xmin::text FROM shoal.task")
    assert before == after, "a worker updated the task row"


async def test_concurrency_bounds_running_items(boss: Shoal) -> None:
    running_now = peak = 0

    full = asyncio.Event()  # the first items hold their slots until all three are taken

    async def slow(item: Item) -> None:
        nonlocal running_now, peak
        running_now += 1
        peak = max(peak, running_now)
        if running_now == 3:
            full.set()
        await full.wait()
        running_now -= 1

    batches = make_batches(boss, slow, concurrency=3)
    created = await batches.create("test.kind", [str(i) for i in range(30)])
    async with running(batches):
        await settle(batches, created.task_id)
    assert peak == 3


async def test_phantom_delivery_is_skipped_without_calling_the_handler(
    boss: Shoal, db_url: str
) -> None:
    calls: list[str] = []

    async def handler(item: Item) -> str:
        calls.append(item.ref)
        return "first result"

    batches = make_batches(boss, handler)
    created = await batches.create("test.kind", ["a"])
    async with running(batches):
        await settle(batches, created.task_id)
        # The queue delivers the same item again (a late retry of a lost ack).
        (item_id,) = (await sql(db_url, "SELECT id FROM shoal.item"))[0]
        await boss.send("batch.test.kind", {"item": item_id})
        await wait_for(lambda: _phantom_skips_are(batches, 1), timeout_s=30)
    assert await batches.phantom_skips() == 1
    assert calls == ["a"]  # the handler (and its LLM bill) ran once
    (item,) = (await batches.items(created.task_id)).items
    assert item.result == "first result"


async def test_transient_error_goes_back_to_pending_then_retries(boss: Shoal, db_url: str) -> None:
    seen: list[tuple[int, str]] = []

    async def flaky(item: Item) -> str:
        (status,) = (
            await sql(db_url, "SELECT status::text FROM shoal.item WHERE id = %s", item.id)
        )[0]
        seen.append((item.attempt, str(status)))
        if item.attempt == 1:
            raise ConnectionError("gateway timeout")
        return "ok"

    batches = make_batches(boss, flaky)
    created = await batches.create("test.kind", ["a"])
    async with running(batches):
        await settle(batches, created.task_id)
    assert seen == [(1, "running"), (2, "running")]  # the retry passed the guard
    (item,) = (await batches.items(created.task_id)).items
    assert (item.status, item.attempts, item.result) == (ItemStatus.COMPLETED, 2, "ok")
    assert [e["type"] for e in item.errors] == ["ConnectionError"]


async def test_permanent_error_marks_error_at_once(boss: Shoal) -> None:
    attempts: list[int] = []

    async def broken(item: Item) -> None:
        attempts.append(item.attempt)
        raise PermanentError("not a PDF")

    batches = make_batches(boss, broken, retry_limit=5)
    created = await batches.create("test.kind", ["a", "b"])
    async with running(batches):
        await settle(batches, created.task_id)
    view = await batches.get(created.task_id)
    assert (view.outcome, view.progress.error) == (TaskOutcome.COMPLETED_WITH_ERRORS, 2)
    assert attempts == [1, 1]
    errors = (await batches.items(created.task_id, status="error")).items
    assert {i.error for i in errors} == {"PermanentError: not a PDF"}


async def test_classifier_and_exception_classes_mark_errors_permanent(boss: Shoal) -> None:
    async def handler(item: Item) -> None:
        raise (KeyError if item.ref == "a" else ValueError)(item.ref)

    batches = make_batches(
        boss,
        handler,
        retry_limit=5,
        permanent=(KeyError,),
        classify=lambda exc: isinstance(exc, ValueError),
    )
    created = await batches.create("test.kind", ["a", "b"])
    async with running(batches):
        await settle(batches, created.task_id)
    items = (await batches.items(created.task_id)).items
    assert [(i.status, i.attempts) for i in items] == [(ItemStatus.ERROR, 1)] * 2


async def test_spent_retries_end_in_error_and_the_task_still_completes(boss: Shoal) -> None:
    async def always(item: Item) -> None:
        raise TimeoutError("LLM timed out")

    batches = make_batches(boss, always, retry_limit=2)
    created = await batches.create("test.kind", ["a", "ok"] if False else ["a"])
    async with running(batches):
        await settle(batches, created.task_id)
    (item,) = (await batches.items(created.task_id)).items
    # The reference left such an item pending forever: a task that never completes.
    assert (item.status, item.attempts) == (ItemStatus.ERROR, 3)
    assert item.error == "TimeoutError: LLM timed out"
    assert (await batches.get(created.task_id)).outcome is TaskOutcome.COMPLETED_WITH_ERRORS


async def test_a_long_item_heartbeats_past_its_zombie_timeout(
    fake_boss: Shoal, clock: FakeClock, db_url: str
) -> None:
    started, finish = asyncio.Event(), asyncio.Event()

    async def long(item: Item) -> str:
        started.set()
        await finish.wait()
        return "done"

    zombie_timeout = timedelta(minutes=2)  # heartbeats every 30 s
    batches = make_batches(fake_boss, long, zombie_timeout=zombie_timeout)
    created = await batches.create("test.kind", ["a"])

    async def heartbeat_at_now() -> bool:
        (at,) = (await sql(db_url, "SELECT updated_at FROM shoal.item"))[0]
        return at == clock.now()

    async with running(batches):
        await asyncio.wait_for(started.wait(), 30)
        for _ in range(10):  # 5 minutes of runs, an aggregator pass after each heartbeat
            clock.advance(zombie_timeout / 4)
            await wait_for(heartbeat_at_now, timeout_s=30)
            report = await batches.aggregator.run_once()
            assert report.reaped_to_pending + report.reaped_to_error == 0
        finish.set()
        await settle(batches, created.task_id)
    (item,) = (await batches.items(created.task_id)).items
    assert (item.status, item.attempts, item.errors) == (ItemStatus.COMPLETED, 1, ())


# -- the aggregator ------------------------------------------------------------------


async def guard_one(batches: Batches, clock_now: datetime | None = None) -> GuardedItem:
    """Stage a running item as a worker's guard leaves it."""
    (item_id,) = [i.id for i in (await batches.items((await batches.tasks())[0].task_id)).items][:1]
    passed = await batches.store.guard_items([item_id], now=clock_now)
    return passed[item_id]


async def test_zombie_is_reaped_by_stale_heartbeat_and_retried(
    fake_boss: Shoal, clock: FakeClock, db_url: str
) -> None:
    batches = make_batches(fake_boss, zombie_timeout=timedelta(minutes=2), retry_limit=1)
    created = await batches.create("test.kind", ["a"])
    first = await guard_one(batches, clock.now())  # a worker took it, then died (OOM)
    clock.advance(timedelta(minutes=1, seconds=59))
    assert (await batches.aggregator.run_once()).reaped_to_pending == 0
    clock.advance(timedelta(seconds=2))
    report = await batches.aggregator.run_once()
    assert (report.reaped_to_pending, report.redispatched) == (1, 1)
    (item,) = (await batches.items(created.task_id)).items
    assert item.status is ItemStatus.PENDING and item.errors[-1]["type"] == "Zombie"
    # The re-dispatched job is not blocked by the dead worker's job.
    jobs = await sql(db_url, "SELECT singleton_key FROM shoal.job ORDER BY id")
    assert [k for (k,) in jobs] == [f"item-{item.id}:0", f"item-{item.id}:1"]
    # The dead worker comes back: its late write loses to the fence.
    assert not await batches.store.complete_items(
        [(item.id, first.fence, "stale")], now=clock.now()
    )
    second = await guard_one(batches, clock.now())
    clock.advance(timedelta(minutes=3))
    report = await batches.aggregator.run_once()
    assert report.reaped_to_error == 1  # no attempts left
    assert (await batches.get(created.task_id)).outcome is TaskOutcome.COMPLETED_WITH_ERRORS
    assert second.fence == first.fence + 1


async def test_reaper_judges_by_last_sign_of_life_not_start_time(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    batches = make_batches(fake_boss, zombie_timeout=timedelta(minutes=2))
    await batches.create("test.kind", ["a"])
    guarded = await guard_one(batches, clock.now())
    for _ in range(10):  # running for 10 minutes, heartbeating every minute
        clock.advance(timedelta(minutes=1))
        assert await batches.store.heartbeat_items([(guarded.id, guarded.fence)], now=clock.now())
        assert (await batches.aggregator.run_once()).reaped_to_pending == 0


async def test_reaper_never_touches_an_item_that_just_finished(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    batches = make_batches(fake_boss, zombie_timeout=timedelta(minutes=2))
    created = await batches.create("test.kind", ["a"])
    guarded = await guard_one(batches, clock.now())
    clock.advance(timedelta(minutes=5))
    # The worker finishes a moment before the aggregator's pass.
    assert await batches.store.complete_items([(guarded.id, guarded.fence, "ok")], now=clock.now())
    report = await batches.aggregator.run_once()
    assert report.reaped_to_pending + report.reaped_to_error == 0
    (item,) = (await batches.items(created.task_id)).items
    assert (item.status, item.result) == (ItemStatus.COMPLETED, "ok")


async def test_racing_aggregators_close_a_task_and_enqueue_its_hook_once(
    boss: Shoal, db_url: str
) -> None:
    async def hook(view) -> None:  # type: ignore[no-untyped-def]
        pass

    batches = make_batches(boss, on_complete=hook)
    created = await batches.create("test.kind", [str(i) for i in range(20)])
    async with running(batches):
        await wait_for(lambda: _completed(batches, created.task_id, 20), timeout_s=30)
    others = [make_batches(boss, on_complete=hook) for _ in range(5)]
    reports = await asyncio.gather(*(b.aggregator.run_once() for b in [batches, *others]))
    assert sum(len(r.closed) for r in reports) == 1
    hooks = await sql(
        db_url, "SELECT data FROM shoal.job WHERE queue = 'batch.test.kind.on_complete'"
    )
    assert hooks == [({"task_id": created.task_id, "outcome": "completed"},)]


async def test_task_stays_open_while_anything_is_pending_or_running(boss: Shoal) -> None:
    batches = make_batches(boss)
    created = await batches.create("test.kind", ["a", "b"])
    assert (await batches.aggregator.run_once()).closed == ()
    await guard_one(batches)
    assert (await batches.aggregator.run_once()).closed == ()
    assert (await batches.get(created.task_id)).status is TaskStatus.PROCESSING


async def test_an_item_left_anywhere_in_a_task_keeps_it_open(boss: Shoal, db_url: str) -> None:
    # The probe for "anything pending or running" reads each range from its
    # high-id end (where a running task's live items are); an item left at
    # the low end, behind finished ones (a retry, say), must still count.
    batches = make_batches(boss)
    created = await batches.create("test.kind", ["a", "b", "c", "d"])
    ids = [row.id for row in await batches.export_rows(created.task_id)]
    await sql(
        db_url,
        "UPDATE shoal.item SET status = 'completed', finished_at = now() WHERE id > %s",
        ids[0],
    )
    left = "SELECT shoal.item_left_v1(%s, %s)"
    assert await sql(db_url, left, created.task_id, []) == [(ids[0],)]
    assert (await batches.aggregator.run_once()).closed == ()
    await sql(db_url, "UPDATE shoal.item SET status = 'running' WHERE id = %s", ids[0])
    assert await sql(db_url, left, created.task_id, []) == [(ids[0],)]
    assert await sql(db_url, left, created.task_id, [ids[0]]) == [(None,)]
    assert (await batches.aggregator.run_once()).closed == ()
    await sql(
        db_url,
        "UPDATE shoal.item SET status = 'completed', attempt = 1, finished_at = now() "
        "WHERE id = %s",
        ids[0],
    )
    (closed,) = (await batches.aggregator.run_once()).closed
    assert closed.id == created.task_id


async def test_progress_of_a_new_task_is_its_total_pending(boss: Shoal, db_url: str) -> None:
    # Progress sums the task's item_tally rows (tests/test_batch_tally.py): a
    # task no statement has changed yet has none, and is all pending.
    batches = make_batches(boss)
    created = await batches.create("test.kind", [str(i) for i in range(50)])
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute(batches.store.sql["progress"], {"task_id": created.task_id})
        assert await cur.fetchall() == [("pending", 50)]


# -- control -------------------------------------------------------------------------


async def test_cancel_stops_pending_items_and_closes_as_cancelled(boss: Shoal) -> None:
    started: list[str] = []

    async def handler(item: Item) -> None:
        started.append(item.ref)

    batches = make_batches(boss, handler)
    probe = Probe(boss)
    created = await batches.create("test.kind", [str(i) for i in range(50)])
    view = await batches.cancel(created.task_id)
    assert view.progress.cancelled == 50
    async with running(batches):
        await settle(batches, created.task_id)
        # The worker, started after the cancel, took all there was and found the queue empty.
        await probe.idle("batch.test.kind")
    assert started == []  # pending items never start
    # Their deliveries were expected, not phantoms: /metrics counts them apart.
    counters = await batches.store.counters()
    assert (counters.get("phantom_skips", 0), counters.get("cancelled_skips", 0)) == (0, 50)
    assert await batches.phantom_skips() == 0
    skipped = [e for e in probe.events if e.name == "item_finished"]
    assert {e["outcome"] for e in skipped} == {"skipped_cancelled"} and len(skipped) == 50
    view = await batches.get(created.task_id)
    assert (view.status, view.outcome) == (TaskStatus.CANCELLED, TaskOutcome.CANCELLED)
    with pytest.raises(Conflict):
        await batches.cancel(created.task_id)


async def test_a_passed_deadline_times_the_task_out(fake_boss: Shoal, clock: FakeClock) -> None:
    batches = make_batches(fake_boss)
    created = await batches.create("test.kind", ["a", "b"], deadline=60)
    clock.advance(timedelta(seconds=59))
    assert (await batches.aggregator.run_once()).timed_out == 0
    clock.advance(timedelta(seconds=1))
    report = await batches.aggregator.run_once()
    assert report.timed_out == 1 and [t.outcome for t in report.closed] == [TaskOutcome.TIMED_OUT]
    view = await batches.get(created.task_id)
    assert (view.status, view.progress.cancelled) == (TaskStatus.CANCELLED, 2)


async def test_retry_failed_reruns_error_items_and_reopens_the_task(boss: Shoal) -> None:
    fixed = False

    async def handler(item: Item) -> str:
        if not fixed and item.ref == "bad":
            raise PermanentError("upstream bug")
        return "ok"

    batches = make_batches(boss, handler)
    created = await batches.create("test.kind", ["good", "bad"])
    async with running(batches):
        await settle(batches, created.task_id)
        assert (await batches.get(created.task_id)).outcome is TaskOutcome.COMPLETED_WITH_ERRORS
        fixed = True
        assert await batches.retry_failed(created.task_id) == 1
        assert (await batches.get(created.task_id)).status is TaskStatus.PROCESSING
        await settle(batches, created.task_id)
    view = await batches.get(created.task_id)
    assert (view.outcome, view.progress.completed) == (TaskOutcome.COMPLETED, 2)
    bad = (await batches.items(created.task_id)).items[1]
    assert bad.attempts == 1 and bad.errors[0]["message"] == "upstream bug"  # history kept


async def test_retry_failed_reopens_a_cancelled_task_and_each_item_ends_once(
    boss: Shoal,
) -> None:
    # Undoing a cancel: the task's cancelled items (pending ones never started,
    # and one stopped while it ran) run again, and each item ends exactly once.
    hold = asyncio.Event()
    runs: list[str] = []
    ended: list[str] = []
    stopped: list[str] = []

    async def handler(item: Item) -> str:
        runs.append(item.ref)
        if item.ref == "slow":
            try:
                await hold.wait()
            except asyncio.CancelledError:
                stopped.append(item.ref)
                raise
        ended.append(item.ref)
        return "ok"

    batches = make_batches(boss, handler, concurrency=1)
    refs = ["slow", *(f"r{i}" for i in range(9))]
    created = await batches.create("test.kind", refs)
    async with running(batches):
        await wait_for(lambda: runs == ["slow"], timeout_s=20)
        view = await batches.cancel(created.task_id)
        assert view.progress.cancelled == 10
        await settle(batches, created.task_id)
        assert (await batches.get(created.task_id)).outcome is TaskOutcome.CANCELLED
        await wait_for(lambda: stopped == ["slow"], timeout_s=20)
        assert ended == []  # the running one was stopped, the others never started

        hold.set()
        assert await batches.retry_failed(created.task_id) == 10
        view = await batches.get(created.task_id)
        assert (view.status, view.outcome, view.progress.cancelled) == (
            TaskStatus.PROCESSING,
            None,
            0,
        )
        await settle(batches, created.task_id)
    view = await batches.get(created.task_id)
    assert (view.status, view.outcome) == (TaskStatus.COMPLETED, TaskOutcome.COMPLETED)
    assert view.progress.completed == 10
    assert sorted(ended) == sorted(refs)  # every item ended once, none twice
    slow = (await batches.items(created.task_id, ref="slow")).items[0]
    assert slow.errors[0]["type"] == "Cancelled"  # its stopped run stays on its history
    assert await batches.retry_failed(created.task_id) == 0  # nothing left to reopen


async def test_retry_failed_refuses_a_timed_out_task(fake_boss: Shoal, clock: FakeClock) -> None:
    batches = make_batches(fake_boss)
    created = await batches.create("test.kind", ["a"], deadline=60)
    clock.advance(timedelta(seconds=60))
    await batches.aggregator.run_once()
    with pytest.raises(Conflict, match="deadline"):
        await batches.retry_failed(created.task_id)
    view = await batches.get(created.task_id)
    assert (view.status, view.progress.cancelled) == (TaskStatus.CANCELLED, 1)


async def test_items_page_by_status_with_a_cursor(boss: Shoal) -> None:
    batches = make_batches(boss)
    created = await batches.create("test.kind", [f"{i:03}" for i in range(25)])
    refs: list[str] = []
    cursor = None
    while True:
        page = await batches.items(created.task_id, status="pending", cursor=cursor, limit=10)
        refs += [i.ref for i in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert refs == [f"{i:03}" for i in range(25)]
    assert (await batches.items(created.task_id, status="error")).items == ()
    with pytest.raises(InvalidInput, match="status"):
        await batches.items(created.task_id, status="done")


async def test_unknown_task_is_not_found(boss: Shoal) -> None:
    batches = make_batches(boss)
    for task_id in ("not-a-uuid", "00000000-0000-0000-0000-000000000000"):
        with pytest.raises(NotFound):
            await batches.get(task_id)


async def test_expire_in_is_an_execution_timeout_not_a_queue_wait(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    async def handler(item: Item) -> str:
        return "ran"

    batches = make_batches(fake_boss, handler, expire_in=timedelta(seconds=30))
    created = await batches.create("test.kind", [str(i) for i in range(5)])
    clock.advance(timedelta(seconds=60))  # the jobs wait in the queue twice as long as expire_in
    await fake_boss.maintain()
    async with running(batches):
        await settle(batches, created.task_id)
    assert (await batches.get(created.task_id)).progress.completed == 5


async def test_export_rows_cover_every_item(boss: Shoal) -> None:
    batches = make_batches(boss)
    created = await batches.create("test.kind", [str(i) for i in range(1500)])
    rows = await batches.export_rows(created.task_id)
    assert [r.ref for r in rows] == [str(i) for i in range(1500)]
    assert json.dumps([r.ref for r in rows[:2]]) == '["0", "1"]'


def test_state_diagrams_in_docs_match_the_transitions() -> None:
    import re
    from pathlib import Path

    from shoal.batch.states import ITEM_TRANSITIONS, TASK_TRANSITIONS

    text = (Path(__file__).parent.parent / "docs" / "batch.md").read_text()
    blocks = re.findall(r'state "(\w+)" as \w+ \{(.*?)\}', text, re.DOTALL)
    drawn = {name: set(re.findall(r"(\w+) --> (\w+)", body)) for name, body in blocks}
    assert drawn["item"] == {(a.value, b.value) for a, bs in ITEM_TRANSITIONS.items() for b in bs}
    assert drawn["task"] == {(a.value, b.value) for a, bs in TASK_TRANSITIONS.items() for b in bs}


async def test_completion_is_noticed_when_the_last_item_finishes_not_at_a_tick(
    fake_boss: Shoal,
) -> None:
    from shoal import App

    app = App()

    @app.batch("test.latency", concurrency=10)
    async def handler(item: Item) -> None:
        pass

    probe = Probe(fake_boss)
    stop = asyncio.Event()
    # The fake clock never moves: no cron tick after the first can run an
    # aggregator pass, so only the workers' wake-up can close the task.
    runner = asyncio.create_task(app.run(fake_boss, stop=stop, maintenance=False))
    try:
        batches = app.batches(fake_boss)
        created = await batches.create("test.latency", [str(i) for i in range(300)])

        def closes_it(event: Event) -> bool:
            return any(t.id == created.task_id for t in event["report"].closed)

        await probe.aggregator_pass(closes_it)
        view = await batches.get(created.task_id)
        assert (view.status, view.progress.completed) == (TaskStatus.COMPLETED, 300)
        row = await batches.store.get_task(created.task_id)
        assert row is not None and row.completed_at and row.last_item_at
        assert row.completed_at >= row.last_item_at
    finally:
        stop.set()
        await runner


async def _completed(batches, task_id: str, count: int) -> bool:  # type: ignore[no-untyped-def]
    return bool((await batches.get(task_id)).progress.completed == count)


async def _phantom_skips_are(batches, count: int) -> bool:  # type: ignore[no-untyped-def]
    return bool(await batches.phantom_skips() == count)
