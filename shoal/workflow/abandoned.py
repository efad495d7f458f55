"""Runs whose job failed for good: marked failed, naming why, instead of left running.

A workflow's job fails only when the database fails under the run's
bookkeeping or the worker running it dies; it is retried with backoff for
about an hour. When its retries are spent, the queue leaves a copy of it in
:data:`DEAD_QUEUE` (every workflow job is sent with that dead-letter queue),
and :class:`AbandonedRuns` handles the copy: the run fails with the job's
last error, unless another job has taken it since. A child run's parent
hears of it as of any other end.
"""

from __future__ import annotations

import logging

from shoal.errors import NotFound
from shoal.internal import INTERNAL_PREFIX
from shoal.queue.client import Shoal
from shoal.queue.job import Job
from shoal.queue.rows import JobRecord
from shoal.workflow.store import WorkflowStore

log = logging.getLogger("shoal.workflow")

DEAD_QUEUE = INTERNAL_PREFIX + "workflow.dead"


class AbandonedRuns:
    """The handler of :data:`DEAD_QUEUE`: one copy of a failed workflow job per call."""

    def __init__(self, store: WorkflowStore, boss: Shoal) -> None:
        self.store = store
        self.boss = boss

    async def __call__(self, job: Job) -> None:
        data = job.data
        run_id = data.get("run") if isinstance(data, dict) else None
        if not isinstance(run_id, str):
            return  # not a run's own job (a batch task's completion names no run)
        origin = await self._origin(job)
        error = because(origin)
        origin_id = None if origin is None else int(origin.id)
        now = self.boss.clock.sql_now()
        if await self.store.fail_abandoned_run(run_id, origin_id, error, now=now):
            log.error("workflow run %s failed: %s", run_id, error)

    async def _origin(self, job: Job) -> JobRecord | None:
        """The workflow job that failed for good, as stored (None: archived away)."""
        try:
            copy = await self.boss.get_job(job.id)
            if copy.origin_id is None:
                return None
            return await self.boss.get_job(copy.origin_id)
        except NotFound:
            return None


def because(origin: JobRecord | None) -> str:
    """The run's error: which job failed for good, after how many attempts, and its last error."""
    if origin is None:
        return "the job running this run failed for good (its record is gone)"
    last = origin.errors[-1] if origin.errors else None
    said = f"; its last error: {last.type}: {last.message}" if last is not None else ""
    return (
        f"the job running this run ({origin.queue} #{origin.id}) failed for good after "
        f"{origin.attempt} attempt(s){said}"
    )
