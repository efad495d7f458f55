-- The claim's guard and the result write find their items by primary key
-- whatever the statistics say (issue 40: a 1,000,000-item task stalled
-- when the item table's statistics had been taken while no item was
-- pending). Their fences on an item's status are written as text, which no
-- index serves.

-- guard_items_v3, claim_items_v4 and complete_items_v5: their definitions and
-- the reasons for them are in shoal/batch/functions.sql.
CREATE FUNCTION {schema}.guard_items_v3(p_ids bigint[], p_now timestamptz, p_holder integer)
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
    WHERE i.id = ANY(p_ids) AND i.status::text = 'pending' AND t.id = i.task_id
    RETURNING i.id, i.attempt, i.attempt - i.attempt_base, i.ref, i.data, i.task_id, t.kind,
              t.params, t.max_attempts;
$$;

CREATE FUNCTION {schema}.claim_items_v4(
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
        -- the join (it stays waiting for the next claim). Each job's item
        -- is locked by a probe of the primary key of its own (a LATERAL
        -- subquery with a locking clause is run per row, never flattened):
        -- with statistics that said the item table was empty, v3's join
        -- walked every item of the table once per claim, outer to the jobs.
        SELECT n.id
        FROM next n
        CROSS JOIN LATERAL (
            SELECT i.id FROM {schema}.item i WHERE i.id = n.item_id
            FOR NO KEY UPDATE OF i SKIP LOCKED
        ) held_item
    ), taken AS (
        SELECT c.* FROM {schema}.take_item_jobs_v2(ARRAY(SELECT h.id FROM held h), p_now) AS c
    ), guarded AS (
        -- A function of its own, reading the items with a snapshot taken
        -- after the take (v1 says why).
        SELECT g.* FROM {schema}.guard_items_v3(ARRAY(SELECT c.item_id FROM taken c), p_now, p_holder) AS g
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

CREATE FUNCTION {schema}.complete_items_v5(
    p_ids bigint[], p_fences integer[], p_results jsonb[], p_job_ids bigint[],
    p_job_attempts integer[], p_now timestamptz)
RETURNS TABLE (what text, id bigint, task_id uuid)
LANGUAGE sql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
    WITH jobs AS (
        SELECT j.id FROM {schema}.complete_jobs_v1(p_job_ids, p_job_attempts, NULL, p_now) AS j
        WHERE cardinality(p_job_ids) > 0
    ), done AS (
        UPDATE {schema}.item i
        SET status = 'completed',
            result = coalesce(u.result, 'null'),
            error = NULL,
            finished_at = coalesce(p_now, now()),
            updated_at = coalesce(p_now, now())
        FROM unnest(p_ids, p_fences, p_results) AS u(id, attempt, result)
        WHERE i.id = u.id AND i.status::text = 'running' AND i.attempt = u.attempt
        RETURNING i.id, i.task_id
    ), tasks AS MATERIALIZED (
        SELECT d.task_id, count(*) AS done FROM done d GROUP BY d.task_id
    ), left_before AS MATERIALIZED (
        -- Each task's counts as the statement's snapshot shows them: before
        -- this write (its own changes are added by the trigger after it), so
        -- the items done here are among the running.
        SELECT t.task_id, t.done,
               k.total + coalesce(sum(x.pending), 0) AS pending,
               coalesce(sum(x.waiting + x.running), 0) AS running
        FROM tasks t
        JOIN {schema}.task k ON k.id = t.task_id
        LEFT JOIN {schema}.item_tally x ON x.task_id = t.task_id
        GROUP BY t.task_id, t.done, k.total
    )
    SELECT 'item', d.id, NULL::uuid FROM done d
    UNION ALL
    SELECT 'job', j.id, NULL FROM jobs j
    UNION ALL
    SELECT CASE WHEN l.running = l.done THEN 'task' ELSE 'tail' END, NULL, l.task_id
    FROM left_before l
    WHERE l.pending = 0;
$$;

-- v4 was called only by unreleased code (migration 0013).
DROP FUNCTION {schema}.complete_items_v4(bigint[], integer[], jsonb[], bigint[], integer[], timestamptz);
