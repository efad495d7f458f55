-- Level 2: batch tasks. One task row, N item rows, N queue jobs, created in one
-- transaction. Workers write only their own item row; the aggregator alone
-- closes a task. See docs/batch.md for the state diagrams.

CREATE TYPE {schema}.task_status AS ENUM ('processing', 'completed', 'cancelled');
CREATE TYPE {schema}.task_outcome AS ENUM
    ('completed', 'completed_with_errors', 'cancelled', 'timed_out');
-- pending: waiting for its job. running: a worker passed the phantom guard.
-- completed, error, cancelled: finished (retry-failed moves error back to pending).
CREATE TYPE {schema}.item_status AS ENUM ('pending', 'running', 'completed', 'error', 'cancelled');

CREATE TABLE {schema}.task (
    id                  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    kind                text COLLATE "C" NOT NULL,
    status              {schema}.task_status NOT NULL DEFAULT 'processing',
    outcome             {schema}.task_outcome,
    -- Idempotency is this unique key plus a conflict catch, never read-then-write.
    idempotency_key     text COLLATE "C" UNIQUE,
    -- A digest of the request, so a reused key with a different request is told apart.
    request_hash        text NOT NULL,
    params              jsonb NOT NULL DEFAULT 'null',
    total               integer NOT NULL CHECK (total > 0),
    max_attempts        integer NOT NULL CHECK (max_attempts > 0),
    zombie_timeout      interval NOT NULL CHECK (zombie_timeout > interval '0'),
    deadline_at         timestamptz,
    -- Set by cancel() or a passed deadline: pending items never start, and the
    -- task closes as cancelled | timed_out once nothing runs.
    cancel_reason       {schema}.task_outcome CHECK (cancel_reason IN ('cancelled', 'timed_out')),
    cancel_requested_at timestamptz,
    -- Where and how the items' jobs are sent: the aggregator re-dispatches
    -- reaped items with these, whatever kinds its own process knows.
    item_queue          text COLLATE "C" NOT NULL,
    job_options         jsonb NOT NULL DEFAULT '{{}}',
    -- Queue that receives the on_complete hook job when the task closes.
    on_complete_queue   text COLLATE "C",
    created_at          timestamptz NOT NULL,
    completed_at        timestamptz,
    -- When the last item finished, as seen by the closing aggregator: the
    -- difference to completed_at is the completion-detection latency.
    last_item_at        timestamptz,
    CONSTRAINT closed_has_time CHECK ((status = 'processing') = (completed_at IS NULL)),
    CONSTRAINT closed_has_outcome CHECK ((status = 'processing') = (outcome IS NULL)),
    CONSTRAINT cancelled_outcome CHECK (status <> 'cancelled' OR outcome IN ('cancelled', 'timed_out')),
    CONSTRAINT cancel_has_time CHECK ((cancel_reason IS NULL) = (cancel_requested_at IS NULL))
);
CREATE INDEX task_processing ON {schema}.task (created_at) WHERE status = 'processing';
CREATE INDEX task_created ON {schema}.task (created_at DESC, id);

CREATE TABLE {schema}.item (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The task's id. Not a foreign key: items are written only by the statement
    -- that creates them, in the transaction that inserts their task, and tasks
    -- are never deleted; the key's per-row check (a lookup and a lock of the
    -- task row for each item) was a fifth of creating a 100,000-item task.
    task_id     uuid NOT NULL,
    ref         text COLLATE "C" NOT NULL,
    data        jsonb NOT NULL DEFAULT 'null',
    status      {schema}.item_status NOT NULL DEFAULT 'pending',
    -- Guard passes so far; the fencing token of the current run. A worker's
    -- final write names it, so a worker presumed dead cannot overwrite the
    -- result of the run that replaced it.
    attempt     integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    -- attempt when retry-failed last reopened the item: runs since then are
    -- attempt - attempt_base, bounded by the task's max_attempts.
    attempt_base integer NOT NULL DEFAULT 0 CHECK (attempt_base <= attempt),
    result      jsonb,
    error       text,
    errors      jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(errors) = 'array'),
    started_at  timestamptz,
    -- Last sign of life: set by the guard, each heartbeat and the final write.
    -- The reaper judges zombies by it, never by started_at.
    updated_at  timestamptz NOT NULL,
    finished_at timestamptz,
    -- A task's refs are unique, checked by create (parse_items) before this
    -- table is written, and only create writes items. No unique index: every
    -- update of an item adds an entry to each of its indexes, and this one
    -- (a uuid and a text per entry, checked for uniqueness on each insert) was
    -- about a seventh of the database time of running a 100,000-item task.
    CONSTRAINT finished_has_time CHECK (
        (status IN ('completed', 'error', 'cancelled')) = (finished_at IS NOT NULL))
);
-- Progress is one GROUP BY status over this index; paging by status walks it by id.
-- The aggregator finds a processing task's running and pending items through it
-- too. (No index of running items: every run added an entry to one, and with
-- no vacuum their dead entries slowed each statement the planner let read it.)
CREATE INDEX item_task_status ON {schema}.item (task_id, status, id);

-- Rare events counted cluster-wide (phantom skips, zombies reaped), written in
-- the transaction of the event, read by /metrics.
CREATE TABLE {schema}.counter (
    name  text PRIMARY KEY,
    value bigint NOT NULL DEFAULT 0
);

-- The hot path's statements are functions for their planner switches, as
-- claim_jobs is (0001_queue.sql): whatever the statistics say (and with no
-- autovacuum there may be none), each item is reached by one primary-key
-- probe. Left free, the planner chose sequential scans of the whole item table
-- while it had no statistics, and bitmap scans of partial indexes full of dead
-- entries later on.

-- The phantom-retry guard, for many items at once: pending -> running with a
-- new fencing token, or nothing for an item already running, finished or
-- cancelled (a duplicate or late delivery). Returns each passed item with what
-- its handler needs; an id missing from the result was a phantom.
CREATE FUNCTION {schema}.guard_items(p_ids bigint[], p_now timestamptz)
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
        started_at = coalesce(p_now, now()),
        updated_at = coalesce(p_now, now())
    FROM {schema}.task t
    WHERE i.id = ANY(p_ids) AND i.status = 'pending' AND t.id = i.task_id
    RETURNING i.id, i.attempt, i.attempt - i.attempt_base, i.ref, i.data, i.task_id, t.kind,
              t.params, t.max_attempts;
$$;

-- A worker's claim of item jobs: take_jobs, then the guard of their items, in
-- one statement (one round trip, one commit; like a claim, it need not wait
-- for its WAL flush: lost to a server crash, both the take and the guard are
-- undone, and the jobs are delivered again). An item job is a one-shot
-- delivery: the item row records the run (running, its fence, its heartbeat),
-- the reaper recovers it if its worker dies, and a retry is a new job. One row
-- per job taken (the columns of the queue's claim_jobs query, and item_id),
-- then one per item that passed the guard (job_id NULL, item_id and the
-- guard's columns); an item with no row of the second kind was a phantom.
-- Payloads come back as text, parsed only when a handler reads them.
CREATE FUNCTION {schema}.claim_items(p_queue text, p_limit integer, p_now timestamptz)
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
    WITH claimed AS (
        SELECT c.id, c.queue, c.data, c.priority, c.attempt, c.retry_limit, c.retry_delay,
               c.retry_backoff, c.retry_delay_max, c.expire_in, c.singleton_key, c.dead_letter,
               c.created_at, c.started_at, c.lease_expires_at,
               (c.data->>'item')::bigint AS item_id
        FROM {schema}.take_jobs(p_queue, p_limit, p_now) AS c
    )
    SELECT c.id, c.queue, c.data::text, c.priority, c.attempt, c.retry_limit,
           extract(epoch FROM c.retry_delay)::float8, c.retry_backoff,
           extract(epoch FROM c.retry_delay_max)::float8, extract(epoch FROM c.expire_in)::float8,
           c.singleton_key, c.dead_letter, c.created_at, c.started_at, c.lease_expires_at,
           c.item_id, NULL::integer, NULL::integer, NULL::text, NULL::text, NULL::text,
           NULL::text, NULL::text, NULL::integer
    FROM claimed c
    UNION ALL
    SELECT NULL::bigint, NULL::text, NULL::text, NULL::integer, NULL::integer, NULL::integer,
           NULL::float8, NULL::boolean, NULL::float8, NULL::float8, NULL::text, NULL::text,
           NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
           g.id, g.attempt, g.run, g.ref, g.data::text, g.task_id::text, g.kind, g.params::text,
           g.max_attempts
    FROM {schema}.guard_items(ARRAY(SELECT c.item_id FROM claimed c), p_now) AS g;
$$;

-- Records finished runs and completes their jobs in one statement (one
-- commit for both): running -> completed for each (item, fence, result), and
-- complete_jobs() for each (job, attempt) (none for jobs claim_items took,
-- which are complete already). Rows: ('item', id) for each item
-- completed now, ('job', id) for each job completed now, and ('task', NULL,
-- task id) for each task left with nothing pending or running, so the worker
-- wakes the aggregator. (An item missing from the result lost its fence, or
-- was completed by this same run before: a write retried after a lost
-- acknowledgement. The caller tells them apart with completed_items, rarely.)
-- The CTEs see the items as they were before this statement, so the ones
-- completed here are left out of NOT EXISTS by id. A NULL result is JSON null.
CREATE FUNCTION {schema}.complete_items(
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
        SELECT j.id FROM {schema}.complete_jobs(p_job_ids, p_job_attempts, NULL, p_now) AS j
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
