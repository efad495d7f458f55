"""Ingest pipelines: topics, fixed-concurrency consumers, de-duplication, batch sinks.

The layer that splits "call the slow thing" from "write the database"
(DESIGN.md, "Ingest pipelines"). A topic is an at-least-once stream carried by
a :class:`~shoal.ingest.transport.Transport`: ``postgres`` (the queue tables,
the default) or ``nats`` (NATS JetStream with file storage).
"""
