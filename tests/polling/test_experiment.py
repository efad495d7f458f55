"""``shoal-polling experiment`` at a small scale: the three runs, each reconciled.

The pool is made too small for the polls in flight, as in the reference, so
the sync run meets write timeouts; what the reference lost there, shoal hands
to the topic. The async run's writes wait on the topic instead of the pool.
The switch run changes mode mid-run and kills the ingest worker and
nats-server with SIGKILL. Every run must end with nothing missing or doubled.
"""

from __future__ import annotations

import pytest

from shoal_polling.experiment import ExperimentSettings, run_experiment

pytestmark = pytest.mark.slow

SMALL = ExperimentSettings(
    duration_s=4.0,
    accounts=2,
    cards_per_account=6,
    # Three connections for the app's pool: the sync polls (about 30 a second,
    # each holding one for 100 ms) need more than that. The experiment's own
    # set-up and reconciliation run on a pool of their own, at normal deadlines.
    pool_size=3,
    consumers=1,
    reserve=1,
    other_load=1,
    deadline_s=0.3,
    latency_ms=20.0,
    latency_sigma=0.3,
    latency_range_ms=(5.0, 60.0),
    step_interval_s=0.5,
    apply_cost_ms=100.0,
    drain_timeout_s=90.0,
)


async def test_sync_async_and_switch_runs_each_reconcile_with_nothing_missing_or_doubled(
    pg_server: str,
) -> None:
    sync, async_, switch = await run_experiment(pg_server, SMALL)

    # Sync: the reference's symptom (writes that found no connection in time) ...
    assert sync.run == "sync"
    assert sync.sql_timeouts > 0
    assert sync.slow_statements > 0
    assert sync.pool_wait_p99_ms >= 100
    # ... without its loss: every failed write went to the topic and was applied.
    assert sync.handed_off == sync.sql_timeouts
    assert sync.not_applied == 0

    # Async: no write waits on the pool; the backlog takes the overload.
    assert async_.sql_timeouts == 0
    assert async_.max_backlog > 0
    assert async_.lag_p99_ms > 0

    # Switch: the mode changed mid-run, the worker and nats-server were killed and came back.
    assert switch.transport == "nats"
    events = "\n".join(switch.events)
    assert "mode set to async" in events
    assert "ingest worker" in events and "killed (SIGKILL)" in events
    assert "nats-server killed (SIGKILL)" in events
    assert "nats-server started again" in events

    for run in (sync, async_, switch):
        assert run.served > 0, run
        assert run.reconciled, (run.run, run.reconciliation(), run.events)
        assert run.reconciliation() == "complete"
        assert (run.lost, run.records_missing, run.doubled) == (0, 0, 0)
