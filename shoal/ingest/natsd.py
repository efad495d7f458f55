"""Moved in 0.2.0 to :mod:`shoal.testing.nats_server`: ``shoal.testing.NatsServer``
and ``shoal.testing.NatsCluster``, development servers rather than part of the
ingest layer. The old names still work here, with a DeprecationWarning.
"""

from typing import Any

from shoal._deprecation import moved_attribute

_MOVED = {
    "NatsCluster": "shoal.testing",
    "NatsServer": "shoal.testing",
    "START_TIMEOUT_S": "shoal.testing.nats_server",
    "nats_server_binary": "shoal.testing.nats_server",
}


def __getattr__(name: str) -> Any:
    return moved_attribute(__name__, name, _MOVED)
