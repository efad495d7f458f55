"""SyncClient: the queue from synchronous code, checked and written as by the async client."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from shoal import InvalidInput, JobState, NotFound, Shoal, ShoalError, SyncClient
from shoal.queue.options import QUEUE_DEFAULT_NAMES
from shoal.queue.rows import GIVEN_BITS


@pytest.fixture
def client(db_url: str) -> Iterator[SyncClient]:
    with SyncClient.connect(db_url, max_size=2) as sync_client:
        yield sync_client


def count(url: str, queue: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM shoal.job WHERE queue = %s", (queue,)).fetchone()
    assert row is not None
    return int(row[0])


def test_send_insert_get_and_cancel_from_synchronous_code(client: SyncClient) -> None:
    job_id = client.send("mail", {"user_id": 7}, retry_limit=5, expire_in=timedelta(minutes=2))
    assert job_id is not None
    record = client.get_job(job_id)
    assert (record.queue, record.data, record.state) == ("mail", {"user_id": 7}, JobState.CREATED)
    assert (record.policy.retry_limit, record.expire_in) == (5, timedelta(minutes=2))

    ids = client.insert([{"queue": "mail", "data": 1}, {"queue": "sms", "priority": 3}])
    many = client.insert_many("mail", [{"n": 1}, {"n": 2}], singleton_keys=["a", "b"])
    again = client.insert_many("mail", [{"n": 3}], singleton_keys=["a"])
    assert all(ids) and all(many) and again == [None]  # "a" is taken by a waiting job
    first, second = ids
    assert first is not None and second is not None
    assert client.get_job(second).priority == 3

    assert client.cancel([job_id, first]) == {job_id, first}
    assert client.get_job(job_id).state is JobState.CANCELLED
    with pytest.raises(NotFound, match="job 999999 does not exist"):
        client.get_job(999_999)  # type: ignore[arg-type]


async def test_bad_input_gets_the_same_error_from_both_clients(
    client: SyncClient, boss: Shoal
) -> None:
    cases: list[tuple[str, Any, dict[str, Any]]] = [
        ("mail", None, {"retry_limt": 3}),
        ("mail", None, {"retryLimit": 3}),
        ("mail", None, {"retry_limit": -1}),
        ("mail", None, {"expire_in": 0}),
        ("bad queue", None, {}),
        ("mail", {"x": float("nan")}, {}),
        ("mail", None, {"priority": 10**7}),
    ]
    for queue, data, options in cases:
        with pytest.raises(InvalidInput) as sync_error:
            client.send(queue, data, **options)
        with pytest.raises(InvalidInput) as async_error:
            await boss.send(queue, data, **options)
        assert str(sync_error.value) == str(async_error.value)
    with pytest.raises(InvalidInput, match=r"jobs\[1\]\.retry_limit"):
        client.insert([{"queue": "mail"}, {"queue": "mail", "retry_limit": "3"}])
    assert (await boss.stats()) == []  # nothing was written


def test_send_on_the_callers_connection_commits_and_rolls_back_with_it(
    client: SyncClient, db_url: str
) -> None:
    with psycopg.connect(db_url) as conn:
        with pytest.raises(RuntimeError), conn.transaction():
            client.send("orders", {"order": 1}, conn=conn)
            assert count(db_url, "orders") == 0  # not visible before the commit
            raise RuntimeError("the view failed")
        assert count(db_url, "orders") == 0
        with conn.transaction():
            job_id = client.send("orders", {"order": 2}, conn=conn)
            assert job_id is not None
            # Reads on the caller's connection see its own uncommitted write.
            assert client.get_job(job_id, conn=conn).data == {"order": 2}
    assert count(db_url, "orders") == 1


def test_a_sync_client_on_an_unmigrated_schema_says_to_migrate(db_url: str) -> None:
    with pytest.raises(ShoalError, match="shoal migrate"):
        SyncClient.connect(db_url, schema="elsewhere")


def test_every_option_a_queue_can_default_has_its_bit_in_the_insert() -> None:
    assert set(GIVEN_BITS) == QUEUE_DEFAULT_NAMES
    assert sorted(GIVEN_BITS.values()) == [1 << i for i in range(len(GIVEN_BITS))]
