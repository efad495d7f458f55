-- The workflow layer's database functions: the live definition of every one
-- that shoal's code calls, in one place, each with the reasons it is written
-- the way it is.
--
-- This file is read, not run. The functions are created by the migrations in
-- shoal/workflow/migrations; tests/test_functions_sql.py runs this file
-- against a migrated database and fails when any definition here differs
-- from the one the migrations built. Names are versioned as the queue's are
-- (the rules are at the top of shoal/queue/functions.sql).
--
-- These functions reach the job table only through the queue layer's
-- (wake_jobs_v1): the contract, checked by tests/test_layer_sql.py.

-- ---- Events (docs/workflows.md, "Events")

-- Sends an event: stored, then every run waiting for its key has its resume
-- job made due now. Each event is delivered to one wait, once (the wait takes
-- it by setting taken_by, shoal/workflow/queries.sql: take_event).
--
-- The transaction-level advisory lock on the key is what makes "stored if it
-- arrives before the wait" hold without a gap: a run's wait takes the same
-- lock before it looks for an event and, finding none, records that it waits
-- (wait_key) in the same transaction. The two serialize on the key, so either
-- the wait commits first and this function finds the run waiting (and wakes
-- its job), or this commits first and the wait, which looks after taking the
-- lock, sees the event. Without the lock, a wait could look before the
-- event's insert committed and record itself after this function looked for
-- waiters, and sleep to its timeout with the event stored.
--
-- The lock's key is the event key with the schema, hashed to 64 bits, so two
-- schemas of one database do not wait on each other's keys.
CREATE OR REPLACE FUNCTION {schema}.signal_v1(p_key text, p_payload jsonb, p_now timestamptz)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_id bigint;
BEGIN
    IF p_key IS NULL OR length(p_key) = 0 OR length(p_key) > 512 THEN
        PERFORM {schema}.invalid_input_v1('key', 'an event key is 1 to 512 characters');
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('shoal.workflow.event:{schema}:' || p_key, 0));
    INSERT INTO {schema}.workflow_event (key, payload, sent_at)
    VALUES (p_key, p_payload, coalesce(p_now, now()))
    RETURNING id INTO v_id;
    PERFORM {schema}.wake_jobs_v1(array_agg(r.wake_job), p_now)
    FROM {schema}.workflow_run r
    WHERE r.wait_key = p_key AND r.status = 'waiting' AND r.wake_job IS NOT NULL;
    RETURN v_id;
END;
$$;

-- The SQL API (docs/workflows.md, "Events"): `SELECT shoal.signal('review:42',
-- jsonb_build_object('approved', true))` from a trigger, a psql session or another
-- language's code; the event's id. Unversioned, like send: a stable name for
-- callers, over the versioned function.
CREATE OR REPLACE FUNCTION {schema}.signal(key text, payload jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE sql
AS $$
    SELECT {schema}.signal_v1(key, payload, NULL);
$$;
