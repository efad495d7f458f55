"""The queue handler that runs a workflow: take the run, replay its code, record how it ended."""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from shoal.errors import InvalidInput, UnstorableResult
from shoal.queue.job import Job
from shoal.queue.results import encode_result
from shoal.workflow.abandoned import DEAD_QUEUE
from shoal.workflow.context import Workflow
from shoal.workflow.runtime import (
    MachineryFailed,
    Runtime,
    Superseded,
    Suspended,
    enter,
    leave,
    task_key,
)
from shoal.workflow.states import RunStatus, WorkflowChanged

log = logging.getLogger("shoal.workflow")

WorkflowFunction = Callable[[Workflow, Any], Awaitable[Any]]

# The queue of a workflow's jobs: each job resumes one run.
QUEUE_PREFIX = "workflow."
# Runs whose code runs at once in one process. A run holds its place only
# while its code runs (a sleeping or waiting run holds none), and concurrent
# runs' checkpoints share statements and commits: at 10, 10,000 runs of three
# no-op steps took 14.8 s on the 2-core bench machine; at 50, 6.2 s.
DEFAULT_CONCURRENCY = 100
# A workflow's job fails only when the database does under the run's
# bookkeeping (a lost connection, a deadline), or its worker dies; it is then
# retried with backoff, for about an hour, before the run is left as it was.
# Then its copy in the dead-letter queue marks the run failed (shoal/workflow/abandoned.py).
DEFAULT_JOB_OPTIONS: dict[str, Any] = {
    "retry_limit": 12,
    "retry_delay": timedelta(seconds=1),
    "retry_backoff": True,
    "expire_in": timedelta(minutes=15),
    "dead_letter": DEAD_QUEUE,
}


def queue_of(name: str) -> str:
    return QUEUE_PREFIX + name


@dataclass(frozen=True, slots=True)
class WorkflowSpec:
    """A workflow as declared with ``@app.workflow``."""

    name: str
    fn: WorkflowFunction
    concurrency: int = DEFAULT_CONCURRENCY
    job_options: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_JOB_OPTIONS))

    @property
    def queue(self) -> str:
        return queue_of(self.name)


class WorkflowRunner:
    """Handles the jobs of one workflow's queue (each names the run it resumes)."""

    def __init__(self, runtime: Runtime, spec: WorkflowSpec) -> None:
        self.rt = runtime
        self.spec = spec

    async def __call__(self, job: Job) -> None:
        data = job.data
        store = self.rt.store
        now = self.rt.clock.sql_now()
        if isinstance(data, dict) and isinstance(data.get("run"), str):
            begun = await store.begin_run(data["run"], job.id, now=now)
        elif isinstance(data, dict) and isinstance(data.get("task_id"), str):
            # A batch task's completion job: the run that waits for the task.
            begun = await store.begin_waiting_run(task_key(data["task_id"]), job.id, now=now)
        else:
            raise InvalidInput(
                "data", f"a workflow job names its run as {{'run': id}}, got {data!r}"
            )
        if begun is None:
            return  # finished, cancelled, or waiting for another job: nothing to do
        run_id = begun.id
        wf = Workflow(self.rt, run_id, begun.name, begun.epoch, begun.checkpoints)
        token = enter(wf)
        try:
            value = await self.spec.fn(wf, begun.input)
        except Suspended:
            return
        except Superseded:
            log.info("workflow %s run %s: taken over by another job", wf.name, run_id)
            return
        except MachineryFailed as failed:
            raise failed.error from None  # the job fails and is retried
        except asyncio.CancelledError:
            raise
        except WorkflowChanged as exc:
            await self._finish(wf, begun.epoch, RunStatus.FAILED, None, str(exc))
            return
        except Exception as exc:
            error = "".join(traceback.format_exception(exc))
            await self._finish(wf, begun.epoch, RunStatus.FAILED, None, error)
            return
        finally:
            leave(token)
        try:
            text = encode_result(
                value, returned_by=f"workflow {wf.name!r} returned a result that cannot be stored: "
            )
        except UnstorableResult as exc:
            await self._finish(wf, begun.epoch, RunStatus.FAILED, None, str(exc))
            return
        await self._finish(wf, begun.epoch, RunStatus.COMPLETED, text, None)

    async def _finish(
        self, wf: Workflow, epoch: int, status: RunStatus, result: str | None, error: str | None
    ) -> None:
        finished = await self.rt.store.finish_run(
            wf.id, epoch, status=status, result=result, error=error, now=self.rt.clock.sql_now()
        )
        if not finished:
            log.info("workflow %s run %s: taken over before it finished", wf.name, wf.id)
