"""Database calls through a peer that stops answering: shoal's own deadline, and recovery.

Connections go through :class:`tests.tcp_proxy.TcpProxy`, which can stop
forwarding bytes while keeping every connection open: what a frozen server or
a broken network path looks like. No keepalive or TCP timeout notices that
within seconds; only the deadline each call runs under does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from shoal import DeadlineExceeded, Job, JobState, Shoal
from shoal.db import Database
from shoal.db.pool import AsyncConn
from tests.conftest import wait_for
from tests.tcp_proxy import TcpProxy

DEADLINE = timedelta(seconds=1)


@pytest.fixture
async def proxy(db_url: str) -> AsyncIterator[TcpProxy]:
    info = conninfo_to_dict(db_url)
    host = str(info.get("host") or "127.0.0.1")
    if host.startswith("/"):
        pytest.skip("the proxy forwards TCP; the test server listens on a Unix socket")
    proxy = await TcpProxy.start(host, int(info.get("port") or 5432))
    try:
        yield proxy
    finally:
        await proxy.close()


@pytest.fixture
def proxied_url(db_url: str, proxy: TcpProxy) -> str:
    return make_conninfo(db_url, host="127.0.0.1", port=proxy.port)


@pytest.fixture
def direct(observer: Shoal) -> Shoal:
    """A client that bypasses the proxy, to set up and inspect while the proxy is stalled."""
    return observer


async def scalar(boss: Shoal, query: str, *params: Any) -> Any:
    async def run(conn: AsyncConn) -> Any:
        cur = await conn.execute(query, params)
        row = await cur.fetchone()
        return None if row is None else row[0]

    return await boss.db.run(run)


def pool_stat(db: Database, name: str) -> int:
    return int(db.pool.get_stats().get(name, 0))


async def test_call_through_a_stalled_connection_raises_deadline_exceeded_and_drops_it(
    proxied_url: str, proxy: TcpProxy, direct: Shoal
) -> None:
    db = await Database(
        proxied_url, deadline=DEADLINE, min_size=1, max_size=2, application_name="shoal-proxied"
    ).open()
    boss = Shoal(db, listen=False)
    try:
        await db.pool.wait(timeout=10)
        stale_pid = await scalar(boss, "SELECT pg_backend_pid()")
        assert await boss.send("deadline_q", {"n": 1}) is not None

        proxy.stall()
        # Bounded by shoal's deadline, not by TCP: nothing came back at all. The
        # outer timeout only turns a hang into a failure; DeadlineExceeded (not
        # its TimeoutError) shows that shoal's own deadline fired.
        with pytest.raises(DeadlineExceeded):
            await asyncio.wait_for(boss.send("deadline_q", {"n": 2}), timeout=30)
        # The connection was thrown away, not handed back to the pool.
        assert pool_stat(db, "returns_bad") + pool_stat(db, "connections_lost") == 1

        proxy.resume()
        assert await boss.send("deadline_q", {"n": 3}) is not None
        fresh_pid = await scalar(boss, "SELECT pg_backend_pid()")
        assert fresh_pid != stale_pid

        # And the server side of the abandoned connection goes away too.
        async def stale_backend_gone() -> bool:
            return not await scalar(
                direct, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", stale_pid
            )

        await wait_for(stale_backend_gone, timeout_s=10)
    finally:
        await boss.close()


async def test_worker_rides_out_a_stall_and_completes_every_job(
    proxied_url: str, proxy: TcpProxy, direct: Shoal
) -> None:
    queue, before, during = "stall_q", 300, 50
    # Short leases: a claim whose commit landed while its reply was stalled is
    # held by nobody, and maintenance must hand it out again, soon.
    expire_in = timedelta(seconds=6)
    await direct.insert(
        [{"queue": queue, "data": i, "expire_in": expire_in} for i in range(before)]
    )

    db = await Database(
        proxied_url, deadline=DEADLINE, max_size=4, application_name="shoal-proxied"
    ).open()
    boss = Shoal(db)

    async def handle(job: Job) -> int:
        await asyncio.sleep(0.01)  # noqa: TID251 - jobs take real time, so the stall lands mid-run
        return int(job.data)

    async def completed() -> int:
        stats = await direct.stats()
        return sum(s.count for s in stats if s.queue == queue and s.state is JobState.COMPLETED)

    try:
        worker = boss.work(queue, handle, concurrency=4, poll_interval=timedelta(seconds=0.5))

        async def some_done() -> bool:
            return await completed() >= 50

        await wait_for(some_done, timeout_s=20)
        assert await completed() < before, "the queue drained before the stall"

        proxy.stall()
        timeouts_before = pool_stat(db, "requests_errors")

        # The stall is felt: a call passed its deadline and its connection was
        # dropped, and the worker kept asking for connections after that.
        def felt_and_retried() -> bool:
            dropped = pool_stat(db, "returns_bad") + pool_stat(db, "connections_lost")
            return dropped >= 1 and pool_stat(db, "requests_errors") >= timeouts_before + 2

        await wait_for(felt_and_retried, timeout_s=20)
        # Jobs sent while the worker cannot reach the database are not missed.
        await direct.insert(
            [{"queue": queue, "data": i, "expire_in": expire_in} for i in range(during)]
        )
        proxy.resume()

        async def all_done() -> bool:
            await direct.maintain()  # rescues jobs whose claim or outcome the stall made ambiguous
            return await completed() == before + during

        await wait_for(all_done, timeout_s=45, interval_s=0.5)
        jobs = await direct.jobs(queue, limit=1000)
        assert len(jobs) == before + during
        assert all(j.state is JobState.COMPLETED for j in jobs)
        # At least once: a job may have run again after its lease ran out in
        # the stall, but no attempt failed for any other reason.
        assert all(j.attempt in (1, 2) for j in jobs)
        assert {e.type for j in jobs for e in j.errors} <= {"LeaseExpired"}
        await worker.stop()
    finally:
        await boss.close()


async def test_claim_the_server_committed_and_answered_survives_the_connection_dropping(
    proxied_url: str, proxy: TcpProxy, direct: Shoal
) -> None:
    """The claim's reply reaches the worker in full, then the server closes the connection.

    The jobs were claimed and the worker was told so: it must get them, not an
    error that leaves them active under nobody until their lease runs out (15
    minutes by default).
    """
    ids = set(await direct.insert([{"queue": "ack_q", "data": i} for i in range(5)]))
    db = await Database(
        proxied_url, deadline=timedelta(seconds=10), max_size=1, application_name="shoal-proxied"
    ).open()
    boss = Shoal(db, listen=False)
    try:
        await db.pool.wait(timeout=10)
        proxy.hold_reply_after(b"claim_limited_jobs")  # fetch claims through the limited claim
        claim = asyncio.create_task(boss.fetch("ack_q", batch_size=5))

        async def committed_and_held() -> bool:
            active = await scalar(
                direct, "SELECT count(*) FROM shoal.job WHERE queue = 'ack_q' AND state = 'active'"
            )
            return proxy.holding_reply and active == 5

        await wait_for(committed_and_held, timeout_s=10)
        await close_after_answering(direct, proxy)

        jobs = await asyncio.wait_for(claim, timeout=15)
        assert {j.id for j in jobs} == ids
    finally:
        await boss.close()


async def test_outcomes_the_server_committed_and_answered_count_once_when_the_connection_drops(
    proxied_url: str, proxy: TcpProxy, direct: Shoal
) -> None:
    """A completion and a failure are recorded together; the connection drops after the answer.

    The write took effect and the worker was told so: its stats count one
    completed and one failed job, not two outcomes "lost" to a retry that
    found them already written.
    """
    await direct.insert([{"queue": "ack_q", "data": i, "retry_limit": 0} for i in range(2)])
    db = await Database(
        proxied_url, deadline=timedelta(seconds=10), max_size=1, application_name="shoal-proxied"
    ).open()
    boss = Shoal(db, listen=False)
    finish = asyncio.Event()

    async def handle(job: Job) -> str:
        await finish.wait()
        if job.data == 1:
            raise RuntimeError("fails for good")
        return "done"

    try:
        # Polls rarely: the one connection stays with the outcome write.
        worker = boss.work("ack_q", handle, concurrency=2, poll_interval=timedelta(seconds=60))
        await wait_for(lambda: worker.in_flight == 2, timeout_s=10)
        # Both handlers end in the same step, so one write records both outcomes.
        proxy.hold_reply_after(b".complete_jobs_v3(")  # the completion statement
        finish.set()

        async def committed_and_held() -> bool:
            stats = {s.state: s.count for s in await direct.stats() if s.queue == "ack_q"}
            return proxy.holding_reply and stats.get(JobState.COMPLETED) == 1

        await wait_for(committed_and_held, timeout_s=10)
        await close_after_answering(direct, proxy)

        await asyncio.wait_for(worker.idle.wait(), timeout=15)
        states = {s.state: s.count for s in await direct.stats() if s.queue == "ack_q"}
        assert states == {JobState.COMPLETED: 1, JobState.FAILED: 1}
        stats = worker.stats
        assert (stats.completed, stats.failed, stats.lost) == (1, 1, 0)
        await worker.stop()
    finally:
        await boss.close()


async def close_after_answering(direct: Shoal, proxy: TcpProxy) -> None:
    """End the proxied session on the server while the proxy holds its last answer, then resume.

    The client then receives the answer and, right behind it, the close: what
    ``pg_terminate_backend``, a server restart or a pooler recycling its
    connections does to a client between two calls.
    """
    terminated = await scalar(
        direct,
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE application_name = 'shoal-proxied'",
    )
    assert terminated == 1

    async def backend_gone() -> bool:
        return not await scalar(
            direct, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'shoal-proxied'"
        )

    await wait_for(backend_gone, timeout_s=10)
    proxy.resume()
