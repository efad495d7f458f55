"""A worker killed with SIGKILL: what it held comes back after the consumer's ack wait.

The fault test behind this: a consumer declared with ``ack_wait=3s`` whose
worker was SIGKILLed left its messages in flight for 5 minutes, the
publisher's transport default, because the postgres transport fixed the
lease when a message was published. Here the publisher's transport has its
defaults and only the worker's consumers (``tests.ingestapp``) say 3 s.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shoal.testing import NatsServer
from tests.conftest import wait_for
from tests.ingest_helpers import READINGS
from tests.ingestapp import ACK_WAIT
from tests.test_ingest_processes import READING_COUNT, Setup, ingest_workers, make_setup

# Real time (a killed process, and on nats the server's timer): the survivors
# must have everything applied within this, far below the 5-minute default
# lease a dead worker's messages were held for, and well above the 3 s ack
# wait plus the time to apply the rest.
RECOVERY_S = 90.0


@pytest.fixture
async def publisher(
    db_url: str, transport_kind: str, nats: NatsServer | None
) -> AsyncIterator[Setup]:
    s = await make_setup(db_url, transport_kind, nats)
    try:
        yield s
    finally:
        await s.close()
        await s.boss.close()


async def test_messages_a_killed_worker_held_come_back_after_the_consumers_ack_wait(
    publisher: Setup, db_url: str, tmp_path: Path
) -> None:
    assert ACK_WAIT.total_seconds() == 3  # the worker's consumers: 3 s; the publisher's: default
    await publisher.publish_all()
    workers = ingest_workers(db_url, tmp_path, publisher.env)
    try:
        first = workers.start()
        await wait_for(lambda: _applied_at_least(publisher, READING_COUNT // 4), 60)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        held = (await publisher.pipeline.transport.depth(READINGS.name, "shoal")).in_flight
        assert held > 0, "the killed worker held nothing: killed too late to mean anything"
        assert await publisher.applied() < READING_COUNT

        workers.start()
        await publisher.wait_all_done(RECOVERY_S)
        await publisher.check_exactly_once_in_effect()
    finally:
        workers.cleanup()


async def _applied_at_least(setup: Setup, n: int) -> bool:
    return await setup.applied() >= n
