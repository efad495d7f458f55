"""A worker never starts a handler on a claim it no longer holds.

Workers claim ahead of their runners. When a worker stops giving signs of
life for longer than its items' zombie timeout or its jobs' lease (a paused
process, a database restart that failed its heartbeats), the aggregator or
maintenance hands that work to someone else. What is still in the first
worker's buffer must then not run there: its side effects would happen twice
(issue 34, finding 1: 365 items ran twice after one PostgreSQL restart).

Time is the fake clock's: advancing it without running the heartbeat loop
stands for a process that was frozen for that long.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from shoal import FakeClock, Shoal
from shoal.batch.item import Item
from shoal.batch.states import ItemStatus
from shoal.queue.job import Job
from shoal.queue.worker import Worker

from .batch_helpers import make_batches, sql

ZOMBIE = timedelta(seconds=8)


async def _held(job: Job) -> bool:
    return True


async def test_buffered_items_reaped_while_the_worker_was_frozen_never_run_there(
    fake_boss: Shoal, clock: FakeClock, db_url: str
) -> None:
    ran: list[tuple[str, int]] = []

    async def handler(item: Item) -> Any:
        ran.append((item.ref, item.fence))
        return None

    batches = make_batches(fake_boss, handler, zombie_timeout=ZOMBIE)
    created = await batches.create("test.kind", ["a", "b", "c"])
    frozen = batches.runners["test.kind"]
    buffered = await frozen.claim("batch.test.kind", 10, now=clock.now())
    assert len(buffered) == 3  # claimed: running, fenced, waiting for a runner

    # The worker gives no sign of life past the zombie timeout; the aggregator
    # reaps its items and sends each a new job.
    clock.advance(ZOMBIE + timedelta(seconds=1))
    report = await batches.aggregator.run_once()
    assert (report.reaped_to_pending, report.redispatched) == (3, 3)
    # Another worker claims them under new fences and runs them.
    other = make_batches(fake_boss, handler, zombie_timeout=ZOMBIE).runners["test.kind"]
    again = await other.claim("batch.test.kind", 10, now=clock.now())
    assert len(again) == 3

    # The frozen worker wakes up and its runners take what its buffer holds.
    for job in buffered:
        assert await frozen(Job(job, _held)) == {"skipped": "superseded"}
    assert ran == []
    assert frozen.superseded_skips == 3
    for job in again:
        await other(Job(job, _held))
    assert sorted(ref for ref, _ in ran) == ["a", "b", "c"]  # once each
    assert {fence for _, fence in ran} == {2}
    rows = await sql(db_url, "SELECT count(*) FROM shoal.item WHERE status = 'running'")
    assert rows == [(3,)]  # held by the other worker, results on their way
    del created


async def test_the_heartbeat_drops_what_it_no_longer_holds_before_any_run_asks(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    ran: list[str] = []

    async def handler(item: Item) -> Any:
        ran.append(item.ref)

    batches = make_batches(fake_boss, handler, zombie_timeout=ZOMBIE)
    await batches.create("test.kind", ["a", "b"])
    runner = batches.runners["test.kind"]
    buffered = await runner.claim("batch.test.kind", 10, now=clock.now())
    clock.advance(ZOMBIE + timedelta(seconds=1))
    assert (await batches.aggregator.run_once()).reaped_to_pending == 2
    # The first heartbeat after the freeze learns both are gone.
    assert await runner.heartbeat_once() == 2
    assert await runner.heartbeat_once() == 0  # nothing left to ask about
    for job in buffered:
        assert await runner(Job(job, _held)) == {"skipped": "superseded"}
    assert ran == []


async def test_a_stale_buffered_item_still_held_is_confirmed_and_runs(
    fake_boss: Shoal, clock: FakeClock, db_url: str
) -> None:
    ran: list[str] = []

    async def handler(item: Item) -> Any:
        ran.append(item.ref)

    batches = make_batches(fake_boss, handler, zombie_timeout=ZOMBIE)
    created = await batches.create("test.kind", ["a"])
    runner = batches.runners["test.kind"]
    (job,) = await runner.claim("batch.test.kind", 10, now=clock.now())
    # Past half the zombie timeout without a heartbeat, not yet reaped: the run
    # confirms its fence first, which also refreshes the item's sign of life.
    clock.advance(ZOMBIE / 2 + timedelta(seconds=1))
    await runner(Job(job, _held))
    assert ran == ["a"]
    clock.advance(ZOMBIE / 2 + timedelta(seconds=1))  # 10 s since the claim, 5 since the check
    assert (await batches.aggregator.run_once()).reaped_to_pending == 0
    items = (await batches.items(created.task_id, status=ItemStatus.RUNNING)).items
    assert [i.ref for i in items] == ["a"]
    del db_url


async def test_buffered_jobs_whose_lease_ran_out_never_run_in_the_worker_that_claimed_them(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    lease = timedelta(seconds=10)
    ids = [
        await fake_boss.send("stale", {"n": n}, expire_in=lease, retry_limit=2) for n in range(3)
    ]
    ran: list[tuple[Any, int]] = []
    taken_again: list[int] = []

    async def handler(job: Job) -> None:
        ran.append((job.id, job.attempt))
        if len(ran) == 1:
            # The process freezes past the lease of the jobs it holds;
            # maintenance expires them and another worker claims them.
            clock.advance(lease + timedelta(seconds=1))
            await fake_boss.maintain()
            claimed = await fake_boss.store.claim("stale", 10, now=clock.now())
            taken_again.extend(c.id for c in claimed)

    worker = Worker(
        fake_boss.store,
        "stale",
        handler,
        concurrency=1,
        batch_size=10,
        poll_interval=timedelta(seconds=1),
        clock=clock,
        jitter=fake_boss.jitter,
        notifier=None,
    )
    assert await worker.run_inline() == 3
    # Only the first ran here; the two buffered ones belong to the other worker.
    assert ran == [(ids[0], 1)]
    assert sorted(taken_again) == sorted(
        i for i in ids if i is not None
    )  # the first one's lease ran out too
    assert worker.stats.lost == 3


async def test_a_buffered_job_past_half_its_lease_is_extended_before_it_runs(
    fake_boss: Shoal, clock: FakeClock, db_url: str
) -> None:
    lease = timedelta(seconds=10)
    first = await fake_boss.send("slow", {"n": 0}, expire_in=lease)
    await fake_boss.send("slow", {"n": 1}, expire_in=lease)
    claimed_at = clock.now()
    leases: list[Any] = []

    async def handler(job: Job) -> None:
        if job.id == first:
            clock.advance(timedelta(seconds=6))  # the second waits in the buffer meanwhile
        else:
            leases.extend(
                await sql(db_url, "SELECT lease_expires_at FROM shoal.job WHERE id = %s", job.id)
            )

    worker = Worker(
        fake_boss.store,
        "slow",
        handler,
        concurrency=1,
        batch_size=10,
        poll_interval=timedelta(seconds=1),
        clock=clock,
        jitter=fake_boss.jitter,
        notifier=None,
    )
    assert await worker.run_inline() == 2
    assert worker.stats.completed == 2
    # Its lease was renewed as it started, six seconds after its claim.
    assert leases == [(claimed_at + timedelta(seconds=16),)]
