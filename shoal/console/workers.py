"""The console's workers: each registered process, and what it runs now.

What ``shoal api``'s worker routes call. A worker's running work is its
active jobs (each job records the process that claimed it) and its running
batch items (each item records the process its guard passed it to), oldest
first, at most ``limit`` of each kind: a process runs no more than its
concurrency, but a page must not grow with a runaway one. An unknown worker
is :class:`~shoal.errors.NotFound` naming the field; nothing is written.
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal.console.store import ConsoleStore, RunningWork
from shoal.errors import InvalidInput, NotFound
from shoal.queue.registry import WorkerRegistry
from shoal.queue.rows import WorkerInfo

MAX_RUNNING = 500
DEFAULT_RUNNING = 100
# Characters of a payload's JSON shown beside each running job or item: the
# row's hint of what it works on; the job's page has the whole payload.
PREVIEW_CHARS = 120


@dataclass(frozen=True, slots=True)
class WorkerDetail:
    worker: WorkerInfo
    running: list[RunningWork]
    # More than ``limit`` jobs or items were running: the list was cut.
    truncated: bool


class WorkerInspector:
    def __init__(self, registry: WorkerRegistry) -> None:
        self.registry = registry
        self.console = ConsoleStore(registry.boss.db)

    async def worker(self, worker_id: str, *, limit: int = DEFAULT_RUNNING) -> WorkerDetail:
        """Worker ``worker_id`` (live or gone) with the jobs and items it runs now."""
        if not 1 <= limit <= MAX_RUNNING:
            raise InvalidInput("limit", f"must be 1 to {MAX_RUNNING}, got {limit}")
        workers = await self.registry.workers()
        found = next((w for w in workers if w.id == worker_id), None)
        if found is None:
            live = sum(1 for w in workers if not w.gone)
            raise NotFound(
                f"no worker {worker_id!r:.80} (it stopped, or was never registered); "
                f"{live} live worker(s) on the Workers page",
                field="worker_id",
            )
        rows = await self.console.worker_running(worker_id, limit=limit + 1, preview=PREVIEW_CHARS)
        jobs = [r for r in rows if r.what == "job"]
        items = [r for r in rows if r.what == "item"]
        truncated = len(jobs) > limit or len(items) > limit
        running = sorted(jobs[:limit] + items[:limit], key=lambda r: (r.started_at, r.id))
        return WorkerDetail(found, running[:limit], truncated or len(running) > limit)


__all__ = ["DEFAULT_RUNNING", "MAX_RUNNING", "WorkerDetail", "WorkerInspector"]
