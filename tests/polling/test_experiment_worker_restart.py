"""The switch run restarts an ingest worker that exited by itself, as a supervisor would.

On a busy machine the worker started again after its SIGKILL could still be
booting when the run killed nats-server, find no server and exit, and
nothing would consume the topics again: the run could never reconcile.
(``shoal worker`` now waits for its nats-server instead; a worker can still
exit by itself on a setting it refuses, which is what this test uses.)
"""

from __future__ import annotations

import asyncio
import signal

from shoal_polling.experiment import ExperimentSettings, _WorkerProcess


async def test_a_worker_that_exits_by_itself_is_started_again_and_a_killed_one_is_left(
    db_url: str,
) -> None:
    # A transport the worker refuses: it exits at start with code 2.
    worker = _WorkerProcess(
        db_url, {"SHOAL_INGEST_TRANSPORT": "bogus"}, ExperimentSettings(consumers=1)
    )
    worker.start()
    try:
        first = worker.proc
        assert first is not None
        assert await asyncio.to_thread(first.wait, 120) == 2
        assert worker.restart_if_exited() == 2
        assert worker.proc is not first and worker.proc is not None
        assert worker.restart_if_exited() is None  # running: left alone

        worker.kill()
        assert worker.proc.returncode == -signal.SIGKILL
        assert worker.restart_if_exited() is None  # killed on purpose: its killer restarts it
        assert worker.proc.returncode == -signal.SIGKILL
    finally:
        worker.stop()
