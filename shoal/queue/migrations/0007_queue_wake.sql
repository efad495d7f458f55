-- Waking a job that waits for a later start: what a durable workflow's wait
-- for an event needs (shoal/workflow), when the event arrives before the
-- wait's timeout.

-- wake_jobs_v1: its definition and the reasons for it are in shoal/queue/functions.sql.
CREATE FUNCTION {schema}.wake_jobs_v1(p_ids bigint[], p_now timestamptz)
RETURNS SETOF bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_queue text;
BEGIN
    RETURN QUERY
    UPDATE {schema}.job j
    SET start_after = coalesce(p_now, now())
    WHERE j.id = ANY(p_ids) AND j.state IN ('created', 'retry')
      AND j.start_after > coalesce(p_now, now())
    RETURNING j.id;
    FOR v_queue IN
        SELECT DISTINCT j.queue FROM {schema}.job j
        WHERE j.id = ANY(p_ids) AND j.state IN ('created', 'retry')
    LOOP
        PERFORM pg_notify(n.nspname || '_jobs', v_queue)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.oid = '{schema}.job'::regclass;
    END LOOP;
END;
$$;
