-- Ingest pipelines: every statement of the layer. {schema} is bound once.

-- name: done_seen
-- The live markers among %(ids)s, by primary key whatever the statistics
-- (done_seen_v1, shoal/ingest/functions.sql).
SELECT seen_id FROM {schema}.done_seen_v1(%(ids)s::text[], %(now)s::timestamptz)

-- name: mark_done
INSERT INTO {schema}.ingest_done (message_id, expires_at)
SELECT id, coalesce(%(now)s::timestamptz, now()) + %(ttl)s::interval
FROM unnest(%(ids)s::text[]) AS id
ON CONFLICT (message_id) DO UPDATE SET expires_at = excluded.expires_at

-- name: prune_done
DELETE FROM {schema}.ingest_done
WHERE message_id IN (
    SELECT message_id FROM {schema}.ingest_done
    WHERE expires_at <= coalesce(%(now)s::timestamptz, now())
    LIMIT %(limit)s
)

-- name: dead_letter
INSERT INTO {schema}.ingest_dead (topic, message_id, envelope, reason, error, attempt, dead_at)
SELECT %(topic)s, m.id, m.envelope, %(reason)s, m.error, m.attempt,
       coalesce(%(now)s::timestamptz, now())
FROM unnest(%(ids)s::text[], %(envelopes)s::jsonb[], %(errors)s::text[], %(attempts)s::int[])
    AS m(id, envelope, error, attempt)

-- name: dead_letters
SELECT id, topic, message_id, envelope::text, reason, error, attempt, dead_at, redriven_at
FROM {schema}.ingest_dead
WHERE topic = %(topic)s AND (%(all)s OR redriven_at IS NULL)
ORDER BY id
LIMIT %(limit)s

-- name: take_dead_letters
-- Marks waiting dead letters of a topic as redriven: those of %(ids)s, or
-- (ids NULL) up to %(limit)s of them. The caller publishes them in the same
-- transaction (postgres transport) or before committing (nats), so a failed
-- publish leaves them waiting.
UPDATE {schema}.ingest_dead SET redriven_at = coalesce(%(now)s::timestamptz, now())
WHERE id IN (
    SELECT id FROM {schema}.ingest_dead
    WHERE topic = %(topic)s AND redriven_at IS NULL
      AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING envelope::text

-- name: topic_depth
-- The postgres transport's backlog of one topic: ready, in flight, delayed,
-- and the age of the oldest message (topic_depth_v1, shoal/ingest/functions.sql).
SELECT ready, in_flight, delayed, oldest_age_s
FROM {schema}.topic_depth_v1(%(topic)s, %(now)s::timestamptz)

-- name: record_wait
INSERT INTO {schema}.ingest_topic (topic, last_wait_s, last_wait_at)
VALUES (%(topic)s, %(wait_s)s, coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (topic) DO UPDATE
SET last_wait_s = excluded.last_wait_s, last_wait_at = excluded.last_wait_at

-- name: record_backlog
-- The monitor's reading. The wait is what consumers last reported while that
-- report is recent and the topic has a backlog, else the oldest message's age.
-- The pause flag is set past pause_depth and cleared below half of it
-- (hysteresis), in this one statement.
INSERT INTO {schema}.ingest_topic AS t
    (topic, depth, ready, in_flight, delayed, oldest_age_s, wait_s, paused, checked_at)
VALUES (%(topic)s, %(depth)s, %(ready)s, %(in_flight)s, %(delayed)s, %(oldest_age_s)s,
        %(oldest_age_s)s, %(depth)s > %(pause_depth)s, coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (topic) DO UPDATE
SET depth = excluded.depth, ready = excluded.ready, in_flight = excluded.in_flight,
    delayed = excluded.delayed, oldest_age_s = excluded.oldest_age_s,
    checked_at = excluded.checked_at,
    wait_s = CASE WHEN excluded.depth > 0 AND t.last_wait_at IS NOT NULL
                       AND t.last_wait_at >= excluded.checked_at - %(recent)s::interval
                  THEN t.last_wait_s ELSE excluded.oldest_age_s END,
    paused = CASE WHEN excluded.depth > %(pause_depth)s THEN true
                  WHEN excluded.depth < %(pause_depth)s / 2.0 THEN false
                  ELSE t.paused END
RETURNING paused, wait_s

-- name: topic_states
SELECT topic, depth, ready, in_flight, delayed, oldest_age_s, wait_s, paused, checked_at,
       last_wait_s
FROM {schema}.ingest_topic ORDER BY topic

-- name: topic_paused
SELECT paused FROM {schema}.ingest_topic WHERE topic = %(topic)s

-- name: config_get
SELECT value::text FROM {schema}.config WHERE key = %(key)s

-- name: config_set
INSERT INTO {schema}.config (key, value, updated_at)
VALUES (%(key)s, %(value)s::jsonb, coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at

-- name: config_all
SELECT key, value::text, updated_at FROM {schema}.config ORDER BY key

-- name: publish_messages
-- The postgres transport's publish: one message per envelope, %(topics)s[i]
-- the topic of %(envelopes)s[i], each due at once; and a NOTIFY for each of
-- %(queues)s (the topics' names as the queue notifier knows them, 'topic.'
-- and the name), delivered on commit, which wakes the topics' idle consumers.
WITH added AS (
    INSERT INTO {schema}.topic_message (topic, due_at, created_at, envelope)
    SELECT m.topic, coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()),
           m.envelope
    FROM unnest(%(topics)s::text[], %(envelopes)s::text[]) AS m(topic, envelope)
)
SELECT pg_notify(%(channel)s, q) FROM unnest(%(queues)s::text[]) AS q

-- name: claim_messages
-- The postgres transport's delivery: up to %(limit)s due messages of a topic,
-- from its head or after the id %(after_id)s, each leased for the consumer's
-- ack wait (claim_messages_v1, shoal/ingest/functions.sql).
SELECT id, attempt, envelope
FROM {schema}.claim_messages_v1(
    %(topic)s, %(limit)s, %(now)s::timestamptz, %(ack_wait)s::interval, %(after_id)s::bigint)

-- name: ack_messages
-- The postgres transport's ack: acknowledged messages are deleted, each fenced
-- by the delivery it was handed (settle_messages_v1). No finished row is kept:
-- the done-marker records what was applied. The consumer's done-markers (id,
-- TTL in seconds) are written by the same statement, so a message is
-- acknowledged and marked, or neither (an empty list of marks writes none).
WITH marked AS (
    INSERT INTO {schema}.ingest_done (message_id, expires_at)
    SELECT m.id, coalesce(%(now)s::timestamptz, now()) + m.ttl_s * interval '1 second'
    FROM unnest(%(marks)s::text[], %(ttls_s)s::float8[]) AS m(id, ttl_s)
    ON CONFLICT (message_id) DO UPDATE SET expires_at = excluded.expires_at
)
SELECT count(*) FROM {schema}.settle_messages_v1(
    %(topic)s, %(ids)s::bigint[], %(attempts)s::int[], NULL, %(now)s::timestamptz)

-- name: settle_messages
-- A nak (%(delays_s)s: each message due again that many seconds from now) or a
-- term (%(delays_s)s NULL: deleted, its dead letter holds it), each fenced by
-- its delivery (settle_messages_v1).
SELECT count(*) FROM {schema}.settle_messages_v1(
    %(topic)s, %(ids)s::bigint[], %(attempts)s::int[], %(delays_s)s::float8[],
    %(now)s::timestamptz)

-- name: touch_messages
-- A touch: the lease of a message still held under this delivery runs for
-- another ack wait from now.
UPDATE {schema}.topic_message
SET due_at = coalesce(%(now)s::timestamptz, now()) + %(ack_wait)s::interval
WHERE topic = %(topic)s AND id = %(id)s AND attempt = %(attempt)s AND leased
