"""Nothing a producer accepted is dropped when the database and the broker are both down.

``Pipeline.submit`` with a ``spool_dir`` keeps a message neither path took in
an fsynced spool on disk, and its replayer hands it on once a path is back:
applied in place while the broker is still down, published when the broker
is back first. Without a spool the producer is held instead, never dropped.
The spool survives its producer being killed, and a torn last write (a
crash in the middle of a commit) is dropped without losing the ones before.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest

from shoal import Conflict, FakeClock, InvalidInput, Message, Pipeline, Shoal, TransientError
from shoal.db import EmbeddedPostgres
from shoal.ingest.message import new_envelope
from shoal.ingest.nats import NatsTransport
from shoal.ingest.pipeline import HELD_LOUD_AFTER, PipelineClosed
from shoal.ingest.postgres import PostgresTransport
from shoal.ingest.spool import Spool
from shoal.ingest.transport import Transport
from shoal.testing import NatsServer
from tests.conftest import advancing, until_done, wait_for
from tests.ingest_helpers import READINGS, Reading, apply_reading, create_schema, scalar
from tests.test_ingest import BrokerDownFor, running, stopped, unfinished

# The bound before the spool replaced the old one: submit gave up after it.
OLD_GIVE_UP = timedelta(seconds=30)
FAST = timedelta(milliseconds=50)


async def applied_once_each(boss: Shoal, ids: list[str]) -> bool:
    """Each id applied, each once; False too while the database is not back yet."""
    try:
        calls = await scalar(
            boss.db,
            "SELECT count(*) FILTER (WHERE n = 1) = %s AND count(*) = %s FROM"
            " (SELECT message_id, count(*) AS n FROM apply_call"
            "  WHERE message_id = ANY(%s) GROUP BY message_id) c",
            (len(ids), len(ids), ids),
        )
    except TransientError:
        return False
    return bool(calls)


@pytest.fixture
async def outage(
    throwaway_pg: EmbeddedPostgres, nats_server: NatsServer
) -> AsyncIterator[tuple[EmbeddedPostgres, NatsServer, Shoal]]:
    # A short deadline: calls to the stopped server fail within it.
    boss = await Shoal.connect(throwaway_pg.url(), max_size=4, deadline=timedelta(milliseconds=500))
    await create_schema(boss.db)
    try:
        yield throwaway_pg, nats_server, boss
    finally:
        await boss.close()


async def test_messages_accepted_while_database_and_broker_are_both_down_are_applied_once(
    outage: tuple[EmbeddedPostgres, NatsServer, Shoal],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    pg, nats, boss = outage
    caplog.set_level(logging.WARNING, logger="shoal.ingest")
    clock = FakeClock()
    transport = NatsTransport(
        nats.url,
        request_timeout=timedelta(seconds=1),
        reconnect_wait=timedelta(milliseconds=100),
    )
    producer = Pipeline(boss, transport, clock=clock, spool_dir=tmp_path / "spool")
    await producer.config.set("ingest.mode", "sync")
    await producer.start()
    try:
        await both_down_then_back(pg, nats, boss, producer, clock, caplog)
    finally:
        await producer.close()
    # Empty, and closed cleanly: no log left, nothing to replay on the next start.
    assert sorted(p.name for p in (tmp_path / "spool").iterdir()) == ["spool.db"]
    reopened = await Spool(tmp_path / "spool", clock=clock).open()
    assert len(reopened) == 0
    await reopened.close()


async def both_down_then_back(
    pg: EmbeddedPostgres,
    nats: NatsServer,
    boss: Shoal,
    producer: Pipeline,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    apply = apply_reading(boss.db)

    # Both down: the database stopped, nats-server stopped.
    nats.stop()
    await asyncio.to_thread(pg.stop, "fast")
    first = [f"a{i}" for i in range(10)]
    submits = [
        asyncio.create_task(
            producer.submit(READINGS, Reading(card_id=i, amount=1), apply, id=message_id)
        )
        for i, message_id in enumerate(first)
    ]
    done = await until_done(clock, cast(asyncio.Task[Any], asyncio.gather(*submits)))
    assert {d.route for d in done} == {"spooled"}
    assert not any("giving up" in r.getMessage() for r in caplog.records)
    stats = producer.spool_stats()
    assert stats is not None and stats.messages == 10 and stats.bytes > 0

    # The outage outlasts submit's old patience; the spool keeps everything.
    start = clock.monotonic()
    await advancing(clock, lambda: clock.monotonic() - start > 1.2 * OLD_GIVE_UP.total_seconds())
    assert len(cast(Spool, producer.spool)) == 10

    # The database comes back, the broker does not: the replayer applies in place.
    await asyncio.to_thread(pg.start)
    await advancing(clock, lambda: not len(cast(Spool, producer.spool)))
    assert await applied_once_each(boss, first)
    assert await scalar(boss.db, "SELECT sum(total) FROM card") == 10

    # Down again; this time the broker comes back first: the replayer publishes.
    await asyncio.to_thread(pg.stop, "fast")
    second = [f"b{i}" for i in range(10)]
    submits = [
        asyncio.create_task(
            producer.submit(READINGS, Reading(card_id=i, amount=2), apply, id=message_id)
        )
        for i, message_id in enumerate(second)
    ]
    done = await until_done(clock, cast(asyncio.Task[Any], asyncio.gather(*submits)))
    assert {d.route for d in done} == {"spooled"}
    await asyncio.to_thread(nats.start)
    await advancing(clock, lambda: not len(cast(Spool, producer.spool)))
    await asyncio.to_thread(pg.start)

    # A consumer (on real time, as another process would be) applies what was published.
    consumer_side = Pipeline(boss, NatsTransport(nats.url))
    await consumer_side.start()
    try:
        handle = await running(consumer_side.consumer(READINGS, apply, poll=FAST))
        await wait_for(lambda: applied_once_each(boss, second), timeout_s=60)
        await stopped(handle)
    finally:
        await consumer_side.close()
    assert await applied_once_each(boss, first + second)
    assert await scalar(boss.db, "SELECT sum(total) FROM card") == 30


async def test_without_a_spool_submit_holds_the_producer_instead_of_dropping(
    fake_boss: Shoal, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="shoal.ingest")
    await create_schema(fake_boss.db)
    broker = BrokerDownFor(PostgresTransport(fake_boss), 10**6)
    pipeline = Pipeline(fake_boss, cast(Transport, broker))

    async def overloaded(message: Message[Reading]) -> None:
        raise TransientError("no database connection free in time")

    submit = asyncio.create_task(
        pipeline.submit(READINGS, Reading(card_id=1, amount=1), overloaded, id="held")
    )
    start = clock.monotonic()
    await advancing(clock, lambda: clock.monotonic() - start > 2 * HELD_LOUD_AFTER.total_seconds())
    assert not submit.done()
    assert not await pipeline.admit(READINGS)  # take no new work while it is held
    held = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(held) == 1 and "producer is held" in held[0].getMessage()

    broker.refusals = 0  # the broker is back: the message is handed to the topic
    done = await until_done(clock, submit)
    assert done.route == "handed_off" and done.id == "held"
    assert await pipeline.admit(READINGS)

    # A submit still held when its producer closes the pipeline stops trying
    # and says the message was not taken, instead of trying forever in a task
    # that outlives the pipeline and its pool.
    broker.refusals = 10**6
    late = asyncio.create_task(
        pipeline.submit(READINGS, Reading(card_id=1, amount=2), overloaded, id="late")
    )
    await advancing(clock, lambda: clock.monotonic() - start > 3 * HELD_LOUD_AFTER.total_seconds())
    assert not late.done()
    await pipeline.close()
    with pytest.raises(PipelineClosed, match="late was neither applied nor published"):
        await until_done(clock, late)


async def test_spooled_messages_survive_a_killed_producer_and_the_next_one_replays_them(
    boss: Shoal, db_url: str, nats_server: NatsServer, tmp_path: Path
) -> None:
    await create_schema(boss.db)
    spool_dir = tmp_path / "spool"
    producer = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.spool_producer",
        db_url,
        nats_server.url,
        str(spool_dir),
        "20",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert producer.stdin is not None and producer.stdout is not None
        assert await producer.stdout.readline() == b"ready\n"
        await asyncio.to_thread(nats_server.stop)
        producer.stdin.write(b"go\n")
        await producer.stdin.drain()
        answers = [await producer.stdout.readline() for _ in range(20)]
        assert answers == [f"spooled k{i}\n".encode() for i in range(20)]
        os.kill(producer.pid, signal.SIGKILL)  # a real crash: only the disk remains
        await producer.wait()
    finally:
        if producer.returncode is None:
            producer.kill()
            await producer.wait()

    await asyncio.to_thread(nats_server.start)
    successor = Pipeline(boss, NatsTransport(nats_server.url), spool_dir=spool_dir)
    await successor.start()
    handle = await running(successor.consumer(READINGS, apply_reading(boss.db), poll=FAST))
    ids = [f"k{i}" for i in range(20)]
    await wait_for(lambda: applied_once_each(boss, ids), timeout_s=60)
    await wait_for(lambda: not len(cast(Spool, successor.spool)))
    await stopped(handle)
    assert await scalar(boss.db, "SELECT sum(total) FROM card") == 20
    await successor.close()


async def test_a_torn_last_write_is_dropped_and_the_writes_before_it_are_kept(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "spool"
    spool = await Spool(directory, clock=clock).open()
    envelopes = [new_envelope({"n": i}, published_at=clock.now(), id=f"m{i}") for i in range(3)]
    for envelope in envelopes:
        await spool.put("t", envelope, mode=None, reason="both down", rounds=2)
    await spool.remove(["m1"])
    # A second pipeline on the same directory is refused while this one holds it.
    with pytest.raises(Conflict, match="in use"):
        await Spool(directory, clock=clock).open()
    # The files as a crash at this moment leaves them: every write in the log.
    wal = crashed_copy(directory, tmp_path / "at-crash")
    await spool.close()
    log_bytes = wal.read_bytes()
    frame = 24 + int.from_bytes(log_bytes[8:12], "big")  # SQLite's WAL: header, page size
    assert len(log_bytes) > 32 + 4 * frame  # the puts and the remove are there, not checkpointed

    # The crash cut the next write short: part of a frame at the log's end.
    torn = crashed_copy(tmp_path / "at-crash", tmp_path / "torn")
    torn.write_bytes(log_bytes + log_bytes[32 : 32 + 24 + 100])
    caplog.set_level(logging.WARNING, logger="shoal.ingest")
    reopened = await Spool(tmp_path / "torn", clock=clock).open()
    assert [e.envelope.id for e in reopened.entries()] == ["m0", "m2"]
    assert reopened.entries()[0].envelope.body == {"n": 0}
    assert any("did not close it" in r.getMessage() for r in caplog.records)
    # It goes on as a spool: a put, then everything handed on, leaves it empty.
    await reopened.put(
        "t",
        new_envelope({"n": 3}, published_at=clock.now(), id="m3"),
        mode=None,
        reason="",
        rounds=1,
    )
    assert [e.envelope.id for e in reopened.entries()] == ["m0", "m2", "m3"]
    await reopened.remove(["m0", "m2", "m3"])
    await reopened.close()
    assert sorted(p.name for p in (tmp_path / "torn").iterdir()) == ["spool.db"]
    empty = await Spool(tmp_path / "torn", clock=clock).open()
    assert len(empty) == 0
    await empty.close()

    # A last frame whose checksum does not hold is torn too: the remove of m1
    # it held is dropped, and m1 is handed on again.
    corrupt = crashed_copy(tmp_path / "at-crash", tmp_path / "corrupt")
    corrupt.write_bytes(log_bytes[:-1] + bytes([log_bytes[-1] ^ 0xFF]))
    again = await Spool(tmp_path / "corrupt", clock=clock).open()
    assert [e.envelope.id for e in again.entries()] == ["m0", "m1", "m2"]
    await again.close()


async def test_a_second_put_of_one_id_replaces_the_first_also_after_a_restart(
    tmp_path: Path, clock: FakeClock
) -> None:
    directory = tmp_path / "spool"
    spool = await Spool(directory, clock=clock).open()
    for n in range(3):
        envelope = new_envelope({"n": n}, published_at=clock.now(), id="same")
        await spool.put("t", envelope, mode=None, reason="", rounds=1)
    await spool.put(
        "t", new_envelope({}, published_at=clock.now(), id="other"), mode=None, reason="", rounds=1
    )
    assert [(e.envelope.id, e.envelope.body) for e in spool.entries()] == [
        ("same", {"n": 2}),
        ("other", {}),
    ]
    crashed_copy(directory, tmp_path / "at-crash")  # before the earlier rows' removal is flushed
    await spool.close()
    for reopened_from in (directory, tmp_path / "at-crash"):
        reopened = await Spool(reopened_from, clock=clock).open()
        assert [(e.envelope.id, e.envelope.body) for e in reopened.entries()] == [
            ("same", {"n": 2}),
            ("other", {}),
        ]
        assert await reopened.remove(["same", "other"]) == 2
        await reopened.close()
        empty = await Spool(reopened_from, clock=clock).open()
        assert len(empty) == 0
        await empty.close()


def crashed_copy(source: Path, target: Path) -> Path:
    """Copy a spool's database and log to ``target``, as they are on disk; the log's path."""
    target.mkdir()
    for name in ("spool.db", "spool.db-wal"):
        shutil.copyfile(source / name, target / name)
    return target / "spool.db-wal"


async def test_a_full_spool_holds_the_producer_and_admits_no_new_work(
    fake_boss: Shoal, clock: FakeClock, tmp_path: Path
) -> None:
    await create_schema(fake_boss.db)
    broker = BrokerDownFor(PostgresTransport(fake_boss), 10**6)
    pipeline = Pipeline(
        fake_boss, cast(Transport, broker), spool_dir=tmp_path / "spool", spool_max_bytes=1
    )

    async def overloaded(message: Message[Reading]) -> None:
        raise TransientError("no database connection free in time")

    await pipeline.start()
    try:
        first = asyncio.create_task(
            pipeline.submit(READINGS, Reading(card_id=1, amount=1), overloaded, id="first")
        )
        assert (await until_done(clock, first)).route == "spooled"
        assert not await pipeline.admit(READINGS)  # full: take no new work

        second = asyncio.create_task(
            pipeline.submit(READINGS, Reading(card_id=2, amount=1), overloaded, id="second")
        )
        start = clock.monotonic()
        await advancing(clock, lambda: clock.monotonic() - start > 2 * OLD_GIVE_UP.total_seconds())
        assert not second.done()  # held, neither spooled nor dropped

        broker.refusals = 0  # the broker is back
        assert (await until_done(clock, second)).route == "handed_off"
        await advancing(clock, lambda: not len(cast(Spool, pipeline.spool)))
        assert await pipeline.admit(READINGS)
        assert await unfinished(fake_boss, READINGS.name) == 2  # both on the topic
    finally:
        await pipeline.close()


async def test_segment_files_of_the_earlier_spool_format_are_refused_by_name_not_ignored(
    tmp_path: Path, clock: FakeClock
) -> None:
    directory = tmp_path / "spool"
    directory.mkdir()
    (directory / "spool-000000000001.log").write_bytes(b"SHOALSP1 waiting messages")
    with pytest.raises(InvalidInput, match=r"spool_dir: .*1 segment file\(s\).*spool-000000000001"):
        await Spool(directory, clock=clock).open()
    assert sorted(p.name for p in directory.iterdir()) == ["spool-000000000001.log"]


async def test_a_start_the_broker_refuses_leaves_the_spool_free_for_the_next_start(
    boss: Shoal, nats_server: NatsServer, tmp_path: Path
) -> None:
    spool_dir = tmp_path / "spool"
    producer = Pipeline(
        boss,
        NatsTransport(nats_server.url, connect_timeout=timedelta(seconds=1)),
        spool_dir=spool_dir,
    )
    await asyncio.to_thread(nats_server.stop)
    with pytest.raises(TransientError):
        await producer.start()
    # The failed start let the spool go and stopped its replayer: a producer
    # that tries again once the broker is back starts, instead of finding its
    # own spool "in use by another process" on every later try.
    assert not [t for t in asyncio.all_tasks() if "_replay" in repr(t.get_coro())]
    await asyncio.to_thread(nats_server.start)
    await producer.start()
    try:
        assert producer.spool is not None and len(producer.spool) == 0
        with pytest.raises(Conflict, match="in use by another process"):
            await Spool(spool_dir, clock=FakeClock()).open()
    finally:
        await producer.close()
