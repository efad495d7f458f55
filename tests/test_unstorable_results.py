"""A result that cannot be stored fails its run at once, saying what and where.

Before, a handler returning ``{"at": datetime.now()}`` left its job ``active``:
the statement recording a whole batch of outcomes failed, every job in it
waited out ``expire_in`` (15 minutes by default), and the only trace was a
log line that never named the handler. ``shoal.testing.run_job`` called the
same handler ``completed``.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shoal import Shoal
from shoal.batch.item import Item
from shoal.batch.kinds import BatchKind
from shoal.errors import InvalidInput, UnstorableResult
from shoal.queue.job import Job
from shoal.queue.results import encode_result
from shoal.testing import run_item, run_job

from .batch_helpers import make_batches, running, settle
from .conftest import wait_for


async def export(job: Job) -> Any:
    if job.data["bad"]:
        return {"at": datetime(2026, 12, 6, tzinfo=UTC), "rows": 3}
    return {"rows": 3}


async def test_a_job_whose_result_cannot_be_stored_fails_that_run_at_once_naming_it(
    boss: Shoal,
) -> None:
    bad = await boss.send("reports", {"bad": True}, retry_limit=1, retry_delay=0)
    good = [await boss.send("reports", {"bad": False}) for _ in range(3)]
    assert bad is not None
    worker = boss.work("reports", export, concurrency=4)
    try:

        async def settled() -> bool:
            states = [(await boss.get_job(j)).state for j in [bad, *good] if j is not None]
            return states == ["failed", "completed", "completed", "completed"]

        # Both attempts fail as they end, not when a lease runs out (15 minutes).
        await wait_for(settled, timeout_s=30)
    finally:
        await worker.stop()
    job = await boss.get_job(bad)
    assert job.attempt == 2
    message = job.errors[-1].message
    assert job.errors[-1].type == "UnstorableResult"
    assert "handler tests.test_unstorable_results.export" in message
    assert "of queue 'reports'" in message
    assert 'result["at"]: datetime is not JSON serializable' in message
    # The good jobs in the same batches of outcomes kept their outputs.
    for job_id in good:
        assert job_id is not None
        assert (await boss.get_job(job_id)).output == {"rows": 3}


async def test_an_item_whose_result_cannot_be_stored_ends_in_error_and_the_task_closes(
    boss: Shoal,
) -> None:
    async def extract(item: Item) -> Any:
        if item.ref == "bad":
            return {"values": [1.0, math.nan]}
        return {"ok": item.ref}

    batches = make_batches(boss, extract, retry_limit=0)
    created = await batches.create("test.kind", ["a", "bad", "b"])
    async with running(batches):
        await settle(batches, created.task_id)
    view = await batches.get(created.task_id)
    assert (view.progress.completed, view.progress.error) == (2, 1)
    (failed,) = (await batches.items(created.task_id, status="error")).items
    assert failed.ref == "bad"
    assert failed.error is not None
    assert "of batch kind 'test.kind'" in failed.error
    assert 'result["values"][1]: float nan is not allowed in JSON' in failed.error


async def test_the_testing_kit_fails_the_same_runs_a_worker_fails() -> None:
    run = await run_job(export, {"bad": True}, queue="reports", retry_limit=1)
    assert run.outcome == "retried"
    assert isinstance(run.error, UnstorableResult)
    assert 'result["at"]: datetime is not JSON serializable' in str(run.error)
    assert (await run_job(export, {"bad": False}, queue="reports")).outcome == "completed"

    async def returns_a_set(item: Item) -> Any:
        return {"tags": {"a"}}

    kind = BatchKind(name="kit.kind", handler=returns_a_set, retry_limit=0)
    item_run = await run_item(kind, {"doc": 1})
    assert item_run.outcome == "error"
    assert 'result["tags"]: set is not JSON serializable' in str(item_run.error)


async def test_completing_a_job_by_hand_with_an_unstorable_output_is_bad_input(
    boss: Shoal,
) -> None:
    job_id = await boss.send("manual", {})
    assert job_id is not None
    (claimed,) = await boss.store.claim("manual", 1, now=None)
    with pytest.raises(InvalidInput) as refused:
        await boss.complete(job_id, {"when": datetime(2026, 12, 6, tzinfo=UTC)})
    assert refused.value.field == "output"
    assert (await boss.get_job(job_id)).state == "active"  # nothing written
    assert await boss.complete(job_id, {"when": "2026-12-06"})
    del claimed


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (
            {"at": datetime(2026, 1, 1, tzinfo=UTC)},
            'result["at"]: datetime is not JSON serializable',
        ),
        ([1, [2, {3}]], "result[1][1]: set is not JSON serializable"),
        ({"x": math.inf}, 'result["x"]: float inf is not allowed in JSON'),
        ({"t": "a\x00b"}, 'result["t"]: str holds a NUL character'),
        ({"t": "\ud800"}, 'result["t"]: str holds a lone surrogate'),
        ({(1, 2): 3}, "result: key (1, 2) (tuple) is not a JSON object key"),
        (timedelta(seconds=1), "result: timedelta is not JSON serializable"),
    ],
)
def test_the_error_names_the_path_and_type_of_the_first_bad_value(value: Any, said: str) -> None:
    with pytest.raises(UnstorableResult) as refused:
        encode_result(value)
    assert said in str(refused.value)


def test_a_value_that_refers_to_itself_is_named_not_recursed_forever() -> None:
    loop: dict[str, Any] = {"a": [1]}
    loop["a"].append(loop)
    with pytest.raises(UnstorableResult, match=r'result\["a"\]\[1\]: refers to itself'):
        encode_result(loop)


def test_storable_values_are_the_json_they_were() -> None:
    assert encode_result(None) is None
    assert encode_result({"a": [1, 2.5, "é", None, True]}) == '{"a":[1,2.5,"é",null,true]}'
    assert encode_result({"escaped": "\\u0000"}) == '{"escaped":"\\\\u0000"}'
