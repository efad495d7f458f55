"""shoal.send() in SQL: from psql and triggers, in the caller's transaction, checked as Python."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from shoal import App, InvalidInput, Job, Shoal
from shoal.queue.rows import JobRecord

from .conftest import require_program


def sql_send(url: str, queue: Any, data: Any = None, options: Any = None) -> int | None:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT shoal.send(%s, %s, %s)",
            (queue, Jsonb(data), None if options is None else Jsonb(options)),
        ).fetchone()
    assert row is not None
    return row[0]


def settings(record: JobRecord) -> tuple[Any, ...]:
    return (record.priority, record.policy, record.expire_in, record.dead_letter)


def test_psql_sends_a_job_and_is_told_which_option_is_wrong(db_url: str) -> None:
    psql = require_program("psql", "postgresql-client")
    sent = subprocess.run(
        [psql, db_url, "-XAtq", "-v", "ON_ERROR_STOP=1", "-c",
         """SELECT shoal.send('email_send', '{"id": 1}'::jsonb, '{"retry_limit": 3}'::jsonb)"""],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    refused = subprocess.run(
        [psql, db_url, "-XAtq", "-c",
         """SELECT shoal.send('email_send', '{}', '{"retry_limit": -1}')"""],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "retry_limit: must be an integer >= 0, got -1" in refused.stderr
    with psycopg.connect(db_url) as conn:
        rows = conn.execute("SELECT id, queue, data, retry_limit FROM shoal.job").fetchall()
    assert rows == [(int(sent.stdout), "email_send", {"id": 1}, 3)]


BAD_SENDS: list[tuple[Any, dict[str, Any]]] = [
    ("bad queue", {}),
    (None, {}),
    ("q", {"retry_limt": 3}),
    ("q", {"retryLimit": 3}),
    ("q", {"expireInSeconds": 3}),
    ("q", {"retry_limit": -1}),
    ("q", {"retry_limit": "3"}),
    ("q", {"retry_limit": True}),
    ("q", {"retry_limit": 1.5}),
    ("q", {"retry_delay": -2}),
    ("q", {"retry_delay": "5"}),
    ("q", {"retry_delay_max": False}),
    ("q", {"expire_in": 0}),
    ("q", {"expire_in": -1}),
    ("q", {"retry_backoff": "yes"}),
    ("q", {"retry_backoff": 1}),
    ("q", {"singleton_key": ""}),
    ("q", {"singleton_key": 5}),
    ("q", {"singleton_key": "k" * 513}),
    ("q", {"priority": 1_000_001}),
    ("q", {"priority": -1_000_001}),
    ("q", {"priority": "high"}),
    ("q", {"dead_letter": "no good"}),
    ("q", {"dead_letter": 7}),
    ("q", {"start_after": -1}),
    ("q", {"cost": 0}),
    ("q", {"cost": 2.5}),
    ("q", {"cost": None}),
    ("q", {"partition_key": True}),
    ("q", {"partition_key": 1.5}),
    ("q", {"partition_key": ["a"]}),
    ("q", {"partition_key": "k" * 513}),
    # The ranges of times and durations (send_v2).
    ("q", {"retry_limit": 2_147_483_648}),
    ("q", {"retry_delay": 3_155_760_001}),
    ("q", {"retry_delay_max": 3_155_760_001}),
    ("q", {"expire_in": 3_155_760_001}),
    ("q", {"expire_in": 0.0005}),
    ("q", {"start_after": 3_155_760_001}),
]


async def test_sql_send_refuses_what_the_python_api_refuses_with_the_same_message(
    boss: Shoal, db_url: str
) -> None:
    for queue, options in BAD_SENDS:
        with pytest.raises(InvalidInput) as python:
            await boss.send(queue, {"id": 1}, **options)
        with pytest.raises(psycopg.errors.InvalidParameterValue) as sql:
            sql_send(db_url, queue, {"id": 1}, options)
        assert sql.value.diag.message_primary == str(python.value), (queue, options)
        assert sql.value.diag.column_name == python.value.field
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="options: must be a JSON"):
        sql_send(db_url, "q", None, [1])
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="data: payload is 9"):
        sql_send(db_url, "q", "x" * 9000)
    assert await boss.stats() == []


SQL_OUT_OF_RANGE: list[tuple[dict[str, Any], str]] = [
    # Numbers a float8 cannot hold, or whose interval PostgreSQL cannot hold:
    # before, 22003 or 22008 naming no option.
    ({"retry_delay": 1e308}, "must be at most 3155760000 seconds (100 years)"),
    ({"retry_delay_max": 1e308}, "must be at most 3155760000 seconds (100 years)"),
    ({"expire_in": 1e308}, "must be at most 3155760000 seconds (100 years)"),
    ({"start_after": 1e308}, "must be at most 3155760000 seconds (100 years)"),
    ({"start_after": 1e12}, "must be at most 3155760000 seconds (100 years)"),
    # Before, a CHECK violation (the interval rounded to 0).
    ({"expire_in": 1e-9}, "must be at least 0.001 seconds"),
    # Texts the timestamptz cast takes but that are no timestamp with an
    # offset: before, stored (a job that never runs, or one Python cannot load).
    ({"start_after": "infinity"}, "expected an ISO 8601 timestamp"),
    ({"start_after": "infinity+00"}, "expected an ISO 8601 timestamp"),
    ({"start_after": "-infinity"}, "expected an ISO 8601 timestamp"),
    ({"start_after": "now"}, "expected an ISO 8601 timestamp"),
    ({"start_after": "today"}, "expected an ISO 8601 timestamp"),
    ({"start_after": "tomorrow"}, "expected an ISO 8601 timestamp"),
    ({"start_after": "yesterday +05"}, "expected an ISO 8601 timestamp"),
    ({"start_after": "tomorrow+05:00"}, "expected an ISO 8601 timestamp"),
    ({"start_after": "2027-03-01"}, "expected an ISO 8601 timestamp"),
    ({"start_after": "2027-03-01-01"}, "expected an ISO 8601 timestamp"),
    ({"start_after": "March 1 2027 09:00 +00"}, "expected an ISO 8601 timestamp"),
    ({"start_after": "2027-03-01T09:00:00"}, "a datetime must be timezone-aware"),
    ({"start_after": "2027-02-30T09:00:00Z"}, "expected a timestamp with its time zone"),
    # Timestamps outside 1970 to 100 years from now.
    ({"start_after": "33715-01-01T00:00:00Z"}, "expected an ISO 8601 timestamp"),
    ({"start_after": "9999-12-31T00:00:00Z"}, "to 100 years from now, got '9999-"),
    ({"start_after": "1969-12-31T23:59:59+00:00"}, "must be from 1970-01-01T00:00:00+00:00"),
]


@pytest.mark.parametrize(("options", "message"), SQL_OUT_OF_RANGE)
def test_sql_send_refuses_numbers_and_times_outside_the_range_naming_the_option(
    db_url: str, options: dict[str, Any], message: str
) -> None:
    ((option, _),) = options.items()
    with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
        sql_send(db_url, "q", {"id": 1}, options)
    assert raised.value.diag.column_name == option
    primary = raised.value.diag.message_primary or ""
    assert primary.startswith(f"{option}: ") and message in primary, primary
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM shoal.job").fetchone() == (0,)


def test_sql_send_refuses_a_number_no_float_can_hold_naming_the_option(db_url: str) -> None:
    # 1e400 is valid JSON (jsonb keeps it as numeric) but no float8: before,
    # 22003 "out of range for type double precision".
    for option in ("retry_delay", "retry_delay_max", "expire_in", "start_after"):
        with (
            psycopg.connect(db_url) as conn,
            pytest.raises(psycopg.errors.InvalidParameterValue) as raised,
        ):
            conn.execute(
                "SELECT shoal.send('q', NULL, jsonb_build_object(%s::text, 1e400))", (option,)
            )
        assert raised.value.diag.column_name == option


def test_sql_send_takes_the_ends_of_each_range_as_before(db_url: str) -> None:
    ends: list[tuple[dict[str, Any], str, str]] = [
        ({"expire_in": 0.001}, "expire_in", "00:00:00.001"),
        ({"retry_delay": 3_155_760_000}, "retry_delay", "876600:00:00"),
        ({"retry_delay_max": 0}, "retry_delay_max", "00:00:00"),
        ({"start_after": "1970-01-01T00:00:00Z"}, "start_after", "1970-01-01 00:00:00+00"),
        (
            {"start_after": "2099-06-01 12:00:00.123456+02"},
            "start_after",
            "2099-06-01 10:00:00.123456+00",
        ),
        ({"start_after": "2099-06-01T12:00+0530"}, "start_after", "2099-06-01 06:30:00+00"),
        ({"start_after": None}, "start_after = created_at", "true"),
        ({"start_after": 3_155_760_000}, "start_after - created_at", "36525 days"),
    ]
    for options, column, shown in ends:
        job_id = sql_send(db_url, "q", None, options)
        with psycopg.connect(db_url) as conn:
            conn.execute("SET TimeZone = 'UTC'")
            row = conn.execute(
                f"SELECT ({column})::text FROM shoal.job WHERE id = %s",
                (job_id,),
            ).fetchone()
        assert row == (shown,), options


async def test_sql_send_gives_the_same_job_as_python_and_returns_null_for_a_taken_key(
    boss: Shoal, db_url: str
) -> None:
    sends: list[dict[str, Any]] = [
        {},
        {"retry_limit": 0, "retry_delay": 1.5, "retry_backoff": True, "priority": -3},
        {"retry_delay_max": 60, "expire_in": 30, "dead_letter": "dead"},
    ]
    for options in sends:
        from_python = await boss.send("same", {"n": 1}, **options)
        from_sql = sql_send(db_url, "same", {"n": 1}, options)
        assert from_python is not None and from_sql is not None
        python_job = await boss.get_job(from_python)
        sql_job = await boss.get_job(from_sql)  # type: ignore[arg-type]
        assert settings(sql_job) == settings(python_job)
        assert sql_job.data == python_job.data
    assert sql_send(db_url, "keyed", None, {"singleton_key": "k"}) is not None
    assert sql_send(db_url, "keyed", None, {"singleton_key": "k"}) is None
    later = sql_send(db_url, "later", None, {"start_after": "2099-06-01T12:00:00+02:00"})
    start = (await boss.get_job(later)).start_after  # type: ignore[arg-type]
    assert start == datetime(2099, 6, 1, 10, 0, tzinfo=UTC)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="timezone-aware"):
        sql_send(db_url, "later", None, {"start_after": "2099-01-01T00:00:00"})


async def test_a_queues_defaults_reach_every_sender_unless_the_send_names_the_option(
    boss: Shoal, db_url: str
) -> None:
    await boss.set_queue_defaults(
        "reports", retry_limit=7, expire_in=timedelta(minutes=3), priority=5, dead_letter="dlq"
    )
    assert await boss.queue_defaults("reports") == {
        "retry_limit": 7,
        "expire_in": timedelta(minutes=3),
        "priority": 5,
        "dead_letter": "dlq",
    }
    async with await Shoal.connect(db_url, listen=False) as other_process:
        plain = await other_process.send("reports", {"n": 1})
        named = await other_process.send("reports", {"n": 2}, retry_limit=1, dead_letter=None)
        (many,) = await other_process.insert_many("reports", [{"n": 3}], priority=0)
    from_sql = sql_send(db_url, "reports", {"n": 4})
    sql_named = sql_send(db_url, "reports", {"n": 5}, {"retry_limit": 1, "dead_letter": None})
    for job_id in (plain, from_sql):
        job = await boss.get_job(job_id)  # type: ignore[arg-type]
        assert (job.policy.retry_limit, job.expire_in, job.priority, job.dead_letter) == (
            7, timedelta(minutes=3), 5, "dlq")  # fmt: skip
    for job_id in (named, sql_named):
        job = await boss.get_job(job_id)  # type: ignore[arg-type]
        assert (job.policy.retry_limit, job.expire_in, job.dead_letter) == (
            1, timedelta(minutes=3), None)  # fmt: skip
    assert (await boss.get_job(many)).priority == 0  # type: ignore[arg-type]
    other_queue = await boss.get_job(await boss.send("elsewhere") or 0)  # type: ignore[arg-type]
    assert other_queue.policy.retry_limit == 2

    await boss.set_queue_defaults("reports")  # none: removed
    assert await boss.queue_defaults("reports") == {}
    with pytest.raises(InvalidInput, match="singleton_key: is an option of one job"):
        await boss.set_queue_defaults("reports", singleton_key="x")  # type: ignore[call-arg]


async def test_app_handler_defaults_are_stored_when_a_worker_starts(boss: Shoal) -> None:
    import asyncio

    app = App()

    @app.handler("invoices", retry_limit=9, retry_backoff=True, expire_in=timedelta(seconds=90))
    async def invoice(job: Job) -> None: ...

    @app.handler("plain")
    def plain(job: Job) -> None: ...

    await boss.set_queue_defaults("plain", priority=4)  # an earlier App's, since dropped
    stop = asyncio.Event()
    stop.set()
    await app.run(boss, stop=stop, maintenance=False, scheduler=False)
    assert await boss.queue_defaults("invoices") == {
        "retry_limit": 9,
        "retry_backoff": True,
        "expire_in": timedelta(seconds=90),
    }
    assert await boss.queue_defaults("plain") == {}
    job = await boss.get_job(await boss.send("invoices") or 0)  # type: ignore[arg-type]
    assert (job.policy.retry_limit, job.policy.retry_backoff) == (9, True)
    with pytest.raises(InvalidInput, match="retry_limit: must be an integer"):
        app.handler("other", retry_limit=-1)
    with pytest.raises(InvalidInput, match="unknown job option"):
        app.handler("other", retry_limt=3)  # type: ignore[call-arg]


def test_a_trigger_sends_in_the_callers_transaction(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("""
            CREATE TABLE orders (id bigint PRIMARY KEY, email text NOT NULL);
            CREATE FUNCTION orders_notify() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM shoal.send('order_mail', jsonb_build_object('order', NEW.id),
                                   '{"retry_limit": 4}');
                RETURN NEW;
            END $$;
            CREATE TRIGGER orders_notify AFTER INSERT ON orders
                FOR EACH ROW EXECUTE FUNCTION orders_notify();
        """)
        listener = psycopg.connect(db_url, autocommit=True)
        listener.execute("LISTEN shoal_jobs")
        with pytest.raises(RuntimeError), conn.transaction():
            conn.execute("INSERT INTO orders VALUES (1, 'a@example.com')")
            raise RuntimeError("rolled back")
        with conn.transaction():
            conn.execute("INSERT INTO orders VALUES (2, 'b@example.com')")
        rows = conn.execute("SELECT data, retry_limit FROM shoal.job").fetchall()
        assert rows == [({"order": 2}, 4)]
        # Idle workers are woken when the caller commits, as from Python.
        woken = [n.payload for n in listener.notifies(timeout=10, stop_after=1)]
        listener.close()
        assert woken == ["order_mail"]


def test_the_sql_examples_of_the_queue_page_run(db_url: str) -> None:
    """docs/queue.md's SQL blocks, in order: the page creates the `orders` its trigger uses."""
    import re
    from pathlib import Path

    page = (Path(__file__).parent.parent / "docs" / "queue.md").read_text()
    blocks = re.findall(r"^```sql\n(.*?)^```$", page, re.MULTILINE | re.DOTALL)
    assert blocks
    with psycopg.connect(db_url, autocommit=True) as conn:
        for block in blocks:
            conn.execute(block)
        conn.execute("INSERT INTO orders (email) VALUES ('bo@example.com')")
        queues = conn.execute("SELECT queue FROM shoal.job ORDER BY id").fetchall()
    assert [q for (q,) in queues] == ["email_send", "digest", "report", "order_mail", "order_mail"]


async def test_sql_send_keys_a_limited_queues_job_as_the_python_insert_does(
    boss: Shoal, db_url: str
) -> None:
    await boss.declare_limits("poll", global_concurrency=2, partition_by="account_id")
    await boss.declare_limits("flat", global_concurrency=2)
    sent = [
        sql_send(db_url, "poll", {"account_id": "a1"}),
        sql_send(db_url, "poll", {"account_id": "a1"}, {"partition_key": 7, "cost": 3}),
        sql_send(db_url, "poll", {"other": 1}),
        sql_send(db_url, "flat", {"account_id": "a1"}, {"partition_key": "ignored"}),
        sql_send(db_url, "free", {"account_id": "a1"}),
    ]
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT partition_key, cost FROM shoal.job WHERE id = ANY(%s) ORDER BY id", (sent,)
        ).fetchall()
    # The field of the data; the key sent wins; '' when the data has no field;
    # '' for a queue limited but not partitioned; none for a queue without limits.
    assert rows == [("a1", 1), ("7", 3), ("", 1), ("", 1), (None, 1)]
    python = await boss.send("poll", {"account_id": "a1"})
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT partition_key FROM shoal.job WHERE id = %s", (python,)
        ).fetchone()
    assert row == ("a1",)
