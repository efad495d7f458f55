-- Items name the worker process that runs them, as jobs do (0031).
--
-- Why. A job held by a process whose heartbeat stopped is handed back with a
-- note naming that process (0031_rescue_jobs_of_silent_workers.sql); an item
-- whose worker died was reaped with a note giving only its last sign of
-- life. The guard that moves an item pending -> running now records the
-- claiming process's registry number (item.holder, 4 bytes in a row the guard
-- writes anyway), and the reaper names it (worker_named_v1, 0033).
--
-- guard_items_v2 and claim_items_v3 are guard_items_v1
-- (0007_batch_functions_v1.sql) and claim_items_v2
-- (0024_claim_items_from_a_position.sql) with that one column more; v1 and v2
-- stay for the previous release's workers, whose items name no holder.
ALTER TABLE {schema}.item ADD COLUMN holder integer;

CREATE FUNCTION {schema}.guard_items_v2(p_ids bigint[], p_now timestamptz, p_holder integer)
RETURNS TABLE (
    id bigint, attempt integer, run integer, ref text, data jsonb, task_id uuid, kind text,
    params jsonb, max_attempts integer)
LANGUAGE sql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
    UPDATE {schema}.item i
    SET status = 'running',
        attempt = i.attempt + 1,
        in_handler = false,
        started_at = coalesce(p_now, now()),
        updated_at = coalesce(p_now, now()),
        holder = p_holder
    FROM {schema}.task t
    WHERE i.id = ANY(p_ids) AND i.status = 'pending' AND t.id = i.task_id
    RETURNING i.id, i.attempt, i.attempt - i.attempt_base, i.ref, i.data, i.task_id, t.kind,
              t.params, t.max_attempts;
$$;

CREATE FUNCTION {schema}.claim_items_v3(
    p_queue text, p_limit integer, p_now timestamptz,
    p_after_priority integer, p_after_turn bigint, p_after_id bigint, p_holder integer)
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
        SELECT g.* FROM {schema}.guard_items_v2(ARRAY(SELECT c.item_id FROM taken c), p_now, p_holder) AS g
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
