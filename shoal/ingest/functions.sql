-- The ingest layer's database functions: the live definition of every one
-- that shoal's code calls, in one place, each with the reasons it is written
-- the way it is.
--
-- This file is read, not run. The functions are created by the migrations in
-- shoal/ingest/migrations; tests/test_functions_sql.py runs this file against
-- a migrated database and fails when any definition here differs from the one
-- the migrations built. Names are versioned as the queue's are (the rules are
-- at the top of shoal/queue/functions.sql).
--
-- The postgres transport keeps its messages in a table of its own,
-- topic_message (migration 0012); until 0.2.0 they were jobs of the queue
-- 'topic.<name>' (the queue layer's claim_jobs_leased_v2, delete_jobs_v2 and
-- queue_depth_v1 stay for that release's workers).

-- The live done-markers among a fetch's message ids: the ids of messages
-- already applied whose marker has not expired, so a redelivered message is
-- acknowledged without being applied again.
--
-- Found by primary key whatever the statistics, with the plan kept for the
-- session. Written as one statement with the TTL test beside the ids, and with
-- statistics taken while ingest_done was small (a new database; a bench with
-- autovacuum off), PostgreSQL 15 scanned ingest_done_expires for every marker
-- still within its TTL (nearly all of them) and filtered those by id, or read
-- the whole table: work of (markers alive) per fetch, 3 to 7 ms beside 20,000
-- markers, about 20 us of server time a message in bench/ingest_bench.py, and
-- growing with every message applied for the TTL's 48 hours. Here the TTL test
-- cannot reach the scan (OFFSET 0 keeps it outside the subquery) and
-- sequential scans are off, so the primary key is the only way to the rows:
-- one probe per id.
CREATE OR REPLACE FUNCTION {schema}.done_seen_v1(p_ids text[], p_now timestamptz)
RETURNS TABLE (seen_id text)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
BEGIN
    RETURN QUERY
    SELECT d.message_id FROM (
        SELECT i.message_id, i.expires_at FROM {schema}.ingest_done AS i
        WHERE i.message_id = ANY(p_ids)
        OFFSET 0
    ) AS d
    WHERE d.expires_at > coalesce(p_now, now());
END;
$$;

-- The postgres transport's delivery: claims up to p_limit messages of a topic
-- that are due (waiting, nakked and due, or leased and past their lease: a
-- consumer that died leaves its messages to the next claim, with no sweep in
-- between), in publish order, from the head of the topic or after the id of
-- the last message this subscription claimed (shoal.queue.cursor), and
-- leases them to the caller for p_lease from p_now. Returns what a delivery
-- needs: the id, the delivery count (its fence) and the envelope's text.
-- Nothing while the queue named as the topic ('topic.' and its name) is
-- paused (the queue layer's pause_queue, the console's pause): the pause
-- stops a topic's consumers as it did when the messages were that queue's
-- jobs, and its resume's NOTIFY on that name wakes them.
--
-- One plan shape whatever the parameters: the primary key (topic, id), the
-- table's only index, walked from the topic's head or from the position, the
-- due time read from the row
-- (a held message's lease is its due time, so it is stepped over until the
-- lease ends). So the plans are kept for the session. The claimed rows are
-- updated where the walk found and locked them (their ctids: a TID scan, the
-- one plan a ctid list has), in no indexed column: a heap-only update where
-- the page has room. Not by their ids: the plan kept for "topic = $1 AND id =
-- ANY($2)", when the session planned it on a near-empty table, walked the
-- whole topic with the id list as a filter (about 10 ms a claim at a backlog
-- of 50,000). Not flushed on commit, as the queue's claim: a claim lost to a
-- crash only delivers the messages again.
CREATE OR REPLACE FUNCTION {schema}.claim_messages_v1(
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

-- The postgres transport's ack (p_delays_s NULL: the messages are deleted,
-- no finished row kept, the done-marker is the record), term (the same: the
-- dead letter holds the message) and nak (each made deliverable again after
-- its delay, unleased). Each fenced by the delivery it was handed (attempt,
-- and still leased: a message nakked, or delivered again since, is no longer
-- the caller's). Returns the ids settled.
--
-- Each message is found by its whole primary key (topic, id) in a subquery
-- of its own (LATERAL with a LIMIT: never flattened into a join) and its ctid
-- kept; then the rows are deleted or updated by ctid (a TID scan). So the
-- kept plan looks up each id with both key columns whatever the table's size
-- when the session planned it: a join of the id list with the table, or
-- "id = ANY($2)", may keep a plan that walks the whole topic with the ids as
-- a filter. No row lock between the two (it would cost a WAL record a
-- message): the second statement checks the fence again, by the row's id, so
-- a message claimed again in between (its row a new version, its attempt
-- higher) is left alone, whether that claim committed before (the old
-- version is dead to this statement) or while it waited for the row.
CREATE OR REPLACE FUNCTION {schema}.settle_messages_v1(
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

-- The backlog of one topic: messages due now (waiting, or their holder's lease
-- has run out), held under a live lease, and delayed by a nak, and the age in
-- seconds of the oldest (NULL when there is none). STABLE and a single SELECT
-- without planner switches, so the planner inlines it into the caller's
-- statement.
CREATE OR REPLACE FUNCTION {schema}.topic_depth_v1(p_topic text, p_now timestamptz)
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

-- While processes of the release before the topic table run beside this one:
-- a job a previous release's producer sends to a topic's queue ('topic.' and
-- the topic's name) moves to the topic's table as its statement ends (the
-- trigger job_topic_message, migration 0012, fires only for such jobs), where
-- this release's consumers take it. After the insert, not instead of it: the
-- producer's statement returns its jobs' ids as it expects (0.2.0's insert
-- refuses a statement that returns fewer rows than it sent, and rolls back).
CREATE OR REPLACE FUNCTION {schema}.publish_topic_job_v1()
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
