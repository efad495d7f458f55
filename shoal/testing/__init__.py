"""Helpers for testing code built on shoal: await what happens, never sleep for it.

Three kinds of help, usable from any async test framework:

- :class:`Probe` records what workers, the aggregator, ingest consumers and
  the backlog monitor report (``shoal.hooks``) and lets a test await it:
  ``await probe.job_finished("email")``. A wait that is not satisfied within
  its timeout (30 s by default: a bound on failure, not a speed check) fails
  the test with an :class:`AssertionError` that lists what did happen.
- Inline runs: :func:`run_job` and :func:`run_item` call a handler with a
  built job or item and report what the worker would have made of it;
  :func:`drain` runs every available job of a queue through its handler in
  the calling task, against the real database.
- Assertions on what was enqueued: :func:`assert_enqueued` and
  :func:`refute_enqueued`.
- pytest fixtures, in the plugin :mod:`shoal.testing.pytest_plugin` (turned
  on by ``pytest_plugins = ["shoal.testing.pytest_plugin"]`` in a
  conftest.py; not imported here, so this package needs no pytest): a fresh
  migrated database per test from ``DATABASE_URL``, a ``FakeClock`` and a
  client on both.
- Servers to run, kill and restart: :class:`NatsServer`, a nats-server of the
  test's own, and :class:`NatsCluster`, three of them clustered (the binary
  comes with the ``nats`` extra; a missing one is :class:`shoal.MissingExtra`).

Time is the test's own: build the client with a :class:`shoal.FakeClock`
and move it with ``clock.advance(...)``; leases, expiry, backoff, heartbeats,
cron, the aggregator's reaper, the ingest redelivery ladder and the monitor
all read it.

>>> probe = Probe()
>>> probe.attach(boss)                                   # doctest: +SKIP
>>> await boss.send("email", {"to": "a@example.com"})    # doctest: +SKIP
>>> await probe.job_finished("email", outcome="completed")  # doctest: +SKIP
"""

from shoal.hooks import Event
from shoal.testing.enqueued import assert_enqueued, refute_enqueued
from shoal.testing.inline import DrainResult, ItemRun, JobRun, drain, run_item, run_job
from shoal.testing.nats_server import NatsCluster, NatsServer
from shoal.testing.probe import DEFAULT_TIMEOUT_S, Probe

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "DrainResult",
    "Event",
    "ItemRun",
    "JobRun",
    "NatsCluster",
    "NatsServer",
    "Probe",
    "assert_enqueued",
    "drain",
    "refute_enqueued",
    "run_item",
    "run_job",
]
