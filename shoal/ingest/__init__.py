"""Ingest pipelines: topics, fixed-concurrency consumers, de-duplication, batch sinks.

The layer that splits "call the slow thing" from "write the database"
(docs/ingest.md). A topic is an at-least-once stream carried by
a :class:`~shoal.ingest.transport.Transport`: ``postgres`` (the queue tables,
the default) or ``nats`` (NATS JetStream with file storage).

The names applications use are exported by ``shoal`` (``Pipeline``,
``Message``, ``Topic``...) and, for those who build their own sinks,
transports and checks, by this package (``__all__`` below).
"""

import typing as _typing

from shoal._deprecation import moved_attribute as _moved_attribute

if _typing.TYPE_CHECKING:
    from shoal.ingest.config import RuntimeConfig
    from shoal.ingest.guard import newer_than_applied
    from shoal.ingest.nats import NatsTransport, UnsafeDurability
    from shoal.ingest.pipeline import check_connection_budget
    from shoal.ingest.postgres import PostgresTransport
    from shoal.ingest.retry import is_retryable
    from shoal.ingest.spool import SpoolStats
    from shoal.ingest.store import IngestStore
    from shoal.ingest.transport import Transport

# The names an application builds on beyond those ``shoal`` exports, each
# imported on first use from the module that defines it: the nats ones need
# the nats extra, and importing this package must not import the layer.
_LAZY = {
    "IngestStore": "shoal.ingest.store",
    "NatsTransport": "shoal.ingest.nats",
    "PostgresTransport": "shoal.ingest.postgres",
    "RuntimeConfig": "shoal.ingest.config",
    "SpoolStats": "shoal.ingest.spool",
    "Transport": "shoal.ingest.transport",
    "UnsafeDurability": "shoal.ingest.nats",
    "check_connection_budget": "shoal.ingest.pipeline",
    "is_retryable": "shoal.ingest.retry",
    "newer_than_applied": "shoal.ingest.guard",
}
_NEEDS_NATS = {"NatsTransport", "UnsafeDurability"}
# Development servers, moved to shoal.testing in 0.2.0 (deprecated here).
_MOVED = {"NatsCluster": "shoal.testing", "NatsServer": "shoal.testing"}


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is None:
        return _moved_attribute(__name__, name, _MOVED)
    import importlib

    if name in _NEEDS_NATS:
        from shoal.extras import require

        require("nats", f"shoal.ingest.{name}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "IngestStore",
    "NatsTransport",
    "PostgresTransport",
    "RuntimeConfig",
    "SpoolStats",
    "Transport",
    "UnsafeDurability",
    "check_connection_budget",
    "is_retryable",
    "newer_than_applied",
]
