"""The names of shoal's own machinery: one definition, read by every layer and by tracing.

A leaf module (it imports no layer), so that :mod:`shoal.tracing`, which the
layers import, may use it too.
"""

from __future__ import annotations

INTERNAL_PREFIX = "shoal."
"""Queues and schedules whose names start with this are shoal's own machinery
(the batch aggregator's ``shoal.batch.aggregate``): listings, charts and traces
leave them out unless asked to show them. A user's queue should not use it."""


def is_internal(name: str) -> bool:
    """Whether the queue or schedule ``name`` is shoal's own (see :data:`INTERNAL_PREFIX`).

    >>> is_internal("shoal.batch.aggregate"), is_internal("email")
    (True, False)
    """
    return name.startswith(INTERNAL_PREFIX)


__all__ = ["INTERNAL_PREFIX", "is_internal"]
