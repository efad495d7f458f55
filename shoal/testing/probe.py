"""``Probe``: awaits what workers, the aggregator, consumers and the monitor report."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from shoal.errors import InvalidInput
from shoal.hooks import EVENT_NAMES, Event, EventName, Hooks
from shoal.queue.client import Shoal

DEFAULT_TIMEOUT_S = 30.0
"""How long a probe waits before failing the test: a failure bound, not a speed check."""
# Most events an AssertionError message lists.
SHOWN_EVENTS = 20

Predicate = Callable[[Event], bool]


@dataclass(slots=True)
class _Waiter:
    name: EventName
    matches: Predicate
    count: int
    done: asyncio.Future[list[Event]]


class Probe:
    """Records reported events; a test awaits them instead of sleeping.

    Waits *consume* the events that satisfy them, like a channel: two
    successive ``await probe.job_finished("q")`` need two jobs to finish. An
    event reported before the wait began still counts, so there is no race
    between starting work and starting to wait. Call :meth:`discard` to drop
    what was reported so far (say, the idleness of a worker at start-up).

    Attach it to a client (``probe.attach(boss)``) before starting the workers,
    pipeline consumers or monitor to observe; they report through the
    client's ``boss.hooks``.
    """

    def __init__(self, *targets: Shoal | Hooks) -> None:
        # Every event, in order. Written by the reporters, read by waits.
        self.events: list[Event] = []
        self._consumed: set[int] = set()  # indexes into events
        self._waiters: list[_Waiter] = []
        self._attached: list[Hooks] = []
        for target in targets:
            self.attach(target)

    # -- wiring ------------------------------------------------------------

    def attach(self, target: Shoal | Hooks) -> None:
        """Observe a client's hooks (or a :class:`~shoal.hooks.Hooks` registry)."""
        hooks = target.hooks if isinstance(target, Shoal) else target
        hooks.add(self.record)
        self._attached.append(hooks)

    def detach(self) -> None:
        """Stop observing everything attached."""
        for hooks in self._attached:
            hooks.remove(self.record)
        self._attached.clear()

    def record(self, event: Event) -> None:
        """The observer: keep ``event`` and wake the waits it may satisfy."""
        self.events.append(event)
        for waiter in list(self._waiters):
            if waiter.name == event.name and not waiter.done.done():
                self._try(waiter)

    def discard(self, name: EventName | None = None) -> None:
        """Consume every event reported so far (of ``name``, or all)."""
        for i, event in enumerate(self.events):
            if name is None or event.name == name:
                self._consumed.add(i)

    # -- waiting -----------------------------------------------------------

    def _try(self, waiter: _Waiter) -> bool:
        found = [
            i
            for i, event in enumerate(self.events)
            if i not in self._consumed and event.name == waiter.name and waiter.matches(event)
        ][: waiter.count]
        if len(found) < waiter.count:
            return False
        self._consumed.update(found)
        waiter.done.set_result([self.events[i] for i in found])
        return True

    async def wait_for(
        self,
        name: EventName,
        predicate: Predicate | None = None,
        *,
        queue: str | None = None,
        count: int = 1,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        **fields: Any,
    ) -> list[Event]:
        """Wait until ``count`` unconsumed ``name`` events match; return (and consume) them.

        An event matches when its ``queue`` (queue or topic) equals ``queue``
        (if given), each of ``fields`` equals the event's field of that name,
        and ``predicate(event)`` (if given) is true. Raises AssertionError
        after ``timeout_s`` of real time, listing the events that were seen.
        """
        if name not in EVENT_NAMES:
            raise InvalidInput("name", f"unknown event {name!r}; one of {', '.join(EVENT_NAMES)}")
        if count < 1:
            raise InvalidInput("count", f"must be >= 1, got {count!r}")

        def matches(event: Event) -> bool:
            if queue is not None and event.queue != queue:
                return False
            if any(event.fields.get(k, _MISSING) != v for k, v in fields.items()):
                return False
            return predicate is None or predicate(event)

        waiter = _Waiter(name, matches, count, asyncio.get_running_loop().create_future())
        if self._try(waiter):
            return waiter.done.result()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout_s):
                return await waiter.done
        except TimeoutError:
            raise AssertionError(
                self._failure(name, queue, fields, predicate, count, timeout_s)
            ) from None
        finally:
            self._waiters.remove(waiter)

    def _failure(
        self,
        name: EventName,
        queue: str | None,
        fields: Mapping[str, Any],
        predicate: Predicate | None,
        count: int,
        timeout_s: float,
    ) -> str:
        wanted = [f"queue={queue!r}"] if queue is not None else []
        wanted += [f"{k}={v!r}" for k, v in fields.items()]
        if predicate is not None:
            wanted.append(f"predicate={getattr(predicate, '__name__', repr(predicate))}")
        seen = [e for e in self.events if e.name == name]
        lines = [
            f"waited {timeout_s:g}s for {count} {name} event(s)"
            + (f" with {', '.join(wanted)}" if wanted else "")
            + f"; {len(seen)} {name} event(s) seen in all"
            + (":" if seen else " (is the probe attached to the client that does the work?)")
        ]
        for event in seen[-SHOWN_EVENTS:]:
            index = self.events.index(event)
            used = " (already consumed)" if index in self._consumed else ""
            lines.append(f"  {_describe(event)}{used}")
        return "\n".join(lines)

    # -- the events, by name -------------------------------------------------

    async def fetched(
        self, queue: str, *, count: int = 1, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> list[Event]:
        """``count`` claims by a worker of ``queue``, or fetches by a consumer of a topic.

        Empty ones count too: after ``probe.discard("fetched")``, two fetches
        show the loop looked again (the second began after the discard).
        """
        return await self.wait_for("fetched", queue=queue, count=count, timeout_s=timeout_s)

    async def job_finished(
        self,
        queue: str | None = None,
        *,
        outcome: str | None = None,
        job_id: int | None = None,
        count: int = 1,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> list[Event]:
        """``count`` recorded job outcomes (``completed``, ``failed``, ``retried``, ...)."""
        fields: dict[str, Any] = {}
        if outcome is not None:
            fields["outcome"] = outcome
        if job_id is not None:
            fields["job_id"] = job_id
        return await self.wait_for(
            "job_finished", queue=queue, count=count, timeout_s=timeout_s, **fields
        )

    async def idle(self, queue: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Event:
        """A worker of ``queue`` found it empty, with nothing running and every outcome written."""
        (event,) = await self.wait_for("worker_idle", queue=queue, timeout_s=timeout_s)
        return event

    async def aggregator_pass(
        self,
        predicate: Predicate | None = None,
        *,
        count: int = 1,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> list[Event]:
        """``count`` finished aggregator passes (``event["report"]`` is the pass's report)."""
        return await self.wait_for("aggregator_pass", predicate, count=count, timeout_s=timeout_s)

    async def message_applied(
        self,
        topic: str | None = None,
        *,
        message_id: str | None = None,
        count: int = 1,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> list[Event]:
        """``count`` messages applied (or written by a sink) and acknowledged."""
        fields: dict[str, Any] = {} if message_id is None else {"message_id": message_id}
        return await self.wait_for(
            "message_applied", queue=topic, count=count, timeout_s=timeout_s, **fields
        )

    async def message_failed(
        self,
        topic: str | None = None,
        *,
        settled: Literal["retry", "business", "dead"] | None = None,
        count: int = 1,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> list[Event]:
        """``count`` failed messages settled: redelivered later, dropped, or dead-lettered."""
        fields: dict[str, Any] = {} if settled is None else {"settled": settled}
        return await self.wait_for(
            "message_failed", queue=topic, count=count, timeout_s=timeout_s, **fields
        )

    async def monitor_sampled(
        self, topic: str | None = None, *, count: int = 1, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> list[Event]:
        """``count`` backlog samples (``event["reading"]`` is the reading)."""
        return await self.wait_for("monitor_sampled", queue=topic, count=count, timeout_s=timeout_s)


_MISSING = object()


def _describe(event: Event) -> str:
    details = ", ".join(f"{k}={v!r}" for k, v in event.fields.items())
    where = f"[{event.queue}]" if event.queue is not None else ""
    return f"{event.name}{where}({details})"
