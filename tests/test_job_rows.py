"""A job row is read by column name, whichever statement and store return it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shoal.queue.rows import JOB_COLUMNS, job_records
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
