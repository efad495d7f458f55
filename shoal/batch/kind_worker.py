"""The running worker of one batch kind, as :meth:`Batches.work` starts it."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

from shoal.batch.item_runner import ItemRunner
from shoal.queue.worker import DEFAULT_SHUTDOWN_GRACE, Worker


class KindWorker:
    """The running worker of one batch kind: its queue worker and heartbeat loop."""

    def __init__(self, worker: Worker, runner: ItemRunner) -> None:
        self.worker = worker
        self.runner = runner
        # The runner stops the handlers of items whose task is cancelled.
        if worker.notifier is not None:
            worker.notifier.listen_cancels(worker.queue, runner)
        self._heartbeats = asyncio.create_task(
            runner.heartbeat_loop(), name=f"shoal-heartbeat:{runner.kind.name}"
        )
        self._marks = asyncio.create_task(
            runner.mark_loop(), name=f"shoal-marks:{runner.kind.name}"
        )

    async def stop(self, grace: timedelta = DEFAULT_SHUTDOWN_GRACE) -> None:
        """Stop claiming, let running items finish within ``grace``, hand back the rest."""
        await self.worker.stop(grace)
        if self.worker.notifier is not None:
            self.worker.notifier.unlisten_cancels(self.worker.queue, self.runner)
        for loop in (self._heartbeats, self._marks):
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop
        await self.runner.release_unstarted()
        await self.runner.close()


__all__ = ["KindWorker"]
