"""Bad input gets an error naming the field, and nothing is written."""

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from shoal import InvalidInput, Shoal


async def job_count(boss: Shoal) -> int:
    return sum(row.count for row in await boss.stats())


@pytest.mark.parametrize(
    ("queue", "data", "options", "field"),
    [
        ("has space", None, {}, "queue"),
        ("", None, {}, "queue"),
        ("q" * 129, None, {}, "queue"),
        ("colon:name", None, {}, "queue"),
        ("ok_queue", {"blob": "x" * 9000}, {}, "data"),
        ("ok_queue", {"when": datetime(2026, 1, 1, tzinfo=UTC)}, {}, "data"),
        ("ok_queue", {"x": float("nan")}, {}, "data"),
        ("ok_queue", {"x": "nul\x00here"}, {}, "data"),
        ("ok_queue", None, {"retryLimit": 3}, "retryLimit"),
        ("ok_queue", None, {"bogus": 1}, "bogus"),
        ("ok_queue", None, {"retry_delay": -1}, "retry_delay"),
        ("ok_queue", None, {"start_after": timedelta(seconds=-5)}, "start_after"),
        ("ok_queue", None, {"start_after": datetime(2026, 1, 1)}, "start_after"),  # noqa: DTZ001 - the naive datetime is the bad input
        ("ok_queue", None, {"expire_in": 0}, "expire_in"),
        ("ok_queue", None, {"retry_limit": -1}, "retry_limit"),
        ("ok_queue", None, {"retry_limit": True}, "retry_limit"),
        ("ok_queue", None, {"priority": "high"}, "priority"),
        ("ok_queue", None, {"singleton_key": ""}, "singleton_key"),
        ("ok_queue", None, {"dead_letter": "bad name"}, "dead_letter"),
    ],
)
async def test_send_rejects_bad_input_naming_the_field(
    boss: Shoal, queue: str, data: object, options: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidInput) as raised:
        await boss.send(queue, data, **options)
    assert raised.value.field == field
    assert field in str(raised.value)
    assert await job_count(boss) == 0


async def test_pg_boss_spelling_gets_a_hint(boss: Shoal) -> None:
    with pytest.raises(InvalidInput, match="did you mean 'singleton_key'"):
        await boss.send("ok_queue", None, singletonKey="a")  # type: ignore[call-arg]


async def test_payload_cap_is_configurable(db_url: str) -> None:
    from shoal.db import Database

    db = await Database(db_url).open()
    small = Shoal(db, max_payload_bytes=64, listen=False)
    try:
        assert await small.send("ok_queue", {"x": "y" * 10}) is not None
        with pytest.raises(InvalidInput, match="over the 64-byte cap"):
            await small.send("ok_queue", {"x": "y" * 100})
    finally:
        await small.close()


async def test_one_bad_job_in_an_insert_writes_nothing(boss: Shoal) -> None:
    jobs: list[dict[str, object]] = [{"queue": "ok_queue", "data": {"i": i}} for i in range(100)]
    jobs.append({"queue": "ok_queue", "data": {"i": 100}, "priority": "urgent"})
    with pytest.raises(InvalidInput) as raised:
        await boss.insert(jobs)
    assert raised.value.field == "jobs[100].priority"
    assert await job_count(boss) == 0


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({1, 2}, "not JSON"),
        ("\ud800", "not JSON"),  # a lone surrogate has no UTF-8
        ("a\x00b", "NUL"),
        ("é" * 40, "over the 64-byte cap"),  # 40 characters, 82 bytes of UTF-8
    ],
)
async def test_a_bad_payload_after_good_ones_of_its_queue_is_named_by_position(
    db_url: str, bad: object, message: str
) -> None:
    # Jobs of a queue and data alone after the first are checked on a fast
    # path (shoal.queue.enqueue.JobBuilder.jobs): it must refuse what the
    # first job's path refuses, by the same name.
    from shoal.db import Database

    db = await Database(db_url).open()
    small = Shoal(db, max_payload_bytes=64, listen=False)
    try:
        jobs: list[dict[str, object]] = [{"queue": "ok_queue", "data": i} for i in range(3)]
        jobs.append({"queue": "ok_queue", "data": bad})
        with pytest.raises(InvalidInput, match=message) as raised:
            await small.insert(jobs)
        assert raised.value.field == "jobs[3].data"
        assert await job_count(small) == 0
    finally:
        await small.close()


async def test_insert_requires_a_queue_for_each_job(boss: Shoal) -> None:
    with pytest.raises(InvalidInput) as raised:
        await boss.insert([{"data": 1}])
    assert raised.value.field == "jobs[0].queue"


async def test_schedule_rejects_a_bad_cron_expression(boss: Shoal) -> None:
    with pytest.raises(InvalidInput) as raised:
        await boss.schedule("nightly", "61 * * * * *")
    assert raised.value.field == "cron"
    with pytest.raises(InvalidInput) as raised:
        await boss.schedule("nightly", "* * *")
    assert raised.value.field == "cron"
    with pytest.raises(InvalidInput) as raised:
        await boss.schedule("nightly", "* * * * *", tz="Mars/Olympus")
    assert raised.value.field == "tz"
    assert await boss.schedules() == []


def test_a_misspelled_option_is_a_type_error_where_it_is_written(tmp_path: Path) -> None:
    from mypy import api

    program = tmp_path / "sender.py"
    program.write_text(
        "from datetime import timedelta\n"
        "from shoal import App, Shoal\n"
        "async def go(boss: Shoal) -> None:\n"
        "    await boss.send('q', {'id': 1}, retry_limit=3, expire_in=timedelta(minutes=5))\n"
        "    await boss.send('q', {'id': 1}, retry_limt=3)\n"
        "    await boss.insert_many('q', [1, 2], priority='high')\n"
        "App().schedule('nightly', '0 3 * * *', retry_delay=60)\n"
    )
    out, _, status = api.run(
        ["--strict", "--no-incremental", "--cache-dir=/dev/null", str(program)]
    )
    assert status == 1, out
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert len(errors) == 2, out
    assert 'sender.py:5: error: Unexpected keyword argument "retry_limt"' in errors[0]
    assert "sender.py:6: error:" in errors[1] and "priority" in errors[1]
