"""Hooks: what the running parts of shoal report as they work.

A :class:`Hooks` registry is handed to every long-running part (each
``Shoal`` client owns one as ``boss.hooks``; workers, the aggregator, ingest
consumers and the backlog monitor built from that client report to it).
Observers are plain callables that take an :class:`Event`. With none
registered, reporting costs one truth test on the hot path.

Observers run inline, in the reporting task, so they must be quick and must
not raise (an observer's exception is logged and dropped: a broken observer
never breaks a worker). ``shoal.testing.Probe`` is the observer tests use to
await these events instead of sleeping.

>>> hooks = Hooks()
>>> seen = []
>>> hooks.add(seen.append)
>>> hooks.emit("job_finished", queue="email", job_id=7, outcome="completed")
>>> seen[0].name, seen[0].queue, seen[0].fields["outcome"]
('job_finished', 'email', 'completed')
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

log = logging.getLogger("shoal.hooks")

EventName = Literal[
    "fetched",
    "job_ran",
    "job_finished",
    "item_finished",
    "worker_idle",
    "aggregator_pass",
    "message_applied",
    "message_duplicate",
    "message_failed",
    "monitor_sampled",
    "step_finished",
]
"""What can be reported, and by whom:

- ``fetched``: a worker's claim, or an ingest consumer's fetch, returned
  (``queue``: the queue or topic; ``count`` jobs or messages, maybe 0);
- ``job_ran``: a worker's handler returned or raised, before the outcome is
  written (``queue``, ``job_id``, ``attempt``, ``run_s``: seconds the handler
  ran on the worker's clock, ``created_at`` and ``started_at``: the job row's
  enqueue and claim times);
- ``job_finished``: a worker recorded one job's outcome (``queue``,
  ``job_id``, ``outcome``: completed, failed, retried, snoozed, released (handed
  back at shutdown), cancelled, or lost when its fence had moved on);
- ``item_finished``: a batch item's run ended (``queue``: the kind's queue,
  ``kind``, ``item_id``, ``outcome``: completed, error, retried, released,
  phantom (a delivery for an item already running or finished), skipped_cancelled
  (a delivery for an item of a stopped task), superseded (a buffered item
  taken from this worker before it started), or lost);
- ``worker_idle``: a worker found its queue empty with nothing running and
  every outcome written (``queue``);
- ``aggregator_pass``: the batch aggregator finished a pass (``report``);
- ``message_applied``: an ingest consumer applied and acknowledged a message
  (``topic``, ``message_id``, ``attempt``: 1 on its first delivery);
- ``message_duplicate``: an ingest consumer acknowledged a delivery whose
  message was already applied, without applying it (``topic``, ``message_id``);
- ``message_failed``: an ingest consumer settled a failed message (``topic``,
  ``message_id``, ``settled``: retry, business or dead);
- ``monitor_sampled``: the backlog monitor recorded one topic's depth
  (``topic``, ``reading``);
- ``step_finished``: an attempt of a workflow's step ended (``queue``: the
  workflow's queue, ``workflow``, ``run_id``, ``seq``, ``step``: its name,
  ``attempt``, ``outcome``: completed, retried (another attempt follows,
  now or after its delay) or failed (its attempts spent, or a
  ``PermanentError``)). A replay that returns a checkpoint reports nothing.
"""

EVENT_NAMES: tuple[EventName, ...] = (
    "aggregator_pass",
    "fetched",
    "item_finished",
    "job_finished",
    "job_ran",
    "message_applied",
    "message_duplicate",
    "message_failed",
    "monitor_sampled",
    "step_finished",
    "worker_idle",
)


@dataclass(frozen=True, slots=True)
class Event:
    """One report: its name, the queue or topic it concerns (if any), and details."""

    name: EventName
    queue: str | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]


Observer = Callable[[Event], None]


class Hooks:
    """A registry of observers; ``bool(hooks)`` is False while it has none."""

    __slots__ = ("_observers",)

    def __init__(self) -> None:
        # Written by add/remove (test or application code), read by emit.
        self._observers: tuple[Observer, ...] = ()

    def add(self, observer: Observer) -> None:
        """Call ``observer(event)`` for every event from now on."""
        self._observers = (*self._observers, observer)

    def remove(self, observer: Observer) -> None:
        """Stop calling ``observer``; a no-op when it was not registered."""
        self._observers = tuple(o for o in self._observers if o != observer)

    def __bool__(self) -> bool:
        return bool(self._observers)

    def emit(self, name: EventName, queue: str | None = None, **fields: Any) -> None:
        """Report ``name`` to every observer. Callers test ``if hooks:`` first on hot paths."""
        if not self._observers:
            return
        event = Event(name, queue, fields)
        for observer in self._observers:
            try:
                observer(event)
            except Exception:  # loop boundary: an observer never breaks the reporter
                log.exception("hook observer %r failed on %s", observer, name)
