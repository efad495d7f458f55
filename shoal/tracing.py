"""OpenTelemetry tracing: a span per job run, child of the span that sent the job.

Tracing is on once :func:`instrument` is called, or on its own when the
OpenTelemetry API is imported and the application has set a real
``TracerProvider`` (``opentelemetry.trace.set_tracer_provider``). Install the
extra with ``pip install 'shoal[otel]'`` (the API and the SDK).

What it does while on:

- ``send``, ``insert`` and ``insert_many`` called inside a span put that
  span's context (W3C ``traceparent``, by the global propagator) into each
  job whose payload is a JSON object, under the reserved key
  ``"_shoal_trace"``. Jobs carry no other place for it, so the key is part of
  the stored payload (the API shows it); ``job.data`` never shows it to a
  handler. Payloads that are not objects travel without a context.
- Each run of a handler by a worker started while tracing is on is a
  ``process <queue>`` span (kind CONSUMER) whose parent is the sender's span
  (a root span when the job carried no context), with the attributes
  ``messaging.system`` (shoal), ``messaging.destination.name`` and
  ``shoal.queue`` (the queue), ``shoal.job.id``, ``shoal.job.attempt`` and
  ``shoal.job.outcome`` (completed, retried, failed, snoozed, cancelled, or
  interrupted when the worker's shutdown or the job's ``expire_in`` cut it
  off). A run that raised records the exception and an error status. Batch
  items run as jobs of their kind's queue, so each item run is such a span.
  Jobs of shoal's own queues (names starting ``shoal.``,
  :func:`~shoal.internal.is_internal`) run without a span unless
  ``instrument(internal_queues=True)`` asked for them.
  The worker opens it where it calls the handler (``Worker._call``), so
  ``shoal.testing.drain``'s runs are spans too.
- A workflow run started inside a span (``Workflows.start``, ``start_many``,
  a child run from its parent's step) carries that span's context in the
  data of its first job, so the job's ``process workflow.<name>`` span is
  its child; the jobs that resume a run later are children of the job that
  suspended it, as any job sent from a handler is.
- Each attempt of a workflow's step (``wf.step``, an ``@app.step`` call) is
  a ``step <workflow> <step>`` span (kind INTERNAL), child of the span of
  the job that replays the run, with ``shoal.workflow``,
  ``shoal.workflow.run_id``, ``shoal.workflow.step.seq``,
  ``shoal.workflow.step.name``, ``shoal.workflow.step.attempt`` and
  ``shoal.workflow.step.outcome`` (completed, retried, failed, or
  interrupted when the job was cut off). A failed or retried attempt records
  the exception and an error status. A step a replay returns from its
  checkpoint runs nothing and has no span.
- Each ``apply`` of an ingest consumer of an :class:`~shoal.app.App` run by
  ``shoal worker`` is an ``apply <topic>`` span with ``shoal.topic``,
  ``shoal.message.id`` and ``shoal.message.attempt``.

While off, nothing is added to a job's run, and a send pays one look-up.
A worker decides when it starts: turn tracing on before starting workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from shoal.errors import Cancel, MissingExtra, PermanentError, Snooze
from shoal.internal import is_internal

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

    from shoal.ingest.consumer import Apply
    from shoal.queue.job import Handler, Job

TRACE_KEY = "_shoal_trace"
"""The reserved payload key that carries a job's trace context."""

TRACER_NAME = "shoal"

# Set by instrument(): the tracer to use whatever the global provider is.
_tracer: Tracer | None = None
# The tracer of the global provider last seen, with that provider.
_auto: tuple[object, Tracer] | None = None
# Set by instrument(): whether runs of shoal's own queues get spans too.
_internal_queues = False


def instrument(tracer_provider: Any = None, *, internal_queues: bool = False) -> None:
    """Turn tracing on, with ``tracer_provider`` (default: the global one).

    Runs of shoal's own queues (names starting ``shoal.``) get no span unless
    ``internal_queues``: they would be a root span each, every second.

    >>> tracing.instrument(provider, internal_queues=True)  # doctest: +SKIP
    """
    global _tracer, _internal_queues
    try:
        from opentelemetry import trace
    except ImportError:
        raise MissingExtra("tracing", "otel") from None
    _tracer = trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider)
    _internal_queues = internal_queues


def uninstrument() -> None:
    """Undo :func:`instrument` (a global provider that is set still turns tracing on)."""
    global _tracer, _internal_queues
    _tracer = None
    _internal_queues = False


def tracer() -> Tracer | None:
    """The tracer to use now, or None while tracing is off."""
    global _auto
    if _tracer is not None:
        return _tracer
    # Nobody can have set a provider without importing the API: no import here.
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    if _auto is None or _auto[0] is not provider:
        _auto = (provider, provider.get_tracer(TRACER_NAME))
    return _auto[1]


def carrier() -> dict[str, str] | None:
    """The current span's context as propagation headers, or None (off, or no span)."""
    if tracer() is None:
        return None
    from opentelemetry import propagate, trace

    if not trace.get_current_span().get_span_context().is_valid:
        return None
    headers: dict[str, str] = {}
    propagate.inject(headers)
    return headers or None


def with_carrier(data: object, headers: Mapping[str, str] | None) -> object:
    """``data`` carrying ``headers`` under :data:`TRACE_KEY` when it is a JSON object."""
    if headers is None or not isinstance(data, dict):
        return data
    return {**data, TRACE_KEY: dict(headers)}


def traced_handler(queue: str, handler: Handler) -> Handler:
    """``handler`` run inside a span per run while tracing is on; itself while off,
    and for shoal's own queues unless ``instrument(internal_queues=True)``."""
    active = tracer()
    if active is None or (is_internal(queue) and not _internal_queues):
        return handler
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind, Status, StatusCode

    name = f"process {queue}"

    async def traced(job: Job) -> Any:
        job.data  # noqa: B018 - parses the payload, taking its trace context out
        headers = job.trace_headers
        parent = propagate.extract(headers) if headers else None
        attributes: dict[str, str | int] = {
            "messaging.system": "shoal",
            "messaging.destination.name": queue,
            "shoal.queue": queue,
            "shoal.job.id": job.id,
            "shoal.job.attempt": job.attempt,
        }
        with active.start_as_current_span(
            name,
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                result = await handler(job)
            except asyncio.CancelledError:
                span.set_attribute("shoal.job.outcome", "interrupted")
                raise
            except Exception as exc:
                span.set_attribute("shoal.job.outcome", _outcome(job, exc))
                if not isinstance(exc, Snooze):
                    span.record_exception(exc)
                    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                raise
            span.set_attribute("shoal.job.outcome", "completed")
            return result

    return traced


def _outcome(job: Job, error: Exception) -> str:
    if isinstance(error, Snooze):
        return "snoozed"
    if isinstance(error, Cancel):
        return "cancelled"
    if isinstance(error, PermanentError) or job.is_last_attempt:
        return "failed"
    return "retried"


class StepSpan:
    """The span of one attempt of a workflow's step; a no-op while tracing is off."""

    __slots__ = ("_span", "ended")

    def __init__(self, span: Any = None) -> None:
        self._span = span
        # Set by end(): the context manager marks an attempt that never said how it ended.
        self.ended = False

    def end(self, outcome: str, error: BaseException | None = None) -> None:
        """Say how the attempt ended (and with which exception, when it raised)."""
        self.ended = True
        span = self._span
        if span is None:
            return
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute("shoal.workflow.step.outcome", outcome)
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))


@contextlib.contextmanager
def step_span(workflow: str, run_id: str, seq: int, name: str, attempt: int) -> Iterator[StepSpan]:
    """A ``step <workflow> <name>`` span around one attempt of a step while tracing is on."""
    active = tracer()
    if active is None:
        yield StepSpan()
        return
    from opentelemetry.trace import SpanKind

    attributes: dict[str, str | int] = {
        "shoal.workflow": workflow,
        "shoal.workflow.run_id": run_id,
        "shoal.workflow.step.seq": seq,
        "shoal.workflow.step.name": name,
        "shoal.workflow.step.attempt": attempt,
    }
    with active.start_as_current_span(
        f"step {workflow} {name}",
        kind=SpanKind.INTERNAL,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        traced = StepSpan(span)
        try:
            yield traced
        except BaseException:
            if not traced.ended:  # cancelled, or the run was taken over, mid-attempt
                span.set_attribute("shoal.workflow.step.outcome", "interrupted")
            raise


def traced_apply(topic: str, apply: Apply[Any]) -> Apply[Any]:
    """An ingest ``apply`` inside a span per message while tracing is on; itself while off."""
    active = tracer()
    if active is None:
        return apply
    from opentelemetry.trace import SpanKind

    name = f"apply {topic}"

    async def traced(message: Any) -> None:
        attributes = {
            "messaging.system": "shoal",
            "messaging.destination.name": topic,
            "shoal.topic": topic,
            "shoal.message.id": message.id,
            "shoal.message.attempt": message.attempt,
        }
        with active.start_as_current_span(name, kind=SpanKind.CONSUMER, attributes=attributes):
            await apply(message)

    return traced


__all__ = [
    "TRACE_KEY",
    "StepSpan",
    "carrier",
    "instrument",
    "step_span",
    "traced_apply",
    "traced_handler",
    "tracer",
    "uninstrument",
    "with_carrier",
]
