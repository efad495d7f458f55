-- "Has this task anything pending or running?", asked from the end of the
-- index where the live entries are. Items are claimed in turn order, which
-- within a task is id order, and every claim and result writes a new row
-- version with a new entry in item_task_status; the old entries stay until
-- vacuum. So a task's (task_id, 'pending') and (task_id, 'running') ranges
-- fill with dead entries from their low-id end while its live ones sit at
-- the high-id end: a forward probe (NOT EXISTS, as in complete_items_v1)
-- walked past every item finished so far, about 12 ms at 500,000 finished
-- items and a few pages for each later result write (O(finished) on each of
-- a big task's thousands of result writes), where a backward probe reads a
-- few pages whatever the task's size. At the very end of a task (nothing
-- left live) both walk the whole range, once for each of the last writes.
-- Versioned as in 0007_batch_functions_v1.sql: v1 stays for the workers of
-- the previous release.

-- An item of the task other than p_except that is pending or running (its
-- id), or NULL: the probe of complete_items_v2 and of the aggregator's
-- close. Each status is read backward from its highest id (ORDER BY id DESC
-- LIMIT 1 in a scalar subquery: an EXISTS would drop the order and scan
-- forward).
CREATE FUNCTION {schema}.item_left_v1(p_task_id uuid, p_except bigint[])
RETURNS bigint
LANGUAGE sql
STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
    SELECT coalesce(
        (SELECT i.id FROM {schema}.item i
         WHERE i.task_id = p_task_id AND i.status = 'pending' AND i.id <> ALL(p_except)
         ORDER BY i.id DESC LIMIT 1),
        (SELECT i.id FROM {schema}.item i
         WHERE i.task_id = p_task_id AND i.status = 'running' AND i.id <> ALL(p_except)
         ORDER BY i.id DESC LIMIT 1));
$$;

-- complete_items_v1 with the probe of a task left with nothing pending or
-- running taken from the live end (item_left_v1). The same rows: ('item',
-- id) for each item completed now, ('job', id) for each job completed now,
-- and ('task', NULL, task id) for each task left with nothing pending or
-- running.
CREATE FUNCTION {schema}.complete_items_v2(
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
        WHERE i.id = u.id AND i.status = 'running' AND i.attempt = u.attempt
        RETURNING i.id, i.task_id
    )
    SELECT 'item', d.id, NULL::uuid FROM done d
    UNION ALL
    SELECT 'job', j.id, NULL FROM jobs j
    UNION ALL
    -- The statement's snapshot still shows the items done here as running:
    -- the probe passes over them (p_ids).
    SELECT 'task', NULL, t.task_id
    FROM (SELECT DISTINCT d.task_id FROM done d) t
    WHERE {schema}.item_left_v1(t.task_id, p_ids) IS NULL;
$$;
