"""The App of the worker process whose metrics and JSON logs tests/test_observe_processes.py reads.

Queues:

- ``obs_ok`` completes at once;
- ``obs_fail`` always raises (send it with ``retry_limit=1``: one retry, then failed);
- ``obs_snooze`` snoozes its first run (a snooze costs no attempt), then completes.
"""

from __future__ import annotations

from datetime import timedelta

from shoal import Job, Snooze
from shoal.app import App

app = App()
# Jobs of obs_snooze that were snoozed once (one process runs them all).
_snoozed: set[int] = set()


@app.handler("obs_ok", concurrency=5)
async def ok(job: Job) -> None:
    return None


@app.handler("obs_fail", concurrency=1)
async def fail(job: Job) -> None:
    raise RuntimeError(f"obs_fail attempt {job.attempt}")


@app.handler("obs_snooze", concurrency=1)
async def snooze(job: Job) -> None:
    if job.id not in _snoozed:
        _snoozed.add(job.id)
        raise Snooze(timedelta(0))
