"""Partitioned batch kinds: a kind's limits counted per key of its items.

A kind's ``partition_by`` (a field of the item's data, or a function of it)
keys each item when its task is created; an item may name its own key
(``{"ref", "data", "partition_key"}``). The key is kept on the item's row and
carried by every job of the item (the first, a retry, a re-send after a reap
or a retry-failed), so the queue's limited claim counts the kind's limits per
key, as it does a partitioned queue's (docs/limits.md, "Batch kinds").
"""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta
from typing import Any, cast

import psycopg
import pytest
from psycopg.types.json import Jsonb

from shoal import (
    App,
    Batches,
    FakeClock,
    IdempotencyMismatch,
    InvalidInput,
    PermanentError,
    Rate,
    RetryAfter,
    Shoal,
    Snooze,
    SyncBatches,
    SyncClient,
)
from shoal.batch.inputs import parse_items, request_hash
from shoal.batch.item import Item
from shoal.batch.kinds import BatchKind
from shoal.testing import Probe

from .batch_helpers import make_batches, noop, running, settle, sql
from .conftest import wait_for

KIND = "test.kind"
QUEUE = "batch.test.kind"


async def item_keys(db_url: str) -> dict[str, str | None]:
    """Each item's partition key, by ref."""
    found = await sql(db_url, "SELECT ref, partition_key FROM shoal.item ORDER BY ref")
    return {str(ref): None if key is None else str(key) for ref, key in found}


async def job_keys(db_url: str) -> list[tuple[str, str | None]]:
    """(ref, partition key) of every job of the kind's queue, of every state, by job id."""
    found = await sql(
        db_url,
        "SELECT i.ref, j.partition_key FROM shoal.job j"
        " JOIN shoal.item i ON i.id = (j.data->>'item')::bigint"
        " WHERE j.queue = %s ORDER BY j.id",
        QUEUE,
    )
    return [(str(ref), None if key is None else str(key)) for ref, key in found]


class Overlap:
    """Items running now and at most at once, per key: counted by the handlers themselves.

    Each run counts itself in when it starts and out when it ends, under the
    key its ref names (``<key>-<n>``), and waits for ``release`` in between.
    """

    def __init__(self) -> None:
        self.running: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.most_at_once = 0
        self.runs: Counter[str] = Counter()
        self.release = asyncio.Event()

    async def __call__(self, item: Item) -> None:
        key = item.ref.split("-")[0]
        self.running[key] += 1
        self.runs[key] += 1
        self.peak[key] = max(self.peak[key], self.running[key])
        self.most_at_once = max(self.most_at_once, sum(self.running.values()))
        try:
            await self.release.wait()
        finally:
            self.running[key] -= 1

    def now(self) -> int:
        return sum(self.running.values())


def by_account(n: int, account: str, **extra: Any) -> dict[str, Any]:
    return {"ref": f"{account}-{n}", "data": {"account": account}, **extra}


async def test_a_partitioned_kinds_global_concurrency_holds_each_key_across_two_workers(
    boss: Shoal, observer: Shoal, db_url: str
) -> None:
    overlap = Overlap()
    options: dict[str, Any] = {
        "concurrency": 5,
        "global_concurrency": 1,
        "partition_by": "account",
    }
    one, two = make_batches(boss, overlap, **options), make_batches(observer, overlap, **options)
    items = [by_account(n, account) for account in ("a", "b") for n in range(3)]
    # An item naming its own key runs in that partition, whatever its data says.
    items.append(by_account(0, "a", ref="c-0", partition_key="c"))
    created = await one.create(KIND, items)
    assert await item_keys(db_url) == {i["ref"]: i["ref"].split("-")[0] for i in items}
    async with running(one), running(two):
        # One item of each key runs, in whichever of the two workers: three
        # at once, never two of one key.
        await wait_for(lambda: overlap.now() == 3)
        assert overlap.running == Counter({"a": 1, "b": 1, "c": 1})
        # Every partition is full: nobody may start another of the kind's items.
        assert await observer.fetch(QUEUE, 10) == []
        overlap.release.set()
        await settle(one, created.task_id)
    assert overlap.peak == Counter({"a": 1, "b": 1, "c": 1})
    assert overlap.most_at_once == 3
    assert overlap.runs == Counter({"a": 3, "b": 3, "c": 1})
    assert sorted(set(await job_keys(db_url))) == sorted(
        (ref, ref.split("-")[0]) for ref in await item_keys(db_url)
    )


async def test_a_partitioned_kinds_rate_limit_is_a_bucket_per_key(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    started: list[str] = []

    async def handler(item: Item) -> None:
        started.append(item.ref)

    batches = make_batches(
        fake_boss, handler, rate_limit=Rate(1, per=timedelta(minutes=1)), partition_by="account"
    )
    probe = Probe(fake_boss)
    async with running(batches):
        await batches.create(KIND, [by_account(n, a) for a in ("a", "b") for n in range(2)])
        # Each key's full bucket starts one item; then neither has a token.
        await probe.job_finished(QUEUE, count=2)
        await probe.idle(QUEUE)
        assert sorted(ref.split("-")[0] for ref in started) == ["a", "b"]
        probe.discard()
        clock.advance(timedelta(minutes=1))  # one token in each bucket
        await probe.job_finished(QUEUE, count=2)
        await probe.idle(QUEUE)
        assert sorted(started) == ["a-0", "a-1", "b-0", "b-1"]
    states = {s.partition_key: s for s in await fake_boss.limits(QUEUE)}
    assert set(states) == {"a", "b"}
    assert all(s.partition_by == "account" and s.waiting == 0 for s in states.values())


async def test_a_reaped_and_rescued_item_keeps_its_partition_key(
    fake_boss: Shoal, clock: FakeClock, db_url: str
) -> None:
    runs: list[str] = []

    async def handler(item: Item) -> None:
        runs.append(item.ref)

    batches = make_batches(
        fake_boss,
        handler,
        global_concurrency=1,
        partition_by="account",
        expire_in=timedelta(minutes=1),
        zombie_timeout=timedelta(seconds=30),
    )
    kind = batches.kind(KIND)
    # The limits its workers declare when they start (none runs yet).
    await fake_boss.limit_store.declare_limits(QUEUE, kind.limits, now=clock.sql_now())
    items = [
        by_account(0, "a"),
        by_account(0, "b"),
        by_account(0, "x", ref="c-0", partition_key="c"),
    ]
    created = await batches.create(KIND, items)
    # A worker claims one job of each key, starts the runs (the guard), and dies.
    dead = await fake_boss.fetch(QUEUE, 10)
    assert len(dead) == 3
    guarded = await batches.store.guard_items([j.data["item"] for j in dead], now=clock.sql_now())
    assert len(guarded) == 3
    clock.advance(timedelta(minutes=2))
    # The aggregator reaps the items and sends each a new job; the dead jobs'
    # leases expire and maintenance puts them back to wait. Both kinds of job
    # carry their item's key, not the partition '' of a job without one.
    assert (await batches.aggregator.run_once()).reaped_to_pending == 3
    assert (await fake_boss.maintain()).retried == 3
    keys = await job_keys(db_url)
    assert sorted(keys) == sorted([("a-0", "a"), ("b-0", "b"), ("c-0", "c")] * 2)
    clock.advance(timedelta(seconds=10))  # past the dead jobs' retry backoff
    probe = Probe(fake_boss)
    async with running(batches):
        await probe.job_finished(QUEUE, count=6)  # each item once, and its dead job a phantom
        await probe.idle(QUEUE)
    await settle(batches, created.task_id)
    assert sorted(runs) == ["a-0", "b-0", "c-0"]
    assert await batches.phantom_skips() == 3


async def test_an_item_retried_or_reopened_keeps_its_partition_key(
    boss: Shoal, db_url: str
) -> None:
    calls: Counter[str] = Counter()
    fixed = False

    async def handler(item: Item) -> None:
        calls[item.ref] += 1
        if item.ref == "a-0" and calls[item.ref] == 1:
            raise ConnectionError("model endpoint reset")  # retried by the queue
        if item.ref == "b-0" and not fixed:
            raise PermanentError("bad document")

    batches = make_batches(boss, handler, global_concurrency=1, partition_by="account")
    created = await batches.create(KIND, [by_account(0, "a"), by_account(0, "b")])
    async with running(batches):
        await settle(batches, created.task_id)
        fixed = True
        # retry-failed sends the item in error a new job: keyed as its first.
        assert await batches.retry_failed(created.task_id) == 1
        await settle(batches, created.task_id)
    assert calls == Counter({"a-0": 2, "b-0": 2})
    assert (await batches.get(created.task_id)).progress.completed == 2
    assert await job_keys(db_url) == [("a-0", "a"), ("b-0", "b"), ("b-0", "b")]


def by_model(data: dict[str, str]) -> str:
    return data["model"].lower()


async def test_a_kind_partitioned_by_a_function_keys_items_where_its_code_is(
    boss: Shoal, observer: Shoal, db_url: str
) -> None:
    overlap = Overlap()
    batches = make_batches(boss, overlap, global_concurrency=1, partition_by=by_model)
    await batches.store_kinds()
    items: list[dict[str, Any]] = [
        {"ref": "gpt-0", "data": {"model": "GPT"}},
        {"ref": "gpt-1", "data": {"model": "gpt"}},
        {"ref": "claude-0", "data": {"model": "Claude"}},
        {"ref": "bulk-0", "data": {"model": "gpt"}, "partition_key": "bulk"},
    ]
    created = await batches.create(KIND, items)
    assert await item_keys(db_url) == {i["ref"]: i["ref"].split("-")[0] for i in items}
    async with running(batches):
        await wait_for(lambda: overlap.now() == 3)
        assert overlap.running == Counter({"gpt": 1, "claude": 1, "bulk": 1})
        overlap.release.set()
        await settle(batches, created.task_id)
    assert overlap.peak == Counter({"gpt": 1, "claude": 1, "bulk": 1})
    (function,) = {s.partition_by for s in await boss.limits(QUEUE)}
    assert function == f"function {by_model.__qualname__}"

    # Where the function is not (a client without the kind's code, SQL), an
    # item must name its key: nothing is keyed '' behind the caller's back.
    elsewhere = Batches(observer, {})
    with pytest.raises(InvalidInput) as refused:
        await elsewhere.create(KIND, [{"ref": "x", "partition_key": "gpt"}, "y"])
    assert refused.value.field == "items[1].partition_key"
    assert f"partitioned by function {by_model.__qualname__}" in str(refused.value)
    with psycopg.connect(db_url) as conn, pytest.raises(psycopg.errors.InvalidParameterValue) as sq:
        conn.execute("SELECT shoal.create_task(%s, %s)", (KIND, Jsonb(["x"])))
    assert sq.value.diag.message_primary == str(refused.value).replace("[1]", "[0]")
    named = await elsewhere.create(KIND, [{"ref": "named", "partition_key": "gpt"}])
    with psycopg.connect(db_url) as conn:
        conn.execute(
            "SELECT shoal.create_task(%s, %s)",
            (KIND, Jsonb([{"ref": "from-sql", "partition_key": 7}])),
        )
    keys = await item_keys(db_url)
    assert (keys["named"], keys["from-sql"]) == ("gpt", "7")
    assert named.created

    # A function that fails, or gives no usable key, is the item's bad input.
    with pytest.raises(InvalidInput) as refused:
        await batches.create(KIND, [{"ref": "ok", "data": {"model": "a"}}, {"ref": "no-model"}])
    assert refused.value.field == "items[1].data"
    assert "partition_by function of batch kind 'test.kind' failed" in str(refused.value)
    floats = make_batches(boss, noop, partition_by=lambda data: 1.5)
    with pytest.raises(InvalidInput) as refused:
        await floats.create(KIND, ["a"])
    assert refused.value.field == "items[0].partition_key"


async def test_tasks_created_from_sync_code_and_sql_are_keyed_by_the_kinds_field(
    boss: Shoal, db_url: str
) -> None:
    batches = make_batches(boss, noop, global_concurrency=2, partition_by="account")
    await batches.store_kinds()  # a worker's start: creators without the code read it
    with SyncClient.connect(db_url, max_size=1) as client:
        SyncBatches(client).create(
            KIND,
            [
                {"ref": "int", "data": {"account": 7}},
                {"ref": "str", "data": {"account": "7"}},
                {"ref": "none", "data": {"other": 1}},
                "bare",
                {"ref": "own", "data": {"account": 7}, "partition_key": "mine"},
            ],
        )
    with psycopg.connect(db_url) as conn:
        conn.execute(
            "SELECT shoal.create_task(%s, %s)",
            (
                KIND,
                Jsonb(
                    [
                        {"ref": "sql-int", "data": {"account": 7}},
                        {"ref": "sql-bare"},
                        {"ref": "sql-own", "data": {"account": 7}, "partition_key": 8},
                    ]
                ),
            ),
        )
    assert await item_keys(db_url) == {
        "int": "7",
        "str": "7",
        "none": "",
        "bare": "",
        "own": "mine",
        "sql-int": "7",
        "sql-bare": "",
        "sql-own": "8",
    }
    # Created before any worker declared the kind's limits, the jobs carry
    # their items' keys already: the declaration's stamp leaves them be.
    async with running(batches):
        await wait_for(lambda: boss.limits(QUEUE))
    assert sorted(await job_keys(db_url)) == sorted((await item_keys(db_url)).items())


async def test_an_items_partition_key_is_part_of_its_requests_fingerprint(
    boss: Shoal, db_url: str
) -> None:
    batches = make_batches(boss, noop, partition_by="account")
    first = await batches.create(KIND, [{"ref": "a", "partition_key": "k"}], idempotency_key="1")
    again = await batches.create(KIND, [{"ref": "a", "partition_key": "k"}], idempotency_key="1")
    assert (first.created, again.created, again.task_id) == (True, False, first.task_id)
    with pytest.raises(IdempotencyMismatch):
        await batches.create(KIND, [{"ref": "a", "partition_key": "j"}], idempotency_key="1")
    # A request that names no key has the fingerprint it had before items
    # could name one (an idempotent retry across the upgrade finds its task):
    # the digest of 944515e's request_hash.
    plain = parse_items(["a", {"ref": "b", "data": {"x": 1}}], max_items=9, max_payload_bytes=99)
    assert request_hash(KIND, plain, "null", None) == PLAIN_HASH


# request_hash("test.kind", ["a", {"ref": "b", "data": {"x": 1}}], "null", None) at 944515e.
PLAIN_HASH = "073b007f19d2aaac225020396f4b1050244c1171d29e59c9aa753ac22b8663ca"


def test_partition_by_on_a_kind_is_checked_where_it_is_declared() -> None:
    with pytest.raises(InvalidInput) as refused:
        BatchKind("extract", noop, partition_by=3)  # type: ignore[arg-type]
    assert refused.value.field == "partition_by"
    assert "batch kind 'extract'" in str(refused.value)
    app = App()
    with pytest.raises(InvalidInput) as refused:
        app.batch("extract", partition_by="")
    assert refused.value.field == "partition_by"
    assert app.kinds == {}
    app.batch("extract", global_concurrency=1, partition_by="account")(noop)
    app.batch("by_model", rate_limit=Rate(5), partition_by=by_model)(noop)
    assert app.kinds["extract"].settings.partition_field == "account"
    assert app.kinds["by_model"].settings.partition_function == (
        f"function {by_model.__qualname__}"
    )


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (True, "a partition key must be a string or an integer, got bool"),
        (1.5, "a partition key must be a string or an integer, got float"),
        (["a"], "a partition key must be a string or an integer, got list"),
        ("k" * 513, "must be at most 512 characters, without NUL"),
    ],
)
def test_an_items_bad_partition_key_is_refused_naming_the_item(key: object, message: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_items(["a", {"ref": "b", "partition_key": key}], max_items=9, max_payload_bytes=99)
    assert (refused.value.field, refused.value.message) == ("items[1].partition_key", message)


async def test_a_kinds_partition_is_declared_on_the_kind_not_on_its_queue(boss: Shoal) -> None:
    with pytest.raises(InvalidInput, match="declare partition_by on the kind") as refused:
        await boss.declare_limits(QUEUE, global_concurrency=2, partition_by="account")
    assert refused.value.field == "partition_by"
    with pytest.raises(InvalidInput) as refused:
        boss.work(QUEUE, noop, partition_by="account")  # type: ignore[arg-type]
    assert refused.value.field == "partition_by"
    with pytest.raises(InvalidInput) as refused:
        App().handler(QUEUE, partition_by="account")
    assert refused.value.field == "partition_by"
    assert await boss.limits(QUEUE) == []
    # A kind's on_complete queue is a queue like any other.
    await boss.declare_limits("batch.test.kind.on_complete", partition_by="account")


async def test_insert_many_takes_a_partition_key_per_job(boss: Shoal, db_url: str) -> None:
    await boss.declare_limits("keyed", global_concurrency=1, partition_by="account")
    await boss.insert_many(
        "keyed", [{"account": "a"}, {"account": "a"}], partition_keys=["b", None]
    )
    found = await sql(
        db_url, "SELECT partition_key FROM shoal.job WHERE queue = 'keyed' ORDER BY id"
    )
    assert found == [("b",), ("a",)]
    with pytest.raises(InvalidInput) as refused:
        await boss.insert_many("keyed", [{}], partition_keys=["a", "b"])
    assert refused.value.field == "partition_keys"
    with pytest.raises(InvalidInput) as refused:
        await boss.insert_many("keyed", [{}], partition_keys=[True])  # type: ignore[list-item]
    assert refused.value.field == "partition_keys[0]"


async def test_retry_after_in_an_item_holds_back_its_partition_and_spends_no_attempt(
    fake_boss: Shoal, clock: FakeClock, db_url: str
) -> None:
    runs: list[str] = []

    async def handler(item: Item) -> None:
        runs.append(item.ref)
        if item.ref == "a-0" and runs.count("a-0") == 1:
            raise RetryAfter(60)  # the service behind account a said to wait a minute

    batches = make_batches(
        fake_boss, handler, global_concurrency=1, partition_by="account", retry_limit=0
    )
    probe = Probe(fake_boss)
    async with running(batches):
        created = await batches.create(
            KIND, [by_account(0, "a"), by_account(1, "a"), by_account(0, "b")]
        )
        await probe.job_finished(QUEUE, count=2)  # a-0 snoozed, b-0 done
        await probe.idle(QUEUE)
        # a-1 waits behind a-0's pause; the partition b went on.
        assert sorted(runs) == ["a-0", "b-0"]
        probe.discard()
        clock.advance(timedelta(seconds=61))
        await probe.job_finished(QUEUE, count=2)
        await probe.idle(QUEUE)
    await settle(batches, created.task_id)
    view = await batches.get(created.task_id)
    # One attempt allowed, and a-0 ran twice: the snooze spent none.
    assert (view.status, view.progress.completed) == ("completed", 3)
    assert sorted(runs) == ["a-0", "a-0", "a-1", "b-0"]
    ((history,),) = await sql(db_url, "SELECT errors FROM shoal.item WHERE ref = 'a-0'")
    assert [e["type"] for e in cast(list[dict[str, Any]], history)] == ["RetryAfter"]


async def test_a_snooze_in_an_item_of_a_kind_without_limits_runs_it_again_after_the_delay(
    fake_boss: Shoal, clock: FakeClock, db_url: str
) -> None:
    runs: list[str] = []

    async def handler(item: Item) -> None:
        runs.append(item.ref)
        if len(runs) == 1:
            raise Snooze(30)

    batches = make_batches(fake_boss, handler, retry_limit=0)
    probe = Probe(fake_boss)
    async with running(batches):
        created = await batches.create(KIND, ["only"])
        await probe.job_finished(QUEUE)
        await probe.idle(QUEUE)
        assert runs == ["only"]
        probe.discard()
        clock.advance(timedelta(seconds=31))
        await probe.job_finished(QUEUE)
    await settle(batches, created.task_id)
    view = await batches.get(created.task_id)
    assert (view.status, runs) == ("completed", ["only", "only"])
    ((history,),) = await sql(db_url, "SELECT errors FROM shoal.item WHERE ref = 'only'")
    assert [e["type"] for e in cast(list[dict[str, Any]], history)] == ["Snoozed"]
