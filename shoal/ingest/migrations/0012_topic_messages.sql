-- The postgres transport's messages move out of the job table into a table of
-- their own, shaped for what a topic does with them: append, claim, delete.
-- A job row carries the queue's every option (retry policy, expiry, singleton
-- and partition keys, history) and is kept by eleven indexes; a message needs
-- its topic, its delivery count, when it may next be delivered, and its
-- envelope, under a primary key and one claim index.

CREATE TABLE {schema}.topic_message (
    topic       text COLLATE "C" NOT NULL,
    id          bigint GENERATED ALWAYS AS IDENTITY,
    -- Deliveries so far: the fencing token of the latest one's ack, nak and touch.
    attempt     integer NOT NULL DEFAULT 0,
    -- Deliverable from then: its publish time, a nak's delay, or (leased) the
    -- end of its lease, after which a claim takes it again.
    due_at      timestamptz NOT NULL,
    leased      boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL,
    -- The envelope's JSON text as published, handed back as it is.
    envelope    text NOT NULL,
    -- The one index: a claim walks a topic's messages in publish order, an
    -- ack, nak or touch finds its messages by (topic, id). Neither column
    -- changes after the publish, so a claim, nak or touch is a heap-only
    -- update where the page has room (the fillfactor keeps room for one).
    -- With a second index on the id alone, a generic plan of the claim could
    -- walk that one from the head, through every message of every topic.
    PRIMARY KEY (topic, id)
) WITH (fillfactor = 50);

-- claim_messages_v1: its definition and the reasons for it are in shoal/ingest/functions.sql.
CREATE FUNCTION {schema}.claim_messages_v1(
    p_topic text, p_limit integer, p_now timestamptz, p_lease interval, p_after_id bigint)
RETURNS TABLE (id bigint, attempt integer, envelope text)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, now());
    v_rows tid[];
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    IF {schema}.queue_paused_v1('topic.' || p_topic) THEN
        RETURN;
    END IF;
    IF p_after_id IS NULL THEN
        v_rows := ARRAY(
            SELECT m.ctid FROM {schema}.topic_message m
            WHERE m.topic = p_topic AND m.due_at <= v_now
            ORDER BY m.topic, m.id
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED);
    ELSE
        v_rows := ARRAY(
            SELECT m.ctid FROM {schema}.topic_message m
            WHERE m.topic = p_topic AND m.id > p_after_id AND m.due_at <= v_now
            ORDER BY m.topic, m.id
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED);
    END IF;
    RETURN QUERY
    UPDATE {schema}.topic_message m
    SET attempt = m.attempt + 1, due_at = v_now + p_lease, leased = true
    WHERE m.ctid = ANY(v_rows)
    RETURNING m.id, m.attempt, m.envelope;
END;
$$;

-- settle_messages_v1: its definition and the reasons for it are in shoal/ingest/functions.sql.
CREATE FUNCTION {schema}.settle_messages_v1(
    p_topic text, p_ids bigint[], p_attempts integer[], p_delays_s float8[], p_now timestamptz)
RETURNS TABLE (id bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, now());
    v_rows tid[];
BEGIN
    v_rows := ARRAY(
        SELECT k.ctid
        FROM unnest(p_ids, p_attempts) AS u(id, attempt)
        CROSS JOIN LATERAL (
            SELECT m.ctid FROM {schema}.topic_message m
            WHERE m.topic = p_topic AND m.id = u.id AND m.attempt = u.attempt AND m.leased
            LIMIT 1) AS k);
    IF p_delays_s IS NULL THEN
        RETURN QUERY
        DELETE FROM {schema}.topic_message AS m
        WHERE m.ctid = ANY(v_rows)
          AND m.leased AND m.attempt = p_attempts[array_position(p_ids, m.id)]
        RETURNING m.id;
    ELSE
        RETURN QUERY
        UPDATE {schema}.topic_message AS m
        SET due_at = v_now + p_delays_s[array_position(p_ids, m.id)] * interval '1 second',
            leased = false
        WHERE m.ctid = ANY(v_rows)
          AND m.leased AND m.attempt = p_attempts[array_position(p_ids, m.id)]
        RETURNING m.id;
    END IF;
END;
$$;

-- topic_depth_v1: its definition and the reasons for it are in shoal/ingest/functions.sql.
CREATE FUNCTION {schema}.topic_depth_v1(p_topic text, p_now timestamptz)
RETURNS TABLE (ready bigint, in_flight bigint, delayed bigint, oldest_age_s float8)
LANGUAGE sql
STABLE
AS $$
    SELECT count(*) FILTER (WHERE m.due_at <= coalesce(p_now, now())),
           count(*) FILTER (WHERE m.leased AND m.due_at > coalesce(p_now, now())),
           count(*) FILTER (WHERE NOT m.leased AND m.due_at > coalesce(p_now, now())),
           extract(epoch FROM coalesce(p_now, now()) - min(m.created_at))::float8
    FROM {schema}.topic_message m
    WHERE m.topic = p_topic;
$$;

-- publish_topic_job_v1: its definition and the reasons for it are in shoal/ingest/functions.sql.
CREATE FUNCTION {schema}.publish_topic_job_v1()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO {schema}.topic_message (topic, due_at, created_at, envelope)
    VALUES (substr(NEW.queue, 7), NEW.start_after, NEW.created_at, NEW.data::text);
    DELETE FROM {schema}.job j WHERE j.id = NEW.id;
    RETURN NULL;
END;
$$;

-- A message a process of the previous release publishes (a job of queue
-- 'topic.<name>') moves to the topic's table as its statement ends, where
-- this release's consumers take it. Dropped by a migration of the release
-- after this one.
CREATE TRIGGER job_topic_message AFTER INSERT ON {schema}.job
FOR EACH ROW WHEN (NEW.queue LIKE 'topic.%')
EXECUTE FUNCTION {schema}.publish_topic_job_v1();

-- The backlog moves, in this transaction (the migration runner holds every
-- table of the schema meanwhile): each unfinished job of a topic's queue
-- becomes one message, in publish order, with its delivery count. A waiting
-- or nakked message keeps its due time; one a consumer holds keeps its lease,
-- and is delivered again when the lease runs out unless acknowledged (an ack
-- of the previous release finds no job, but writes its done-marker, so the
-- redelivery is acknowledged as a duplicate, never applied twice).
WITH moved AS (
    DELETE FROM {schema}.job j
    WHERE j.queue LIKE 'topic.%' AND j.state IN ('created', 'retry', 'active')
    RETURNING j.id, j.queue, j.state, j.attempt, j.start_after, j.lease_expires_at,
              j.created_at, j.data
)
INSERT INTO {schema}.topic_message (topic, attempt, due_at, leased, created_at, envelope)
SELECT substr(queue, 7), attempt,
       CASE WHEN state = 'active' THEN lease_expires_at ELSE start_after END,
       state = 'active', created_at, data::text
FROM moved
ORDER BY id;

-- A message dead-lettered by the previous release stayed in its topic's queue
-- as a failed job beside its dead letter: the letter is the record (a redrive
-- publishes it again), so the job goes, or a "retry failed" of that queue
-- would publish the message a second time.
DELETE FROM {schema}.job j
WHERE j.queue LIKE 'topic.%' AND j.state = 'failed'
  AND EXISTS (
      SELECT 1 FROM {schema}.ingest_dead d
      WHERE d.topic = substr(j.queue, 7) AND d.message_id = j.data ->> 'id');
