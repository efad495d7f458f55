-- SQL of the ingest layer's console: topics and their dead letters. Run only
-- by shoal/ingest/inspect.py.

-- name: topics
-- Every topic the backlog monitor has seen or that has dead letters, with what
-- the monitor last saw and the dead letters waiting for a redrive.
SELECT coalesce(t.topic, d.topic), coalesce(t.depth, 0), coalesce(t.ready, 0),
       coalesce(t.in_flight, 0), coalesce(t.delayed, 0), t.oldest_age_s, t.wait_s,
       coalesce(t.paused, false), t.checked_at, coalesce(d.waiting, 0)
FROM {schema}.ingest_topic t
FULL JOIN (
    SELECT topic, count(*) FILTER (WHERE redriven_at IS NULL) AS waiting
    FROM {schema}.ingest_dead GROUP BY topic
) d ON d.topic = t.topic
ORDER BY 1

-- name: topic_known
SELECT EXISTS (SELECT 1 FROM {schema}.ingest_topic WHERE topic = %(topic)s)
    OR EXISTS (SELECT 1 FROM {schema}.ingest_dead WHERE topic = %(topic)s)

-- name: topic_names
SELECT topic FROM {schema}.ingest_topic
UNION SELECT DISTINCT topic FROM {schema}.ingest_dead
ORDER BY 1

-- name: dead_page
-- A page of a topic's dead letters, oldest first, after a cursor id; waiting
-- ones only unless %(all)s.
SELECT id, topic, message_id, envelope::text, reason, error, attempt, dead_at, redriven_at
FROM {schema}.ingest_dead
WHERE topic = %(topic)s AND (%(all)s OR redriven_at IS NULL)
  AND (%(after_id)s::bigint IS NULL OR id > %(after_id)s::bigint)
ORDER BY id
LIMIT %(limit)s
