"""Tasks of one kind are served round-robin, and a retry never waits behind queued tasks."""

from __future__ import annotations

from datetime import timedelta

from shoal import FakeClock, Shoal
from shoal.batch.item import Item
from shoal.batch.states import TaskId
from shoal.queue.job import Job

from .batch_helpers import make_batches

CLAIM = 100  # items per claim in these tests (a worker takes up to 1,000)


async def item_ids(batches: object, task_id: TaskId) -> set[int]:
    ids: set[int] = set()
    for row in await batches.export_rows(task_id):  # type: ignore[attr-defined]
        ids.add(row.id)
    return ids


async def test_a_small_task_is_claimed_within_the_first_claims_of_a_big_one(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    batches = make_batches(fake_boss)
    runner = batches.runners["test.kind"]
    big = await batches.create("test.kind", [f"big-{i}" for i in range(2000)])
    # The big task is under way when the small one arrives.
    first = await runner.claim("batch.test.kind", CLAIM, now=clock.now())
    assert len(first) == CLAIM
    small = await batches.create("test.kind", [f"small-{i}" for i in range(5)])
    small_ids = await item_ids(batches, small.task_id)
    second = await runner.claim("batch.test.kind", CLAIM, now=clock.now())
    claimed = [job.data["item"] for job in second]
    # All five in the very next claim, taken in turns with the big task's items.
    assert small_ids <= set(claimed)
    assert len(claimed) == CLAIM
    assert [i for i in claimed if i in small_ids] == sorted(small_ids)
    assert max(claimed.index(i) for i in small_ids) <= 2 * len(small_ids) + 1
    big_ids = await item_ids(batches, big.task_id)
    # The big task keeps its own order and loses no place beyond those turns.
    assert [i for i in claimed if i in big_ids] == sorted(i for i in claimed if i in big_ids)
    assert len([i for i in claimed if i in big_ids]) == CLAIM - 5


async def test_big_tasks_of_one_kind_take_turns(fake_boss: Shoal, clock: FakeClock) -> None:
    batches = make_batches(fake_boss)
    runner = batches.runners["test.kind"]
    first = await batches.create("test.kind", [f"a-{i}" for i in range(300)])
    second = await batches.create("test.kind", [f"b-{i}" for i in range(300)])
    a_ids = await item_ids(batches, first.task_id)
    claimed = [
        job.data["item"] for job in await runner.claim("batch.test.kind", CLAIM, now=clock.now())
    ]
    # Round-robin: half of each, not the first task's items alone.
    assert len([i for i in claimed if i in a_ids]) == CLAIM // 2
    del second


async def test_a_retry_is_claimed_first_once_its_backoff_is_over(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    async def flaky(item: Item) -> None:
        if item.ref == "old" and item.attempt == 1:
            raise RuntimeError("flaky")

    batches = make_batches(fake_boss, flaky, retry_delay=timedelta(seconds=4), retry_backoff=False)
    runner = batches.runners["test.kind"]
    await batches.create("test.kind", ["old"])
    (job,) = await runner.claim("batch.test.kind", CLAIM, now=clock.now())
    old_id = job.data["item"]
    # Meanwhile a newer task of the same kind fills the queue.
    await batches.create("test.kind", [f"new-{i}" for i in range(500)])
    # Then the old item's run fails: back to pending, with a new job due in 4 s.
    assert (await runner(Job(job, _held)))["item"] == "retry"
    clock.advance(timedelta(seconds=3))
    early = await runner.claim("batch.test.kind", CLAIM, now=clock.now())
    assert old_id not in [j.data["item"] for j in early]  # still backing off
    clock.advance(timedelta(seconds=1))
    # The next claim after its backoff takes it first, whatever the queue holds.
    (first, *_) = await runner.claim("batch.test.kind", CLAIM, now=clock.now())
    assert first.data["item"] == old_id


async def _held(job: Job) -> bool:
    return True
