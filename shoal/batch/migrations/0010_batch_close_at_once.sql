-- The close follows a task's last item at once again (issue 40): the
-- result write of a batch of items probes whether their task has anything
-- left once per task, not once per item, and names the task whose last
-- items run in another write at the same moment, so that writer asks again
-- after its commit. And an item's two updates (the guard, the result) stay
-- on its page: the item table keeps half of each page free.

-- complete_items_v3: its definition and the reasons for it are in shoal/batch/functions.sql.
CREATE FUNCTION {schema}.complete_items_v3(
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
    ), tasks AS MATERIALIZED (
        SELECT DISTINCT d.task_id FROM done d
    ), drained AS MATERIALIZED (
        -- The statement's snapshot still shows the items done here as
        -- running (and none of them pending). Probed from the live end, as
        -- item_left_v1 does.
        SELECT t.task_id
        FROM tasks t
        WHERE (SELECT i.id FROM {schema}.item i
               WHERE i.task_id = t.task_id AND i.status = 'pending'
               ORDER BY i.id DESC LIMIT 1) IS NULL
    )
    SELECT 'item', d.id, NULL::uuid FROM done d
    UNION ALL
    SELECT 'job', j.id, NULL FROM jobs j
    UNION ALL
    SELECT CASE WHEN (SELECT i.id FROM {schema}.item i
                      WHERE i.task_id = t.task_id AND i.status = 'running'
                        AND i.id <> ALL(p_ids)
                      ORDER BY i.id DESC LIMIT 1) IS NULL
                THEN 'task' ELSE 'tail' END,
           NULL, t.task_id
    FROM drained t;
$$;

-- Room on each item's page for its next versions. The guard and the result
-- write each make a new version of the row (not HOT: status is indexed);
-- on a full page the new version goes to another page, and PostgreSQL locks
-- the old one first, in a WAL record of its own. With the pages the create
-- filled to the brim, that was 2 more lock records an item, 2,018 bytes of
-- WAL an item created and run against a queue job's 996 (bench/cost_model.py);
-- with half of each page free, the versions mostly stay on their page, the
-- pruning of dead ones makes room for the next, and the item table ends
-- smaller. The job table has kept half its pages free since 0.2.0 for the
-- same reason. Only pages written from now on are filled so.
ALTER TABLE {schema}.item SET (fillfactor = 50);
