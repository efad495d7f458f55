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
setting from each server's monitoring endpoint: ``GET <monitor_url>/varz``,
field ``jetstream.config.sync_always``, which nats-server 2.15 reports as
``true`` under ``sync_interval: always`` and leaves out otherwise
(``jetstream.config.sync_interval`` then holds the interval in nanoseconds).
When it is not ``true``, it raises :class:`UnsafeDurability`, unless
``allow_unsafe_sync=True``, which logs an ERROR and goes on. Without a
``monitor_url`` nothing can be checked, and it logs a WARNING saying so.
A stream set to ``persist_mode: async`` (ADR-56) acknowledges before writing
whatever the server's setting, and is refused the same way
(:mod:`shoal.ingest.nats.streams`).

In a cluster, give every member's monitoring URL: each one that answers is
checked (a member down at start-up is a WARNING, so a worker starts while the
cluster runs degraded; none answering is a
:class:`~shoal.errors.TransientError`). The same ``/varz`` names the cluster
(``jetstream.meta.cluster_size``, absent on a server outside a cluster), and
the stream ``replicas`` shoal creates must fit in it: more replicas than
servers is :class:`~shoal.errors.InvalidInput` naming ``replicas`` (JetStream
would refuse every stream with "insufficient resources"); one replica in a
cluster of three or more, or an even number, is a WARNING, since a single
replica dies with its server and two replicas stop taking writes when either
one is lost (a quorum of 2 needs both).
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.request
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from shoal.errors import InvalidInput, ShoalError, TransientError

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


def cluster_size(varz: dict[str, Any]) -> int:
    """How many servers a server's JetStream cluster has (1 outside a cluster)."""
    meta = (varz.get("jetstream") or {}).get("meta") or {}
    size = meta.get("cluster_size")
    return size if isinstance(size, int) and size > 0 else 1


async def check_durability(
    monitor_urls: Sequence[str],
    *,
    allow_unsafe_sync: bool,
    timeout_s: float,
    replicas: int = 1,
) -> None:
    """Refuse servers that may lose acknowledged messages, and replicas the cluster cannot hold.

    :class:`UnsafeDurability` for a server without ``sync_interval: always``;
    :class:`~shoal.errors.InvalidInput` naming ``replicas`` when there are
    more replicas than servers; :class:`~shoal.errors.TransientError` when no
    ``/varz`` can be read.
    """
    if not monitor_urls:
        log.warning(
            "nats: durability not verified: no monitor_url given, so shoal cannot check "
            "that the server runs with 'jetstream { sync_interval: always }'; without it "
            "a machine crash can lose acknowledged messages"
        )
        return
    answers: dict[str, dict[str, Any]] = {}
    failures: list[str] = []
    for monitor_url in monitor_urls:
        url = f"{monitor_url}/varz"
        try:
            answers[monitor_url] = await asyncio.to_thread(_get_json, url, timeout_s)
        except (OSError, ValueError) as exc:
            failures.append(f"{url}: {exc}")
    if not answers:
        raise TransientError(f"nats: cannot read /varz to check durability: {'; '.join(failures)}")
    for failure in failures:
        log.warning(
            "nats: cannot read %s: that server's sync_interval is not checked; "
            "every server of a cluster must run with 'jetstream { sync_interval: always }'",
            failure,
        )
    for monitor_url, varz in answers.items():
        _check_sync(monitor_url, varz, allow_unsafe_sync=allow_unsafe_sync)
    _check_replicas(replicas, max(cluster_size(varz) for varz in answers.values()), answers)


def _check_sync(monitor_url: str, varz: dict[str, Any], *, allow_unsafe_sync: bool) -> None:
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


def _check_replicas(replicas: int, size: int, answers: dict[str, dict[str, Any]]) -> None:
    where = ", ".join(answers)
    if replicas > size:
        raise InvalidInput(
            "replicas",
            f"{replicas}: the nats server at {where} is in a JetStream cluster of {size} "
            f"server{'s' if size != 1 else ''}, and a stream cannot have more replicas than "
            "servers (JetStream refuses it: insufficient resources). Set replicas "
            f"(SHOAL_NATS_REPLICAS) to at most {size}, or add servers to the cluster",
        )
    if replicas == 1 and size >= 3:
        log.warning(
            "nats: replicas=1 in a JetStream cluster of %d: each topic's stream lives on one "
            "server and stops with it; set replicas (SHOAL_NATS_REPLICAS) to 3",
            size,
        )
    elif replicas % 2 == 0:
        log.warning(
            "nats: replicas=%d: a stream needs a majority of its replicas to take writes, so "
            "%d replicas survive no more lost servers than %d do; use an odd number (3 or 5)",
            replicas,
            replicas,
            replicas - 1,
        )


def _get_json(url: str, timeout_s: float) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        doc = json.loads(response.read())
    if not isinstance(doc, dict):
        raise ValueError(f"{url}: not a JSON object")
    return doc
