"""A job row is read by column name, whichever statement and store return it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shoal import Shoal
from shoal.clock import FakeClock
from shoal.queue.rows import JOB_COLUMNS, LEAN_CLAIM_COLUMNS, job_records, lean_claims
from shoal.queue.states import JobState

AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
VALUES = {
    "id": 7,
    "queue": "email",
    "state": "failed",
    "data": {"to": "a@b"},
    "priority": 2,
    "attempt": 3,
    "retry_limit": 5,
    "retry_delay_s": 1.5,
    "retry_backoff": True,
    "retry_delay_max_s": 60.0,
    "expire_in_s": 900.0,
    "singleton_key": "k",
    "dead_letter": None,
    "origin_queue": None,
    "origin_id": None,
    "start_after": AT,
    "created_at": AT,
    "started_at": AT,
    "lease_expires_at": None,
    "finished_at": AT,
    "output": None,
    "errors": [{"attempt": 3, "at": "t", "type": "E", "message": "m"}],
    "holder": "w1",
}


def test_a_job_row_reads_the_same_in_any_column_order_and_with_extra_columns() -> None:
    columns = (*reversed(JOB_COLUMNS), "extra")
    (record,) = job_records(columns, [(*(VALUES[c] for c in reversed(JOB_COLUMNS)), "x")])
    assert record.state is JobState.FAILED
    assert record.expire_in == timedelta(minutes=15)
    assert record.policy.retry_delay == timedelta(seconds=1.5)
    assert record.holder == "w1"
    assert record.errors[0].message == "m"
    assert record.errors[0].traceback is None


def test_a_statement_missing_a_job_column_is_an_error_naming_it() -> None:
    columns = tuple(c for c in JOB_COLUMNS if c != "holder")
    with pytest.raises(RuntimeError, match="no column holder"):
        job_records(columns, [])


async def test_a_workers_claim_reads_each_job_as_stored_from_its_lean_row(
    fake_boss: Shoal, clock: FakeClock
) -> None:
    # claim_jobs_v5 returns no queue and no lease end, and its times as
    # seconds since the epoch: each claimed job must still carry what the
    # job row holds, to the microsecond.
    clock.advance(timedelta(microseconds=123_457))
    first = await fake_boss.send("q", {"n": 1}, priority=2, singleton_key="k")
    clock.advance(timedelta(seconds=3, microseconds=999_999))
    second = await fake_boss.send(
        "q",
        {"n": 2},
        expire_in=timedelta(seconds=30, microseconds=5),
        retry_limit=4,
        retry_delay=timedelta(seconds=1.5),
        retry_backoff=True,
        dead_letter="dead",
    )
    clock.advance(timedelta(microseconds=1))
    claimed = await fake_boss.store.claim("q", 10, now=clock.sql_now())
    assert [c.id for c in claimed] == [first, second]
    for claim in claimed:
        stored = await fake_boss.store.get_job(claim.id)
        assert stored is not None
        assert claim.queue == stored.queue == "q"
        assert claim.data == stored.data and claim.priority == stored.priority
        assert claim.attempt == stored.attempt == 1
        assert claim.policy == stored.policy
        assert claim.expire_in == stored.expire_in
        assert (claim.singleton_key, claim.dead_letter) == (
            stored.singleton_key,
            stored.dead_letter,
        )
        assert claim.created_at == stored.created_at
        assert claim.started_at == stored.started_at == clock.now()
        assert claim.lease_expires_at == stored.lease_expires_at
    assert claimed[0].created_at != claimed[1].created_at
    assert claimed[0].lease_expires_at != claimed[1].lease_expires_at


def test_a_lean_claim_row_is_read_by_name_with_its_times_to_the_microsecond() -> None:
    # The times of a lean claim row are float8 seconds since the epoch; the
    # lease ends expire_in after the claim's start, which every row shares.
    created = datetime(2026, 12, 7, 9, 30, 1, 123_457, tzinfo=UTC)
    started = datetime(2026, 12, 7, 9, 31, 59, 999_999, tzinfo=UTC)
    values = {
        "id": 1,
        "data": '{"a": 1}',
        "priority": 0,
        "attempt": 1,
        "retry_limit": 2,
        "retry_delay_s": 1.5,
        "retry_backoff": False,
        "retry_delay_max_s": 60.0,
        "expire_in_s": 30.000005,
        "singleton_key": None,
        "dead_letter": None,
        "created_at_s": created.timestamp(),
        "started_at_s": started.timestamp(),
    }
    columns = tuple(reversed(LEAN_CLAIM_COLUMNS))
    rows = [
        tuple(values[c] for c in columns),
        tuple({**values, "id": 2, "expire_in_s": 900.0, "created_at_s": 1e9}[c] for c in columns),
    ]
    one, two = lean_claims(columns, rows, "q")
    assert (one.id, one.queue, one.data, one.attempt) == (1, "q", {"a": 1}, 1)
    assert one.policy.retry_delay == timedelta(seconds=1.5)
    assert one.created_at == created and one.started_at == started == two.started_at
    assert one.lease_expires_at == started + timedelta(seconds=30, microseconds=5)
    assert two.created_at == datetime(2001, 9, 9, 1, 46, 40, tzinfo=UTC)
    assert two.lease_expires_at == started + timedelta(minutes=15)
    with pytest.raises(RuntimeError, match="no column started_at_s"):
        lean_claims(LEAN_CLAIM_COLUMNS[:-1], [], "q")
