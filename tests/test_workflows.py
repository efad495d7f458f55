"""Durable workflows in one process: steps checkpointed once, timers, events, cancel and retry.

Time is a FakeClock (in Python and in SQL): a sleep or a wait's timeout ends
when the test moves the clock, never by waiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from shoal import App, FakeClock, InvalidInput, Item, NotFound, Shoal, TaskStatus
from shoal.db.pool import AsyncConn
from shoal.queue.states import JobState
from shoal.workflow import RunStatus, StepFailed, StepKind, StepStatus, Workflow, Workflows
from shoal.workflow.store import StepRecord

from .conftest import wait_for

app = App()
calls: list[tuple[str, Any]] = []


@app.step()
async def add(a: int, b: int) -> int:
    calls.append(("add", (a, b)))
    return a + b


def double(x: int) -> int:  # a plain function: run in a thread
    calls.append(("double", x))
    return 2 * x


@app.workflow("sum")
async def sum_workflow(wf: Workflow, data: dict[str, int]) -> dict[str, int]:
    x = await add(data["a"], data["b"])
    y = await wf.step(double, x)
    return {"total": y}


@app.workflow("nap")
async def nap(wf: Workflow, data: None) -> str:
    before = await add(1, 1)
    await wf.sleep(timedelta(hours=3))
    after = await wf.step(double, before)
    return f"{before}->{after}"


@app.workflow("review")
async def review(wf: Workflow, data: dict[str, Any]) -> Any:
    await add(0, 0)
    verdict = await wf.wait_for(f"review:{data['doc']}", timeout=timedelta(days=7))
    calls.append(("verdict", verdict))
    return verdict


flaky_left: dict[str, int] = {}


async def flaky(name: str) -> str:
    calls.append(("flaky", name))
    if flaky_left.get(name, 0) > 0:
        flaky_left[name] -= 1
        raise RuntimeError(f"{name} is down")
    return f"{name} ok"


@app.workflow("retrying")
async def retrying(wf: Workflow, data: dict[str, Any]) -> str:
    first = await add(2, 3)
    answer = await wf.step(
        flaky, data["name"], retry_limit=data["retries"], retry_delay=timedelta(minutes=5)
    )
    return f"{first} {answer}"


@app.workflow("catches")
async def catches(wf: Workflow, data: None) -> str:
    try:
        await wf.step(flaky, "never", retry_limit=0)
    except StepFailed as failed:
        return f"compensated after {failed.attempts}"
    return "no failure"


async def write_row(conn: AsyncConn, run: str) -> int:
    await conn.execute("INSERT INTO effects (run) VALUES (%s)", (run,))
    return 1


@app.workflow("transactional")
async def transactional(wf: Workflow, data: None) -> int:
    return int(await wf.step(write_row, wf.id, transaction=True))


@app.batch("wf.items", retry_delay=timedelta(0))
async def item_handler(item: Item) -> dict[str, Any]:
    calls.append(("item", item.ref))
    if item.data and item.data.get("hold"):
        await hold.wait()
    return {"ref": item.ref}


hold = asyncio.Event()


@app.workflow("fanout")
async def fanout(wf: Workflow, data: dict[str, Any]) -> dict[str, Any]:
    refs = [
        {"ref": f"doc-{i}", "data": {"hold": data.get("hold", False)}} for i in range(data["n"])
    ]
    task = await wf.batch("wf.items", refs)
    after = await add(task["progress"]["completed"], 0)
    return {"task": task, "after": after}


@app.workflow("parallel")
async def parallel(wf: Workflow, data: None) -> list[Any]:
    results = await wf.gather(wf.step(add, 1, 2), wf.step(double, 10), wf.step(add, 3, 4))
    await wf.sleep(timedelta(minutes=1))
    return results


@app.workflow("parent")
async def parent(wf: Workflow, data: dict[str, Any]) -> dict[str, Any]:
    first = await add(1, 0)
    child = await wf.child(data["child"], data["input"])
    return {"first": first, "child": child}


@pytest.fixture(autouse=True)
def fresh_calls() -> None:
    hold.clear()
    calls.clear()
    flaky_left.clear()


@pytest.fixture
async def workflows(fake_boss: Shoal) -> AsyncIterator[Workflows]:
    api = app.workflows(fake_boss)
    for name in app.workflow_specs:
        api.work(name)
    assert api.batches is not None
    await api.batches.store_kinds()
    items = api.batches.work("wf.items", poll_interval=timedelta(milliseconds=50))
    yield api
    hold.set()
    await items.stop(grace=timedelta(seconds=5))
    await fake_boss.stop_workers(timedelta(seconds=5))


async def settled(api: Workflows, run_id: str, *statuses: RunStatus) -> Any:
    want = set(statuses) or {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED}

    async def done() -> bool:
        return (await api.get(run_id)).status in want

    await wait_for(done)
    return await api.get(run_id)


async def test_each_step_runs_once_and_the_run_records_its_result(workflows: Workflows) -> None:
    started = await workflows.start("sum", {"a": 2, "b": 5})
    view = await settled(workflows, started.id)
    assert view.status is RunStatus.COMPLETED
    assert view.result == {"total": 14}
    assert calls == [("add", (2, 5)), ("double", 7)]
    assert [(s.seq, s.name, s.kind, s.status, s.result) for s in view.steps] == [
        (1, "tests.test_workflows.add", StepKind.STEP, StepStatus.COMPLETED, 7),
        (2, "tests.test_workflows.double", StepKind.STEP, StepStatus.COMPLETED, 14),
    ]


async def test_a_start_is_idempotent_by_the_callers_id(workflows: Workflows) -> None:
    first = await workflows.start("sum", {"a": 1, "b": 1}, id="order-42")
    again = await workflows.start("sum", {"a": 9, "b": 9}, id="order-42")
    assert (first.id, first.created) == ("order-42", True)
    assert (again.id, again.created) == ("order-42", False)
    view = await settled(workflows, "order-42")
    assert view.result == {"total": 4}
    assert calls == [("add", (1, 1)), ("double", 2)]


async def test_a_durable_sleep_holds_no_job_and_the_resumed_run_does_not_redo_steps(
    workflows: Workflows, fake_boss: Shoal, clock: FakeClock
) -> None:
    started = await workflows.start("nap")
    await settled(workflows, started.id, RunStatus.SLEEPING)
    assert calls == [("add", (1, 1))]

    # Nothing runs while it sleeps: the job that put it to sleep ends, and its
    # only job waits for the wake time.
    async def none_active() -> bool:
        return await fake_boss.jobs("workflow.nap", state="active") == []

    await wait_for(none_active)
    assert len(await fake_boss.jobs("workflow.nap", state="created")) == 1
    clock.advance(timedelta(hours=2, minutes=59))
    assert (await workflows.get(started.id)).status is RunStatus.SLEEPING
    clock.advance(timedelta(minutes=1))
    view = await settled(workflows, started.id)
    assert view.result == "2->4"
    assert calls == [("add", (1, 1)), ("double", 2)]
    assert [s.kind for s in view.steps] == [StepKind.STEP, StepKind.SLEEP, StepKind.STEP]
    assert view.steps[1].status is StepStatus.COMPLETED


async def test_an_event_sent_before_the_wait_is_kept_and_delivered_once(
    workflows: Workflows,
) -> None:
    await workflows.signal("review:early", {"approved": True})
    runs = [(await workflows.start("review", {"doc": "early"})).id for _ in range(2)]

    async def one_done_one_waiting() -> bool:
        statuses = sorted([(await workflows.get(r)).status.value for r in runs])
        return statuses == ["completed", "waiting"]

    await wait_for(one_done_one_waiting)
    # The one event went to one run; the other waits for the next.
    views = {(await workflows.get(r)).status: await workflows.get(r) for r in runs}
    assert views[RunStatus.COMPLETED].result == {"approved": True}
    await workflows.signal("review:early", {"approved": False})
    later = await settled(workflows, views[RunStatus.WAITING].id)
    assert later.result == {"approved": False}


async def test_an_event_sent_while_the_run_waits_wakes_it_at_once(
    workflows: Workflows, clock: FakeClock
) -> None:
    started = await workflows.start("review", {"doc": "d7"})
    await settled(workflows, started.id, RunStatus.WAITING)
    await workflows.signal("review:d7", "ship it")
    view = await settled(workflows, started.id)  # the clock never moved
    assert view.result == "ship it"
    assert calls.count(("add", (0, 0))) == 1


async def test_a_wait_returns_none_when_its_timeout_passes_first(
    workflows: Workflows, clock: FakeClock
) -> None:
    started = await workflows.start("review", {"doc": "late"})
    await settled(workflows, started.id, RunStatus.WAITING)
    clock.advance(timedelta(days=7))
    view = await settled(workflows, started.id)
    assert view.status is RunStatus.COMPLETED and view.result is None
    assert view.steps[1].result == {"timed_out": True}
    # An event after the timeout stays for a later wait.
    await workflows.signal("review:late", 1)
    again = await workflows.start("review", {"doc": "late"})
    assert (await settled(workflows, again.id)).result == 1


async def test_an_event_sent_from_sql_wakes_the_run(boss: Shoal, db_url: str) -> None:
    # On real time: shoal.signal() in SQL reads the database's clock.
    api = app.workflows(boss)
    api.work("review")
    started = await api.start("review", {"doc": "sql"})
    await settled(api, started.id, RunStatus.WAITING)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("SELECT shoal.signal('review:sql', '{\"from\": \"sql\"}')")
    assert (await settled(api, started.id)).result == {"from": "sql"}
    await boss.stop_workers(timedelta(seconds=5))


async def test_a_failing_step_is_retried_after_its_delay_without_redoing_earlier_steps(
    workflows: Workflows, clock: FakeClock
) -> None:
    flaky_left["gateway"] = 2
    started = await workflows.start("retrying", {"name": "gateway", "retries": 3})
    view = await settled(workflows, started.id, RunStatus.SLEEPING)
    assert view.steps[1].status is StepStatus.RETRYING and view.steps[1].attempts == 1
    assert "gateway is down" in (view.steps[1].error or "")
    clock.advance(timedelta(minutes=5))
    await wait_for(lambda: calls.count(("flaky", "gateway")) == 2)
    await settled(workflows, started.id, RunStatus.SLEEPING)
    clock.advance(timedelta(minutes=5))
    view = await settled(workflows, started.id)
    assert view.result == "5 gateway ok"
    assert calls.count(("add", (2, 3))) == 1
    assert calls.count(("flaky", "gateway")) == 3
    assert view.steps[1].attempts == 3


async def test_a_step_out_of_attempts_fails_the_run_and_retry_resumes_from_that_step(
    workflows: Workflows,
) -> None:
    flaky_left["billing"] = 1
    started = await workflows.start("retrying", {"name": "billing", "retries": 0})
    view = await settled(workflows, started.id)
    assert view.status is RunStatus.FAILED
    assert "step 2 ('tests.test_workflows.flaky')" in (view.error or "")
    assert "billing is down" in (view.error or "")
    assert view.steps[1].status is StepStatus.FAILED
    assert await workflows.retry(started.id)
    view = await settled(workflows, started.id)
    assert view.status is RunStatus.COMPLETED and view.result == "5 billing ok"
    assert calls.count(("add", (2, 3))) == 1  # the step before the failure kept its checkpoint
    assert not await workflows.retry(started.id)  # completed: nothing to retry


async def test_a_workflow_may_catch_a_failed_step_and_go_on(workflows: Workflows) -> None:
    flaky_left["never"] = 10
    started = await workflows.start("catches")
    view = await settled(workflows, started.id)
    assert view.status is RunStatus.COMPLETED and view.result == "compensated after 1"


async def test_a_transactional_step_commits_its_writes_with_its_checkpoint(
    workflows: Workflows, fake_boss: Shoal
) -> None:
    async with fake_boss.db.connection() as conn:
        await conn.execute("CREATE TABLE effects (run text)")
        await conn.commit()
    started = await workflows.start("transactional")
    assert (await settled(workflows, started.id)).result == 1
    async with fake_boss.db.connection() as conn:
        cur = await conn.execute("SELECT count(*) FROM effects")
        assert (await cur.fetchone()) == (1,)


async def test_a_runner_that_lost_the_run_writes_no_checkpoint(fake_boss: Shoal) -> None:
    api = app.workflows(fake_boss)  # no worker: the test plays two runners by hand
    started = await api.start("sum", {"a": 1, "b": 2})
    stale = await api.store.begin_run(started.id, 1, now=None)
    fresh = await api.store.begin_run(started.id, 2, now=None)
    assert stale is not None and fresh is not None and fresh.epoch == stale.epoch + 1
    step = StepRecord(1, "x", StepKind.STEP, StepStatus.COMPLETED, 1, "1")
    assert not await api.store.record_step(started.id, stale.epoch, step)
    assert await api.store.record_step(started.id, fresh.epoch, step)
    # A completed checkpoint is never overwritten, even by its own runner.
    assert not await api.store.record_step(started.id, fresh.epoch, step)


async def test_concurrent_writes_share_a_statement_and_each_keeps_its_own_fence(
    fake_boss: Shoal,
) -> None:
    # Concurrent runs' checkpoints, begins and starts share statements; each
    # request still gets its own answer, and a repeated key (two begins of
    # one run, two starts of one id) acts as if it came one after the other.
    api = app.workflows(fake_boss)  # no worker: the test plays the runners by hand
    one, two = await api.start("sum", {"a": 1, "b": 2}), await api.start("sum", {"a": 3, "b": 4})
    stale, fresh, other = await asyncio.gather(
        api.store.begin_run(one.id, 1, now=None),
        api.store.begin_run(one.id, 2, now=None),
        api.store.begin_run(two.id, 3, now=None),
    )
    assert stale is not None and fresh is not None and other is not None
    assert fresh.epoch == stale.epoch + 1
    step = StepRecord(1, "x", StepKind.STEP, StepStatus.COMPLETED, 1, "1")
    written = await asyncio.gather(
        api.store.record_step(one.id, stale.epoch, step),
        api.store.record_step(one.id, fresh.epoch, step),
        api.store.record_step(two.id, other.epoch, step),
        api.store.record_step(two.id, other.epoch, step),
    )
    assert list(written) == [False, True, True, False]
    starts = await asyncio.gather(
        *(api.start("sum", {"a": i, "b": 0}, id="same") for i in range(3))
    )
    assert [s.created for s in starts] == [True, False, False]


async def test_start_many_starts_each_run_once_in_one_call(workflows: Workflows) -> None:
    await workflows.start("sum", {"a": 0, "b": 0}, id="many-0")
    inputs = [{"a": i, "b": 1} for i in range(4)]
    started = await workflows.start_many(
        "sum", inputs, ids=["many-0", "many-1", "many-2", "many-1"]
    )
    assert [(s.id, s.created) for s in started] == [
        ("many-0", False),
        ("many-1", True),
        ("many-2", True),
        ("many-1", False),
    ]
    results = [(await settled(workflows, f"many-{i}")).result for i in range(3)]
    assert results == [{"total": 0}, {"total": 4}, {"total": 6}]
    generated = await workflows.start_many("sum", [{"a": 5, "b": 5}, {"a": 6, "b": 6}])
    assert all(s.created for s in generated) and len({s.id for s in generated}) == 2
    assert (await settled(workflows, generated[1].id)).result == {"total": 24}


async def test_start_many_with_a_bad_input_starts_nothing(fake_boss: Shoal) -> None:
    api = app.workflows(fake_boss)
    with pytest.raises(InvalidInput, match=r"inputs\[1\]"):
        await api.start_many("sum", [{"a": 1, "b": 1}, {"bad": object()}], ids=["ok-1", "ok-2"])
    with pytest.raises(InvalidInput, match="ids"):
        await api.start_many("sum", [{"a": 1, "b": 1}], ids=["ok-1", "ok-2"])
    with pytest.raises(InvalidInput, match="inputs"):
        await api.start_many("sum", "not a list")
    with pytest.raises(NotFound):
        await api.get("ok-1")


async def test_a_run_whose_job_failed_for_good_fails_naming_the_job_and_its_error(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    # The database failing under each attempt, played by hand: every attempt
    # of the run's job is claimed and failed until its retries are spent.
    api = app.workflows(fake_boss)
    started = await api.start("sum", {"a": 1, "b": 2})
    state = None
    while state is not JobState.FAILED:
        clock.advance(timedelta(days=1))  # past any retry delay
        (job,) = await fake_boss.fetch("workflow.sum")
        state = await fake_boss.fail(job, ConnectionError("the database went away"))
    assert job.attempt == 13  # 12 retries, then failed for good
    assert (await api.get(started.id)).status is RunStatus.PENDING
    api.work("sum")  # and, with it, the worker of the failed jobs' copies
    view = await settled(api, started.id)
    assert view.status is RunStatus.FAILED
    assert view.error is not None
    assert f"workflow.sum #{job.id}) failed for good after 13 attempt(s)" in view.error
    assert "ConnectionError: the database went away" in view.error
    await fake_boss.stop_workers(timedelta(seconds=5))


async def test_cancel_ends_a_sleeping_run_and_its_wake_job(
    workflows: Workflows, fake_boss: Shoal, clock: FakeClock
) -> None:
    started = await workflows.start("nap")
    await settled(workflows, started.id, RunStatus.SLEEPING)
    assert await workflows.cancel(started.id)
    assert not await workflows.cancel(started.id)
    waiting = await fake_boss.jobs("workflow.nap", state="created")
    assert waiting == []
    clock.advance(timedelta(hours=4))
    view = await workflows.get(started.id)
    assert view.status is RunStatus.CANCELLED
    assert calls == [("add", (1, 1))]


async def test_a_changed_workflow_fails_the_run_naming_the_step(fake_boss: Shoal) -> None:
    changed = App()

    @changed.workflow("nap")
    async def nap_changed(wf: Workflow, data: None) -> str:
        await wf.step(double, 1)  # step 1 was `add` when the run started
        return "never"

    api = app.workflows(fake_boss)
    started = await api.start("nap")
    api.work("nap")
    await settled(api, started.id, RunStatus.SLEEPING)
    await fake_boss.stop_workers(timedelta(seconds=5))
    assert await api.cancel(started.id) and await api.retry(started.id)
    other = changed.workflows(fake_boss)
    other.work("nap")
    view = await settled(other, started.id)
    assert view.status is RunStatus.FAILED
    assert "step 1 was recorded as step 'tests.test_workflows.add'" in (view.error or "")
    assert "'tests.test_workflows.double'" in (view.error or "")
    await fake_boss.stop_workers(timedelta(seconds=5))


async def test_bad_input_is_refused_naming_the_field(fake_boss: Shoal) -> None:
    api = app.workflows(fake_boss)
    with pytest.raises(InvalidInput, match="name: no workflow 'nope'"):
        await api.start("nope")
    with pytest.raises(InvalidInput, match="input: "):
        await api.start("sum", {"a": object()})
    with pytest.raises(InvalidInput, match="key: "):
        await api.signal("")
    with pytest.raises(InvalidInput, match="id: "):
        await api.start("sum", id="")
    with pytest.raises(NotFound):
        await api.get("no-such-run")
    with pytest.raises(InvalidInput, match="retry_limit"):
        app.step(retry_limit=-1)
    with pytest.raises(InvalidInput, match="already declared"):
        app.workflow("sum")(sum_workflow)


async def closed_by_the_aggregator(api: Workflows, run_id: str, *statuses: RunStatus) -> Any:
    """Aggregator passes (a worker process's duty) until the run is in one of ``statuses``."""
    assert api.batches is not None
    batches = api.batches

    async def there() -> bool:
        await batches.aggregator.run_once()
        return (await api.get(run_id)).status in statuses

    await wait_for(there)
    return await api.get(run_id)


async def test_a_fan_out_to_a_batch_task_resumes_the_run_when_the_task_closes(
    workflows: Workflows, fake_boss: Shoal
) -> None:
    started = await workflows.start("fanout", {"n": 5})
    view = await closed_by_the_aggregator(workflows, started.id, RunStatus.COMPLETED)
    task = view.result["task"]
    assert task["outcome"] == "completed"
    assert task["progress"]["completed"] == 5 and view.result["after"] == 5
    assert sorted(ref for kind, ref in calls if kind == "item") == [f"doc-{i}" for i in range(5)]
    assert [s.kind for s in view.steps] == [StepKind.BATCH, StepKind.STEP]
    # The same task on a replay: created once, with the run's key.
    assert workflows.batches is not None
    assert len(await workflows.batches.tasks(kind="wf.items")) == 1


async def test_while_a_fan_out_runs_the_run_holds_no_job_and_cancel_stops_the_task(
    workflows: Workflows, fake_boss: Shoal
) -> None:
    started = await workflows.start("fanout", {"n": 3, "hold": True})
    view = await settled(workflows, started.id, RunStatus.WAITING)

    async def none_active() -> bool:  # the job that started the fan-out has ended
        return await fake_boss.jobs("workflow.fanout", state="active") == []

    await wait_for(none_active)
    await wait_for(lambda: sum(1 for kind, _ in calls if kind == "item") == 3)
    assert workflows.batches is not None
    task_id = view.steps[0].result["task_id"]
    # The cancel and its cascade are one transaction: rolled back, nothing is cancelled.
    async with fake_boss.db.connection() as conn, conn.transaction(force_rollback=True):
        assert await workflows.cancel(started.id, conn=conn)
    assert (await workflows.get(started.id)).status is RunStatus.WAITING
    assert (await workflows.batches.get(task_id)).status is TaskStatus.PROCESSING
    assert await workflows.cancel(started.id)
    await closed_by_the_aggregator(workflows, started.id, RunStatus.CANCELLED)
    task = await workflows.batches.get(task_id)
    assert task.status is TaskStatus.CANCELLED and task.outcome is not None
    assert task.outcome.value == "cancelled"
    assert task.progress.completed == 0  # every held item was stopped, none finished


async def test_a_task_completion_job_retried_takes_again_the_run_it_had_taken(
    workflows: Workflows,
) -> None:
    # A batch task's completion job takes the run waiting for the task; when
    # its attempt fails under the run (the database went away), its retry --
    # the same job -- must find that run again, not leave it running with no
    # job. Played by hand with a job id no worker holds.
    started = await workflows.start("fanout", {"n": 2, "hold": True})
    view = await settled(workflows, started.id, RunStatus.WAITING)
    key = f"shoal.batch:{view.steps[0].result['task_id']}"
    first = await workflows.store.begin_waiting_run(key, 10**9, now=None)
    again = await workflows.store.begin_waiting_run(key, 10**9, now=None)
    assert first is not None and again is not None
    assert (again.id, again.epoch) == (started.id, first.epoch + 1)
    # Another job finds nothing to take: the run is held.
    assert await workflows.store.begin_waiting_run(key, 10**9 + 1, now=None) is None
    assert await workflows.cancel(started.id)


async def test_gathered_steps_run_at_once_and_are_not_run_again_on_resume(
    workflows: Workflows, clock: FakeClock
) -> None:
    started = await workflows.start("parallel")
    await settled(workflows, started.id, RunStatus.SLEEPING)
    clock.advance(timedelta(minutes=1))
    view = await settled(workflows, started.id)
    assert view.result == [3, 20, 7]
    assert sorted(calls, key=str) == sorted(
        [("add", (1, 2)), ("double", 10), ("add", (3, 4))], key=str
    )
    assert [s.name for s in view.steps[:3]] == [
        "tests.test_workflows.add",
        "tests.test_workflows.double",
        "tests.test_workflows.add",
    ]


async def test_a_child_workflow_runs_and_its_result_resumes_the_parent(
    workflows: Workflows,
) -> None:
    started = await workflows.start("parent", {"child": "sum", "input": {"a": 4, "b": 4}})
    view = await settled(workflows, started.id)
    assert view.status is RunStatus.COMPLETED
    assert view.result == {"first": 1, "child": {"total": 16}}
    child = await workflows.get(f"{started.id}/2")
    assert child.status is RunStatus.COMPLETED


async def test_cancelling_a_parent_cancels_the_child_it_waits_for(workflows: Workflows) -> None:
    started = await workflows.start("parent", {"child": "review", "input": {"doc": "c1"}})
    await settled(workflows, started.id, RunStatus.WAITING)
    child_id = f"{started.id}/2"
    await settled(workflows, child_id, RunStatus.WAITING)
    assert await workflows.cancel(started.id)
    assert (await workflows.get(child_id)).status is RunStatus.CANCELLED


async def test_a_failed_child_fails_the_step_in_the_parent(workflows: Workflows) -> None:
    flaky_left["kid"] = 5
    started = await workflows.start(
        "parent", {"child": "retrying", "input": {"name": "kid", "retries": 0}}
    )
    view = await settled(workflows, started.id)
    assert view.status is RunStatus.FAILED
    assert "kid is down" in (view.error or "")
