"""NATS JetStream as an ingest transport: one file-backed stream per topic.

A topic ``card.ingest`` is the subject ``shoal.card.ingest``, stored in the
stream ``SHOAL_card_ingest``; a consumer group is a durable pull consumer of
that stream, named for the group. The package holds one idea per module:

- :mod:`~shoal.ingest.nats.durability`: the server must run with
  ``jetstream { sync_interval: always }``, checked at start through ``/varz``;
- :mod:`~shoal.ingest.nats.streams`: each topic's stream, created, checked
  (file storage, its subject, no async persist mode) and kept;
- :mod:`~shoal.ingest.nats.publish`: a publish stores every envelope, in
  atomic batches (one fsync each) where the stream allows them;
- :mod:`~shoal.ingest.nats.subscribe`: deliveries pulled for a group, acks
  sent without waiting, and the group's depth;
- :mod:`~shoal.ingest.nats.connection`: the connection, which never buffers;
- :mod:`~shoal.ingest.nats.transport`: :class:`NatsTransport`, all of them
  behind the :class:`~shoal.ingest.transport.Transport` protocol.

Publishing never buffers
------------------------
nats-py queues outgoing messages in memory while it reconnects and sends them
once the connection is back. A publish that timed out could then still reach
the stream later, after its caller was told it failed. This transport connects
with ``pending_size=0``, which makes the client refuse to queue anything while
it is disconnected, and checks the connection before each publish, so a
publish during an outage fails at once with :class:`PublishError`. One narrow
window remains: bytes handed to the client in the instant before it notices a
broken connection may be written after the reconnect. Such a message is a
duplicate of one its caller will publish again (the same id), which
JetStream's own de-duplication drops within its window and shoal's
de-duplication by id drops after it.

Example::

    transport = NatsTransport("nats://127.0.0.1:4222", monitor_url="http://127.0.0.1:8222")
    await transport.start()
    await transport.publish("card.ingest", [new_envelope({"card": 7}, published_at=now)])
    sub = await transport.subscribe("card.ingest", "writer", max_in_flight=200)
    for delivery in await sub.fetch(200, wait=timedelta(seconds=1)):
        await delivery.ack()
"""

from shoal.ingest.nats.connection import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_RECONNECT_WAIT,
    DEFAULT_REQUEST_TIMEOUT,
)
from shoal.ingest.nats.durability import UnsafeDurability, describe_sync, is_sync_always
from shoal.ingest.nats.publish import (
    DEFAULT_MAX_ACK_PENDING,
    DEFAULT_MAX_BATCH,
    MAX_BATCHES_IN_FLIGHT,
    MSG_ID_HEADER,
)
from shoal.ingest.nats.streams import (
    DEFAULT_MAX_AGE,
    DEFAULT_STREAM_PREFIX,
    SUBJECT_PREFIX,
    stream_name_for,
    subject_for,
)
from shoal.ingest.nats.subscribe import (
    MIN_FETCH_WAIT,
    NatsDelivery,
    NatsSubscription,
    consumer_name_for,
)
from shoal.ingest.nats.transport import NatsTransport
from shoal.ingest.transport import PublishError

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_MAX_ACK_PENDING",
    "DEFAULT_MAX_AGE",
    "DEFAULT_MAX_BATCH",
    "DEFAULT_RECONNECT_WAIT",
    "DEFAULT_REQUEST_TIMEOUT",
    "DEFAULT_STREAM_PREFIX",
    "MAX_BATCHES_IN_FLIGHT",
    "MIN_FETCH_WAIT",
    "MSG_ID_HEADER",
    "SUBJECT_PREFIX",
    "NatsDelivery",
    "NatsSubscription",
    "NatsTransport",
    "PublishError",
    "UnsafeDurability",
    "consumer_name_for",
    "describe_sync",
    "is_sync_always",
    "stream_name_for",
    "subject_for",
]
