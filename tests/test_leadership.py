"""The elector: of the processes contending for a duty, one leads; it learns at once when it
loses it, and another takes over within a retry (at once when the leader resigns).

Each elector here has a database handle of its own, as a process would, and
all share one FakeClock: a follower's tries and a leader's renewals happen
only when the test advances it. Losing a connection needs no time at all.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import timedelta

import psycopg
import pytest

from shoal import Database, FakeClock
from shoal.db.leadership import Elector, elector_name, leaders
from shoal.errors import InvalidInput
from tests.conftest import wait_for

DUTY = "test.duty"
RETRY = timedelta(seconds=5)
DEPOSE_AFTER = timedelta(seconds=30)
# A follower that tries more often than the leader reconnects: after the
# leader's connection is killed, one advance of this lets only the follower try.
QUICK_RETRY = timedelta(seconds=1)
# Long enough for a round on a loaded machine; the tests wait for events, not time.
EVENT_TIMEOUT_S = 30.0


@pytest.fixture
async def make(db_url: str, clock: FakeClock) -> AsyncIterator[Callable[..., Elector]]:
    """Electors on ``db_url``, each with a pool of its own, closed after the test."""
    made: list[tuple[Elector, Database]] = []

    def elector(identity: str, **options: timedelta) -> Elector:
        db = Database(db_url, max_size=2)
        options.setdefault("retry", RETRY)
        options.setdefault("depose_after", DEPOSE_AFTER)
        e = Elector(db, clock=clock, identity=identity, **options)  # type: ignore[arg-type]
        made.append((e, db))
        return e

    try:
        yield elector
    finally:
        for e, db in made:
            await e.close()
            await db.close()


async def event(ev: asyncio.Event) -> None:
    await asyncio.wait_for(ev.wait(), EVENT_TIMEOUT_S)


async def started(e: Elector, duty: str = DUTY) -> None:
    """``e`` contends for ``duty`` and has held its first round."""
    e.contend(duty)
    e.start()
    await event(e.connected)


async def next_round(e: Elector, after: int) -> None:
    await wait_for(lambda: e.rounds > after, timeout_s=EVENT_TIMEOUT_S)


async def advance(clock: FakeClock, delta: timedelta, *electors: Elector) -> None:
    """Move the clock by ``delta`` and wait for each of ``electors`` to hold a round."""
    before = [e.rounds for e in electors]
    clock.advance(delta)
    for e, n in zip(electors, before, strict=True):
        await next_round(e, n)


def is_leader(e: Elector, duty: str = DUTY) -> bool:
    ship = e.leadership(duty)
    return ship is not None and ship.is_leader


async def terminate(db_url: str, pid: int) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))


async def test_of_two_electors_one_leads_and_keeps_leading_while_it_renews(
    make: Callable[..., Elector], clock: FakeClock, db_url: str
) -> None:
    first, second = make("host-a:1"), make("host-b:2")
    await started(first)
    await started(second)
    assert is_leader(first) and not is_leader(second)

    # Many rounds of both: the leader renews, so the follower, which would
    # depose it after DEPOSE_AFTER of silence, never does.
    for _ in range(12):
        await advance(clock, RETRY, first, second)
    assert is_leader(first) and not is_leader(second)
    assert first.leadership(DUTY).terms == 1  # type: ignore[union-attr]

    # Who leads is visible to anyone, by process.
    async with Database(db_url, max_size=1) as db:
        (holder,) = await leaders(db, [DUTY])
    assert holder.process == "host-a:1"
    assert holder.application_name == elector_name("host-a:1")


async def test_a_leader_whose_connection_is_killed_knows_at_once_and_another_takes_over(
    make: Callable[..., Elector], clock: FakeClock, db_url: str
) -> None:
    leader = make("host-a:1")
    follower = make("host-b:2", retry=QUICK_RETRY, depose_after=DEPOSE_AFTER)
    await started(leader)
    await started(follower)
    assert is_leader(leader) and not is_leader(follower)
    async with Database(db_url, max_size=1) as db:
        (holder,) = await leaders(db, [DUTY])
    assert holder.pid is not None

    await terminate(db_url, holder.pid)
    # The leader learns without any time passing: its term ends with the session.
    await event(leader.leadership(DUTY).lost)  # type: ignore[union-attr]
    assert not is_leader(follower)  # nobody has tried yet

    # The follower's next try; the leader reconnects later.
    await advance(clock, QUICK_RETRY, follower)
    assert is_leader(follower)
    await advance(clock, RETRY, leader)  # the old leader is back, as a follower
    assert not is_leader(leader) and is_leader(follower)


async def test_a_resigning_leader_hands_over_at_once(
    make: Callable[..., Elector], clock: FakeClock
) -> None:
    leader, follower = make("host-a:1"), make("host-b:2")
    await started(leader)
    await started(follower)
    assert is_leader(leader)

    leader.withdraw(DUTY)
    # No time passes: the resignation's notification makes the follower try.
    await event(follower.leadership(DUTY).elected)  # type: ignore[union-attr]
    assert not is_leader(leader)

    # Closing resigns too.
    leader.contend(DUTY)
    await follower.close()
    await event(leader.leadership(DUTY).elected)  # type: ignore[union-attr]


async def test_a_duty_given_up_and_taken_again_at_once_can_still_be_given_up(
    make: Callable[..., Elector], clock: FakeClock
) -> None:
    leader, follower = make("host-a:1"), make("host-b:2")
    await started(leader)
    await started(follower)
    rounds = leader.rounds
    # Given up and asked for again before a round unlocked it: the lock counts
    # each acquisition, so taking it again first would leave one behind.
    leader.withdraw(DUTY)
    leader.contend(DUTY)
    await next_round(leader, rounds)
    leader.withdraw(DUTY)
    await event(follower.leadership(DUTY).elected)  # type: ignore[union-attr]
    assert not is_leader(leader)


async def test_a_stalled_leader_is_deposed_after_depose_after_and_not_before(
    make: Callable[..., Elector], clock: FakeClock, db_url: str
) -> None:
    # An elector's session whose process stopped running: it holds the lock
    # and never runs another statement.
    stalled = await psycopg.AsyncConnection.connect(
        db_url, autocommit=True, application_name=elector_name("stalled:1")
    )
    try:
        await stalled.execute("SELECT pg_advisory_lock(hashtext(%s))", (f"shoal.{DUTY}",))
        follower = make("host-b:2")
        await started(follower)
        assert not is_leader(follower)
        for _ in range(int(DEPOSE_AFTER / RETRY) - 1):
            await advance(clock, RETRY, follower)
            assert not is_leader(follower)
        await advance(clock, RETRY, follower)
        assert is_leader(follower)
        with pytest.raises(psycopg.OperationalError):
            await stalled.execute("SELECT 1")
    finally:
        await stalled.close()


async def test_a_session_that_is_no_elector_is_never_deposed(
    make: Callable[..., Elector], clock: FakeClock, db_url: str
) -> None:
    # The backlog monitor of an earlier release holds the same lock on a
    # connection named after its pool: it is waited for, never ended.
    other = await psycopg.AsyncConnection.connect(db_url, autocommit=True, application_name="shoal")
    try:
        await other.execute("SELECT pg_advisory_lock(hashtext(%s))", (f"shoal.{DUTY}",))
        follower = make("host-b:2")
        await started(follower)
        for _ in range(int(DEPOSE_AFTER / RETRY) + 2):
            await advance(clock, RETRY, follower)
        assert not is_leader(follower)
        await other.execute("SELECT pg_advisory_unlock_all()")
        await advance(clock, RETRY, follower)
        assert is_leader(follower)
    finally:
        await other.close()


async def test_lead_runs_the_work_in_each_term_and_cancels_it_when_the_term_ends(
    make: Callable[..., Elector], clock: FakeClock, db_url: str
) -> None:
    e = make("host-a:1", retry=QUICK_RETRY, depose_after=DEPOSE_AFTER)
    runs: list[asyncio.Event] = []
    stopped: list[asyncio.Event] = []

    async def work() -> None:
        runs.append(asyncio.Event())
        stopped.append(asyncio.Event())
        runs[-1].set()
        try:
            await asyncio.Event().wait()
        finally:
            stopped[-1].set()

    lead = asyncio.create_task(e.lead(DUTY, work))
    try:
        await wait_for(lambda: len(runs) == 1, timeout_s=EVENT_TIMEOUT_S)
        async with Database(db_url, max_size=1) as db:
            (holder,) = await leaders(db, [DUTY])
        assert holder.pid is not None
        await terminate(db_url, holder.pid)
        await event(stopped[0])  # the term ended with the connection
        assert len(runs) == 1
        await advance(clock, QUICK_RETRY, e)  # reconnects and leads again
        await wait_for(lambda: len(runs) == 2, timeout_s=EVENT_TIMEOUT_S)
    finally:
        lead.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await lead
    assert stopped[-1].is_set()
    # Cancelling lead() gave the duty up: nobody holds it now.
    async with Database(db_url, max_size=1) as db:
        await wait_for(
            lambda: _nobody_leads(db),
            timeout_s=EVENT_TIMEOUT_S,
        )


async def _nobody_leads(db: Database) -> bool:
    (holder,) = await leaders(db, [DUTY])
    return holder.pid is None


def test_bad_settings_are_refused_with_their_names(db_url: str) -> None:
    db = Database(db_url)
    with pytest.raises(InvalidInput, match="depose_after"):
        Elector(db, retry=timedelta(seconds=5), depose_after=timedelta(seconds=10))
    with pytest.raises(InvalidInput, match="retry"):
        Elector(db, retry=timedelta(0))
    with pytest.raises(InvalidInput, match="duty"):
        Elector(db).contend("Has Spaces")


async def test_shoal_status_names_the_process_that_leads_each_duty(
    make: Callable[..., Elector], db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from shoal.cli import main
    from shoal.queue.maintenance import MAINTENANCE_DUTY

    await started(make("host-a:41"), MAINTENANCE_DUTY)
    capsys.readouterr()
    # main() runs its own event loop: in a thread of its own.
    assert await asyncio.to_thread(main, ["--database-url", db_url, "status"]) == 0
    lines = capsys.readouterr().out.splitlines()
    (maintenance,) = [line for line in lines if MAINTENANCE_DUTY in line]
    assert "host-a:41" in maintenance
    (cron,) = [line for line in lines if "queue.cron" in line]
    assert "nobody" in cron
