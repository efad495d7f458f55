-- A task's items counted by status as they change, so that its progress and
-- its close read a few rows whatever the task's size (issue 40). Before, both
-- counted the task's items: a progress poll of a 1,000,000-item task read
-- its whole (task_id, status) range, about 0.9 s of server time, and the
-- close read every item for its error count and last finish, 0.8 s between
-- the last item and the close.
--
-- item_tally holds changes, not totals: each statement that changes items'
-- statuses adds, per task, how many items each status gained (or lost: a
-- negative count) and the latest finish among them. A task's counts are its
-- total as pending plus the sum of its rows. Items are written only by the
-- create, all pending and as many as the task's total, so the insert adds
-- nothing here.
--
-- Each session adds to a row of its own (backend: its server process id), so
-- two writers never wait for each other's row lock, and a task has a row for
-- each session that ever changed its items: the workers' pool connections and
-- the aggregator's, a few dozen at most. The rows change in the transaction
-- of the items they count, so a snapshot sees both as one.
CREATE TABLE {schema}.item_tally (
    task_id          uuid NOT NULL,
    backend          integer NOT NULL,
    pending          bigint NOT NULL DEFAULT 0,
    -- Running, but no handler runs it yet (claimed, in a worker's buffer):
    -- progress shows these as pending.
    waiting          bigint NOT NULL DEFAULT 0,
    -- Running, and a handler runs it (in_handler).
    running          bigint NOT NULL DEFAULT 0,
    completed        bigint NOT NULL DEFAULT 0,
    error            bigint NOT NULL DEFAULT 0,
    cancelled        bigint NOT NULL DEFAULT 0,
    last_finished_at timestamptz,
    PRIMARY KEY (task_id, backend)
);

-- tally_items_v1: its definition and the reasons for it are in shoal/batch/functions.sql.
CREATE FUNCTION {schema}.tally_items_v1()
RETURNS trigger
LANGUAGE plpgsql
-- Its own planner settings, not those of the function whose statement fired
-- it: the hot path's functions turn sorts and joins off, and a plan costed
-- with a disabled node was compiled by JIT at each statement (0.5 s each).
SET jit = off
SET enable_sort = on
SET enable_hashjoin = on
SET enable_mergejoin = on
AS $$
BEGIN
    INSERT INTO {schema}.item_tally AS t
        (task_id, backend, pending, waiting, running, completed, error, cancelled,
         last_finished_at)
    SELECT s.task_id, pg_backend_pid(), s.pending, s.waiting, s.running, s.completed, s.error,
           s.cancelled, s.last_finished_at
    FROM (
        SELECT c.task_id,
               coalesce(sum(c.n) FILTER (WHERE c.status = 'pending'), 0) AS pending,
               coalesce(sum(c.n) FILTER (WHERE c.status = 'waiting'), 0) AS waiting,
               coalesce(sum(c.n) FILTER (WHERE c.status = 'running'), 0) AS running,
               coalesce(sum(c.n) FILTER (WHERE c.status = 'completed'), 0) AS completed,
               coalesce(sum(c.n) FILTER (WHERE c.status = 'error'), 0) AS error,
               coalesce(sum(c.n) FILTER (WHERE c.status = 'cancelled'), 0) AS cancelled,
               max(c.finished_at) AS last_finished_at
        FROM (SELECT n.task_id,
                     CASE WHEN n.status = 'running' AND NOT n.in_handler THEN 'waiting'
                          ELSE n.status::text END AS status,
                     1 AS n, n.finished_at
              FROM changed_to n
              UNION ALL
              SELECT o.task_id,
                     CASE WHEN o.status = 'running' AND NOT o.in_handler THEN 'waiting'
                          ELSE o.status::text END,
                     -1, NULL
              FROM changed_from o) c
        GROUP BY c.task_id
    ) s
    -- A statement that changed no status (a heartbeat) writes nothing.
    WHERE (s.pending, s.waiting, s.running, s.completed, s.error, s.cancelled)
          <> (0, 0, 0, 0, 0, 0)
    ON CONFLICT (task_id, backend) DO UPDATE
    SET pending = t.pending + excluded.pending,
        waiting = t.waiting + excluded.waiting,
        running = t.running + excluded.running,
        completed = t.completed + excluded.completed,
        error = t.error + excluded.error,
        cancelled = t.cancelled + excluded.cancelled,
        last_finished_at = greatest(t.last_finished_at, excluded.last_finished_at);
    RETURN NULL;
END;
$$;

CREATE TRIGGER item_tally AFTER UPDATE ON {schema}.item
    REFERENCING OLD TABLE AS changed_from NEW TABLE AS changed_to
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.tally_items_v1();

-- The tasks there are now, counted once. The trigger's lock on the item
-- table (taken above) holds off every change to items until this commits,
-- so the counts and the changes after them neither miss nor double one.
-- backend 0 is no session's.
INSERT INTO {schema}.item_tally
    (task_id, backend, pending, waiting, running, completed, error, cancelled, last_finished_at)
SELECT i.task_id, 0,
       count(*) FILTER (WHERE i.status = 'pending') - min(t.total),
       count(*) FILTER (WHERE i.status = 'running' AND NOT i.in_handler),
       count(*) FILTER (WHERE i.status = 'running' AND i.in_handler),
       count(*) FILTER (WHERE i.status = 'completed'),
       count(*) FILTER (WHERE i.status = 'error'),
       count(*) FILTER (WHERE i.status = 'cancelled'),
       max(i.finished_at)
FROM {schema}.item i JOIN {schema}.task t ON t.id = i.task_id
GROUP BY i.task_id;

-- The result write asks the tally, not the items, whether its tasks have
-- anything left. v3 was called only by this release's unreleased code.
-- complete_items_v4: its definition and the reasons for it are in shoal/batch/functions.sql.
CREATE FUNCTION {schema}.complete_items_v4(
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

DROP FUNCTION {schema}.complete_items_v3(bigint[], integer[], jsonb[], bigint[], integer[], timestamptz);
