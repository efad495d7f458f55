"""Names are checked whole: a trailing newline (or any other stray character) is refused.

A pattern anchored with ``$`` and applied with ``re.match`` also matches before
a final newline, so ``"q\\n"`` once passed as a queue name and was stored.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest

from shoal import InvalidInput, Shoal
from shoal.app import App
from shoal.ingest.message import Topic

BAD_NAMES = ["q\n", "q\r\n", "\nq", "q\nq"]


def job_rows(db_url: str) -> int:
    with psycopg.connect(db_url) as conn:
        ((jobs,),) = conn.execute("SELECT count(*) FROM shoal.job").fetchall()
        ((schedules,),) = conn.execute("SELECT count(*) FROM shoal.schedule").fetchall()
    return int(jobs) + int(schedules)


Call = Callable[[Shoal, str], Awaitable[Any]]

CALLS: dict[str, tuple[Call, str]] = {
    "send": (lambda boss, name: boss.send(name, {"a": 1}), "queue"),
    "send dead_letter": (
        lambda boss, name: boss.send("ok_queue", None, dead_letter=name),
        "dead_letter",
    ),
    "insert": (
        lambda boss, name: boss.insert([{"queue": "ok_queue"}, {"queue": name}]),
        "jobs[1].queue",
    ),
    "insert dead_letter": (
        lambda boss, name: boss.insert([{"queue": "ok_queue", "dead_letter": name}]),
        "jobs[0].dead_letter",
    ),
    "schedule name": (lambda boss, name: boss.schedule(name, "* * * * *"), "name"),
    "schedule queue": (lambda boss, name: boss.schedule("tick", "* * * * *", queue=name), "queue"),
    "fetch": (lambda boss, name: boss.fetch(name), "queue"),
    "pause": (lambda boss, name: boss.pause_queue(name), "queue"),
    "redrive": (lambda boss, name: boss.redrive(name), "queue"),
}


@pytest.mark.parametrize("name", BAD_NAMES)
@pytest.mark.parametrize("call", sorted(CALLS))
async def test_a_queue_name_with_a_newline_is_refused_naming_the_field_and_nothing_is_written(
    boss: Shoal, db_url: str, call: str, name: str
) -> None:
    run, field = CALLS[call]
    with pytest.raises(InvalidInput) as raised:
        await run(boss, name)
    assert raised.value.field == field
    assert repr(name) in str(raised.value)
    assert job_rows(db_url) == 0


async def _handler(item: Any) -> None:
    return None


@pytest.mark.parametrize("name", BAD_NAMES)
def test_app_declarations_refuse_names_with_a_newline(name: str) -> None:
    app = App()
    with pytest.raises(InvalidInput, match="queue"):
        app.handler(name)
    with pytest.raises(InvalidInput, match="name"):
        app.schedule(name, "* * * * *")
    with pytest.raises(InvalidInput, match="kind"):
        app.batch(name)(_handler)
    with pytest.raises(InvalidInput, match="topic"):
        Topic(name)


async def test_good_names_still_pass(boss: Shoal) -> None:
    assert await boss.send("a/b.c-d_e", None, dead_letter="dl.0") is not None
