"""History for the console's charts: samples of every queue every 10 s and 5 min.

The console reads them (shoal.console.history); this module writes them.

One sample is taken per interval in the whole cluster, whatever the number of
processes: ``shoal worker`` runs the :class:`HistorySampler` in the leader of
:data:`HISTORY_DUTY` (shoal.db.leadership; a process that takes maintenance
contends for it), and a sample is written only when the latest one is older
than the current slot, each row once (``ON CONFLICT DO NOTHING``), so
samplers that race write one sample. A sample per queue, plus one for all
queues but shoal's own (queue ``*``, what the console charts by default; see
:func:`~shoal.internal.is_internal`) and one for every queue (``**``), holds:

- ``completed``, ``failed``: jobs that finished in the interval (past
  ``FINISHED_CAP`` of them, estimated from the latest ``FINISHED_CAP``);
- ``waiting``, ``retrying``: jobs created, retry at the sample (a queue's
  created and retry jobs together estimated past ``DEPTH_CAP``);
- ``running``: the jobs the live worker processes run, as each reported at its
  last heartbeat (:mod:`shoal.queue.registry`; at most ``HEARTBEAT_S`` old).
  Counting them in the job table checked each finished job's entry of the
  lease index once more: about 0.25 us a job, 48 ms of a 90 ms sample
  during a drain of 20,000 jobs/s, a share of the server's work per job that
  a longer interval does not shrink;
- ``run_p50_s``/``run_p95_s`` (start to finish) and ``wait_p50_s``/``wait_p95_s``
  (created to start of the last attempt) of the jobs that finished in the
  interval (past ``FINISHED_CAP``, of the latest ``FINISHED_CAP``), computed in
  the database from the job rows, not from any one process's memory.

Retention: 10 s samples for 24 hours, 5 min samples for 30 days.
"""

from __future__ import annotations

import logging

from shoal.errors import TransientError
from shoal.queue.client import Shoal
from shoal.queue.history_store import HistoryStore
from shoal.queue.registry import GONE_S

log = logging.getLogger("shoal.history")

# The duty a worker process leads to run the sampler (shoal.db.leadership).
HISTORY_DUTY = "queue.history"

FINE_S = 10
COARSE_S = 300
# How long each resolution is kept.
RETENTION_S = {FINE_S: 24 * 3600, COARSE_S: 30 * 86400}
# A sample reads at most this many of the jobs that finished in its interval
# (the latest); past it, its counts are scaled from them (history.sql, sample).
# Each read job costs the sample about 5 µs (docs/benchmarks.md).
FINISHED_CAP = 1_000
# A queue's created and retry jobs are counted up to this many; past it they
# are estimated from the ids of the first ones (history.sql, claimable). Each
# is about 2 µs of every sample, per queue: 1,000 cost 25 ms with 13 queues.
DEPTH_CAP = 200


class HistorySampler:
    """Writes samples into the history table; see the module docstring."""

    def __init__(self, boss: Shoal) -> None:
        self.boss = boss
        self.clock = boss.clock
        self.store = HistoryStore(boss.db)
        self.finished_cap = FINISHED_CAP
        self.depth_cap = DEPTH_CAP

    async def sample_once(self) -> dict[int, int]:
        """Take the due samples (10 s and 5 min) and prune old ones; rows written
        per resolution (0 when the slot's sample exists, or another sampler wrote it)."""
        return await self.store.sample_history(
            retention_s=RETENTION_S,
            finished_cap=self.finished_cap,
            depth_cap=self.depth_cap,
            gone_s=GONE_S,
            now=self.clock.sql_now(),
        )

    async def run(self) -> None:
        """Sample every 10 s until cancelled."""
        while True:
            try:
                await self.sample_once()
            except TransientError as exc:
                log.warning("history sample failed: %s", exc)
            except Exception:  # loop boundary: the sampler must keep running
                log.exception("history sample failed")
            now = self.clock.now().timestamp()
            await self.clock.sleep(FINE_S - now % FINE_S + 0.05)


__all__ = [
    "COARSE_S",
    "DEPTH_CAP",
    "FINE_S",
    "FINISHED_CAP",
    "HISTORY_DUTY",
    "RETENTION_S",
    "HistorySampler",
]
