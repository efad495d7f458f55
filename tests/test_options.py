"""Bad input gets an error naming the field, and nothing is written."""

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from shoal import InvalidInput, Shoal
from shoal.clock import SystemClock


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


NAN = float("nan")
INF = float("inf")
# A day past the longest duration an option takes (100 years).
PAST_MAX = timedelta(days=36_526)
QUEUE_DEFAULT_OPTIONS = ("retry_limit", "retry_delay", "retry_delay_max", "expire_in", "priority")


OUT_OF_RANGE: list[tuple[str, object, str]] = [
    ("retry_delay", 1e308, "must be at most 3155760000 seconds (100 years), got 1e+308"),
    ("retry_delay", INF, "must be at most 3155760000 seconds (100 years), got inf"),
    ("retry_delay", NAN, "must be a number of seconds, got nan"),
    ("retry_delay", 10**5000, "got an integer of 16610 bits"),
    ("retry_delay", PAST_MAX, "must be at most 3155760000 seconds"),
    ("retry_delay", -INF, "must be >= 0, got -inf"),
    ("retry_delay_max", 1e308, "must be at most 3155760000 seconds"),
    ("retry_delay_max", NAN, "must be a number of seconds"),
    ("retry_delay_max", timedelta.max, "must be at most 3155760000 seconds"),
    ("expire_in", 1e308, "must be at most 3155760000 seconds"),
    ("expire_in", 1e-9, "must be at least 0.001 seconds, got 1e-09"),
    ("expire_in", timedelta(microseconds=999), "must be at least 0.001 seconds"),
    ("expire_in", NAN, "must be a number of seconds"),
    ("expire_in", -INF, "must be > 0, got -inf"),
    ("start_after", 1e12, "must be at most 3155760000 seconds"),
    ("start_after", 1e308, "must be at most 3155760000 seconds"),
    ("start_after", INF, "must be at most 3155760000 seconds"),
    ("start_after", NAN, "must be a number of seconds"),
    ("start_after", PAST_MAX, "must be at most 3155760000 seconds"),
    ("start_after", datetime(9999, 12, 31, tzinfo=UTC), "to 100 years from now, got 9999"),
    ("start_after", datetime(1969, 12, 31, 23, 59, tzinfo=UTC), "from 1970-01-01"),
    ("start_after", datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5))), "from 1970"),
    ("retry_limit", 2**31, "must be an integer from 0 to 2147483647, got 2147483648"),
    ("priority", -(10**5000), "must be an integer within ±1000000"),
    ("cost", 2**31, "must be an integer from 1 to 2147483647"),
]


@pytest.mark.parametrize(
    ("option", "value", "message"),
    OUT_OF_RANGE,
    # The values' own ids: str(10**5000) raises ValueError.
    ids=[f"{option}-{i}" for i, (option, _, _) in enumerate(OUT_OF_RANGE)],
)
async def test_every_sender_refuses_numbers_and_times_outside_the_range_naming_the_option(
    boss: Shoal, option: str, value: object, message: str
) -> None:
    # Before, 1e308 seconds raised OverflowError, expire_in of 999 us a CHECK
    # violation, and a start_after of 1e12 s (year 33715) or 9999 was stored.
    given: dict[str, Any] = {option: value}
    sends: list[Any] = [
        boss.send("ok_queue", None, **given),
        boss.insert([{"queue": "ok_queue", **given}]),
        boss.insert_many("ok_queue", [1], **given),
    ]
    if not isinstance(value, datetime):
        sends.append(boss.schedule("nightly", "0 3 * * *", **given))
    if option in QUEUE_DEFAULT_OPTIONS:
        sends.append(boss.set_queue_defaults("ok_queue", **given))
    for send in sends:
        with pytest.raises(InvalidInput) as raised:
            await send
        assert raised.value.field.endswith(option)
        assert message in raised.value.message, raised.value
    assert await job_count(boss) == 0
    assert await boss.queue_defaults("ok_queue") == {}
    assert await boss.schedules() == []


async def test_the_ends_of_each_range_are_accepted(boss: Shoal) -> None:
    longest = timedelta(days=36_525)
    latest = SystemClock().now() + longest - timedelta(days=1)
    earliest = datetime(1970, 1, 1, tzinfo=UTC)
    longest_id = await boss.send(
        "ok_queue", None, retry_delay=3_155_760_000, retry_delay_max=longest, expire_in=longest
    )
    shortest_id = await boss.send("ok_queue", None, expire_in=0.001, start_after=longest)
    latest_id = await boss.send("ok_queue", None, retry_limit=2**31 - 1, start_after=latest)
    earliest_id = await boss.send("ok_queue", None, start_after=earliest)
    longest_job = await boss.get_job(longest_id or 0)  # type: ignore[arg-type]
    assert longest_job.policy.retry_delay == longest == longest_job.policy.retry_delay_max
    assert longest_job.expire_in == longest
    shortest_job = await boss.get_job(shortest_id or 0)  # type: ignore[arg-type]
    assert shortest_job.expire_in == timedelta(milliseconds=1)
    latest_job = await boss.get_job(latest_id or 0)  # type: ignore[arg-type]
    assert (latest_job.start_after, latest_job.policy.retry_limit) == (latest, 2**31 - 1)
    earliest_job = await boss.get_job(earliest_id or 0)  # type: ignore[arg-type]
    assert earliest_job.start_after == earliest


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("retry_delay", timedelta(days=40_000)),
        ("retry_delay", timedelta(days=-1)),
        ("expire_in", timedelta(days=40_000)),
        ("expire_in", timedelta(microseconds=1)),
        ("retry_limit", 2**31),
        ("priority", 1_000_001),
        ("zombie_timeout", timedelta(days=40_000)),
    ],
)
def test_a_batch_kinds_item_job_options_are_in_the_ranges_of_every_job(
    option: str, value: object
) -> None:
    from shoal.batch.kinds import BatchKind

    async def handler(item: Any) -> None: ...

    given: dict[str, Any] = {option: value}
    with pytest.raises(InvalidInput) as raised:
        BatchKind(name="extract", handler=handler, **given)
    assert raised.value.field == option


@pytest.mark.parametrize(
    "deadline",
    [10**400, float("inf"), float("nan"), 0, 10 * 366 * 86400],
    ids=["10**400", "inf", "nan", "0", "over-10-years"],
)
async def test_a_task_deadline_out_of_range_is_refused_naming_it(
    boss: Shoal, deadline: float
) -> None:
    from .batch_helpers import make_batches

    batches = make_batches(boss)
    with pytest.raises(InvalidInput) as raised:
        await batches.create("test.kind", ["a"], deadline=deadline)
    assert raised.value.field == "deadline_s"


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
