-- A workflow's jobs get a dead-letter queue (shoal/workflow/dead.py): a job
-- that fails for good, its retries spent, leaves a copy there, and the run it
-- held is marked failed from it instead of staying "running" with no job.
-- send_job_v2 is send_job_v1 with the dead-letter queue; v1 shipped in no
-- release, so it goes.

-- send_job_v2: its definition and the reasons for it are in shoal/queue/functions.sql.
CREATE FUNCTION {schema}.send_job_v2(
    p_queue text, p_data jsonb, p_retry_limit integer, p_retry_delay_s float8,
    p_retry_backoff boolean, p_retry_delay_max_s float8, p_expire_in_s float8,
    p_dead_letter text, p_start_at timestamptz, p_now timestamptz)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_id bigint;
    v_start timestamptz := coalesce(p_start_at, p_now, now());
BEGIN
    INSERT INTO {schema}.job (
        queue, data, retry_limit, retry_delay, retry_backoff, retry_delay_max, expire_in,
        dead_letter, start_after, created_at, partition_key)
    VALUES (
        p_queue, p_data, p_retry_limit, p_retry_delay_s * interval '1 second', p_retry_backoff,
        p_retry_delay_max_s * interval '1 second', p_expire_in_s * interval '1 second',
        p_dead_letter, v_start, coalesce(p_now, now()),
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

DROP FUNCTION {schema}.send_job_v1(
    text, jsonb, integer, float8, boolean, float8, float8, timestamptz, timestamptz);
