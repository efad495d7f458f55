-- claim_items_v2: claim_items_v1 (0007_batch_functions_v1.sql) from a
-- position, taking its jobs by deleting them.
--
-- The queue locks due item jobs from the head of job_item_turn, or after the
-- worker's position (priority, turn, id) in it (lock_item_jobs_v2 of
-- 0023_item_jobs_from_a_position.sql says what each sees); this locks their
-- items without waiting, the queue takes the jobs whose items are held
-- (take_item_jobs_v2: deleted, a one-shot delivery), and the guard moves
-- their items pending -> running, as in v1. The job rows carry one column
-- more than v1's, the job's turn, from which the worker keeps its position.
-- Lock order and commit as in v1: job rows, then item rows, never waiting;
-- committed without waiting for its WAL flush.
CREATE FUNCTION {schema}.claim_items_v2(
    p_queue text, p_limit integer, p_now timestamptz,
    p_after_priority integer, p_after_turn bigint, p_after_id bigint)
RETURNS TABLE (
    job_id bigint, queue text, job_data text, priority integer, job_attempt integer,
    retry_limit integer, retry_delay_s float8, retry_backoff boolean, retry_delay_max_s float8,
    expire_in_s float8, singleton_key text, dead_letter text, created_at timestamptz,
    started_at timestamptz, lease_expires_at timestamptz, turn bigint,
    item_id bigint, fence integer, run integer, ref text, data text, task_id text, kind text,
    params text, max_attempts integer)
LANGUAGE sql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
    SELECT set_config('synchronous_commit', 'off', true);
    WITH next AS (
        SELECT n.id, n.item_id
        FROM {schema}.lock_item_jobs_v2(
            p_queue, p_limit, p_now, p_after_priority, p_after_turn, p_after_id) AS n
    ), held AS (
        -- As in v1: an item another transaction holds drops its job out of
        -- the join (it stays waiting for the next claim).
        SELECT n.id
        FROM next n
        JOIN {schema}.item i ON i.id = n.item_id
        FOR NO KEY UPDATE OF i SKIP LOCKED
    ), taken AS (
        SELECT c.* FROM {schema}.take_item_jobs_v2(ARRAY(SELECT h.id FROM held h), p_now) AS c
    ), guarded AS (
        -- A function of its own, reading the items with a snapshot taken
        -- after the take (v1 says why).
        SELECT g.* FROM {schema}.guard_items_v1(ARRAY(SELECT c.item_id FROM taken c), p_now) AS g
    )
    SELECT c.id, c.queue, c.data, c.priority, c.attempt, c.retry_limit, c.retry_delay_s,
           c.retry_backoff, c.retry_delay_max_s, c.expire_in_s, c.singleton_key, c.dead_letter,
           c.created_at, c.started_at, c.lease_expires_at, c.turn,
           c.item_id, NULL::integer, NULL::integer, NULL::text, NULL::text, NULL::text,
           NULL::text, NULL::text, NULL::integer
    FROM taken c
    UNION ALL
    SELECT NULL::bigint, NULL::text, NULL::text, NULL::integer, NULL::integer, NULL::integer,
           NULL::float8, NULL::boolean, NULL::float8, NULL::float8, NULL::text, NULL::text,
           NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::bigint,
           g.id, g.attempt, g.run, g.ref, g.data::text, g.task_id::text, g.kind, g.params::text,
           g.max_attempts
    FROM guarded g;
$$;
