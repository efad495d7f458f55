"""What the server must guarantee, and how shoal checks it.

A publish counts only once the server's PubAck has arrived, and JetStream
sends the PubAck after writing the message to its file store, not after
fsync. By default the store fsyncs every two minutes (``sync_interval: 2m``),
so a machine crash or power loss can lose two minutes of acknowledged
messages. shoal therefore requires every server to run with::

    jetstream { sync_interval: always }

A smaller interval only shrinks the window: whatever was acknowledged in the
last interval is still gone after a power cut, and a single-replica stream has
no other copy. ``always`` is the only setting under which an acknowledged
message survives a machine crash. (A killed server process alone loses
nothing: what it wrote is in the operating system's page cache.)

:func:`check_durability` (run by :meth:`NatsTransport.start`) reads the
setting from the server's monitoring endpoint: ``GET <monitor_url>/varz``,
field ``jetstream.config.sync_always``, which nats-server 2.15 reports as
``true`` under ``sync_interval: always`` and leaves out otherwise
(``jetstream.config.sync_interval`` then holds the interval in nanoseconds).
When it is not ``true``, it raises :class:`UnsafeDurability`, unless
``allow_unsafe_sync=True``, which logs an ERROR and goes on. Without a
``monitor_url`` nothing can be checked, and it logs a WARNING saying so.
Only the server behind ``monitor_url`` is checked; in a cluster every server
must be configured the same. A stream set to ``persist_mode: async``
(ADR-56) acknowledges before writing whatever the server's setting, and is
refused the same way (:mod:`shoal.ingest.nats.streams`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.request
from datetime import timedelta
from typing import Any

from shoal.errors import ShoalError, TransientError

log = logging.getLogger("shoal.ingest.nats")


class UnsafeDurability(ShoalError):
    """The NATS server may lose acknowledged messages in a crash.

    Raised by :meth:`NatsTransport.start` when the server does not run with
    ``jetstream { sync_interval: always }`` (or has no JetStream at all).
    """


def is_sync_always(varz: dict[str, Any]) -> bool:
    """Whether a server's ``/varz`` says JetStream fsyncs every write."""
    config = (varz.get("jetstream") or {}).get("config") or {}
    return config.get("sync_always") is True


def describe_sync(varz: dict[str, Any]) -> str:
    """The sync setting as an operator would write it, for error messages."""
    jetstream = varz.get("jetstream") or {}
    config = jetstream.get("config")
    if not config:
        return "JetStream not enabled"
    if config.get("sync_always") is True:
        return "sync_interval: always"
    interval_ns = config.get("sync_interval")
    if isinstance(interval_ns, int):
        return f"sync_interval: {timedelta(microseconds=interval_ns / 1000)}"
    return "sync_interval: unknown"


async def check_durability(
    monitor_url: str | None, *, allow_unsafe_sync: bool, timeout_s: float
) -> None:
    """Refuse (:class:`UnsafeDurability`) a server that may lose acknowledged messages.

    :class:`~shoal.errors.TransientError` when ``/varz`` cannot be read.
    """
    if monitor_url is None:
        log.warning(
            "nats: durability not verified: no monitor_url given, so shoal cannot check "
            "that the server runs with 'jetstream { sync_interval: always }'; without it "
            "a machine crash can lose acknowledged messages"
        )
        return
    url = f"{monitor_url}/varz"
    try:
        varz = await asyncio.to_thread(_get_json, url, timeout_s)
    except (OSError, ValueError) as exc:
        raise TransientError(f"nats: cannot read {url} to check durability: {exc}") from exc
    if is_sync_always(varz):
        return
    message = (
        f"nats server at {monitor_url} reports '{describe_sync(varz)}' "
        "(/varz jetstream.config.sync_always is not true): a machine crash or power loss "
        "can lose acknowledged messages. Set 'jetstream { sync_interval: always }' in the "
        "server config"
    )
    if not allow_unsafe_sync:
        raise UnsafeDurability(message + ", or pass allow_unsafe_sync=True to accept the risk")
    log.error("%s; going on because allow_unsafe_sync=True", message)


def _get_json(url: str, timeout_s: float) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        doc = json.loads(response.read())
    if not isinstance(doc, dict):
        raise ValueError(f"{url}: not a JSON object")
    return doc
