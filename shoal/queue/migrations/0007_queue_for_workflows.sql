-- What durable workflows (shoal/workflow) need of the queue: a job sent with
-- settings already checked, in one statement with the run it starts; and
-- waking a job that waits for a later start, when an event a run waits for
-- arrives before the wait's timeout.

-- send_job_v1: its definition and the reasons for it are in shoal/queue/functions.sql.
CREATE FUNCTION {schema}.send_job_v1(
    p_queue text, p_data jsonb, p_retry_limit integer, p_retry_delay_s float8,
    p_retry_backoff boolean, p_retry_delay_max_s float8, p_expire_in_s float8,
    p_start_at timestamptz, p_now timestamptz)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_id bigint;
    v_start timestamptz := coalesce(p_start_at, p_now, now());
BEGIN
    INSERT INTO {schema}.job (
        queue, data, retry_limit, retry_delay, retry_backoff, retry_delay_max, expire_in,
        start_after, created_at, partition_key)
    VALUES (
        p_queue, p_data, p_retry_limit, p_retry_delay_s * interval '1 second', p_retry_backoff,
        p_retry_delay_max_s * interval '1 second', p_expire_in_s * interval '1 second',
        v_start, coalesce(p_now, now()),
        CASE WHEN EXISTS (SELECT 1 FROM {schema}.queue_limit l WHERE l.queue = p_queue)
             THEN '' END)
    RETURNING id INTO v_id;
    IF v_start <= coalesce(p_now, now()) THEN
        PERFORM pg_notify(n.nspname || '_jobs', p_queue)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.oid = '{schema}.job'::regclass;
    END IF;
    RETURN v_id;
END;
$$;


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
