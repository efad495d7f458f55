-- The batch layer's database functions under versioned names, the only names
-- shoal's code calls (see 0006_queue_functions_v1.sql for the rule: a
-- versioned function is never edited; a change is a new _v2 beside it). The
-- unversioned guard_items, claim_items and complete_items of 0002_batch.sql
-- and 0005_batch_fairness.sql stay for the workers of the previous release.
-- These reach the job table only through the queue's functions.
--
-- Lock order, as in 0005_batch_fairness.sql: job rows first, then item rows,
-- and only the claim holds a job row while it locks an item, without ever
-- waiting (SKIP LOCKED both times).

-- The phantom guard, for jobs a worker did not claim through claim_items_v1:
-- guard_items of 0005_batch_fairness.sql, unchanged.
CREATE FUNCTION {schema}.guard_items_v1(p_ids bigint[], p_now timestamptz)
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
        updated_at = coalesce(p_now, now())
    FROM {schema}.task t
    WHERE i.id = ANY(p_ids) AND i.status = 'pending' AND t.id = i.task_id
    RETURNING i.id, i.attempt, i.attempt - i.attempt_base, i.ref, i.data, i.task_id, t.kind,
              t.params, t.max_attempts;
$$;

-- A worker's claim of item jobs with the guard of their items, in one
-- statement (one round trip, one commit, not waiting for its WAL flush: lost
-- to a server crash, the take and the guard are both undone). The queue locks
-- due item jobs in turn order (lock_item_jobs_v1); this locks their items,
-- skipping any another transaction holds for a moment (its job stays waiting
-- for the next claim); the queue takes the jobs whose items are held
-- (take_item_jobs_v1, a one-shot delivery), and the guard (guard_items_v1)
-- moves their items pending -> running. One row per job taken (the queue's
-- claim row, job_ as a prefix where a name is the item's too, and item_id),
-- then one per item that passed the guard (job_id NULL, item_id and the
-- guard's columns); an item with no row of the second kind was a phantom. Payloads come back as
-- text, parsed only when a handler reads them.
CREATE FUNCTION {schema}.claim_items_v1(p_queue text, p_limit integer, p_now timestamptz)
RETURNS TABLE (
    job_id bigint, queue text, job_data text, priority integer, job_attempt integer,
    retry_limit integer, retry_delay_s float8, retry_backoff boolean, retry_delay_max_s float8,
    expire_in_s float8, singleton_key text, dead_letter text, created_at timestamptz,
    started_at timestamptz, lease_expires_at timestamptz,
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
        SELECT n.id, n.item_id FROM {schema}.lock_item_jobs_v1(p_queue, p_limit, p_now) AS n
    ), held AS (
        -- The lock the guard's update takes, taken here without waiting: a
        -- job whose item is locked drops out of the join. Each item is
        -- reached by one primary-key probe per job.
        SELECT n.id
        FROM next n
        JOIN {schema}.item i ON i.id = n.item_id
        FOR NO KEY UPDATE OF i SKIP LOCKED
    ), taken AS (
        SELECT c.* FROM {schema}.take_item_jobs_v1(ARRAY(SELECT h.id FROM held h), p_now) AS c
    ), guarded AS (
        -- A function of its own, so the guard reads the items with a snapshot
        -- taken after the take: the statement's own one predates the queue's
        -- functions, and may show an item that a job taken here was sent for
        -- (retry-failed, a re-dispatch) as it was before it became pending.
        SELECT g.* FROM {schema}.guard_items_v1(ARRAY(SELECT c.item_id FROM taken c), p_now) AS g
    )
    SELECT c.id, c.queue, c.data, c.priority, c.attempt, c.retry_limit, c.retry_delay_s,
           c.retry_backoff, c.retry_delay_max_s, c.expire_in_s, c.singleton_key, c.dead_letter,
           c.created_at, c.started_at, c.lease_expires_at,
           c.item_id, NULL::integer, NULL::integer, NULL::text, NULL::text, NULL::text,
           NULL::text, NULL::text, NULL::integer
    FROM taken c
    UNION ALL
    SELECT NULL::bigint, NULL::text, NULL::text, NULL::integer, NULL::integer, NULL::integer,
           NULL::float8, NULL::boolean, NULL::float8, NULL::float8, NULL::text, NULL::text,
           NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
           g.id, g.attempt, g.run, g.ref, g.data::text, g.task_id::text, g.kind, g.params::text,
           g.max_attempts
    FROM guarded g;
$$;

-- complete_items of 0002_batch.sql, completing jobs through complete_jobs_v1:
-- running -> completed for each (item, fence, result), and each (job,
-- attempt) completed (none for jobs claim_items_v1 took, complete already).
-- Rows: ('item', id) for each item completed now, ('job', id) for each job
-- completed now, and ('task', NULL, task id) for each task left with nothing
-- pending or running.
CREATE FUNCTION {schema}.complete_items_v1(
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
    SELECT 'task', NULL, t.task_id
    FROM (SELECT DISTINCT d.task_id FROM done d) t
    WHERE NOT EXISTS (
        SELECT 1 FROM {schema}.item i
        WHERE i.task_id = t.task_id AND i.status IN ('pending', 'running')
          AND i.id <> ALL(p_ids));
$$;
