-- The batch layer's database functions: the live definition of every one
-- that shoal's code calls, in one place, each with the reasons it is written
-- the way it is.
--
-- This file is read, not run. The functions are created by the migrations in
-- shoal/batch/migrations; tests/test_functions_sql.py runs this file against a
-- migrated database and fails when any definition here differs from the one
-- the migrations built. Names are versioned as the queue's are (the rules are
-- at the top of shoal/queue/functions.sql); the unversioned guard_items,
-- claim_items and complete_items are kept, unchanged, for the workers of
-- release 0.1.0 and are not called by this code.
--
-- These functions reach the job table only through the queue layer's
-- (lock_item_jobs_v2, take_item_jobs_v2, complete_jobs_v1, insert_item_jobs_v3,
-- singleton_held_v1): the contract, checked by tests/test_layer_sql.py.
--
-- Lock order, everywhere in this layer: job rows first, then item rows, and
-- only the claim holds a job row while it locks an item, never waiting (SKIP
-- LOCKED both times). A fixed order is what keeps a claim and a completion
-- from deadlocking.

-- ---- Claiming, guarding and completing items (shoal/batch/queries.sql)

-- A worker's claim of item jobs with the guard of their items, in one
-- statement: one round trip and one commit, not waiting for its WAL flush
-- (lost to a server crash, the take and the guard are both undone and the
-- jobs are delivered again). The queue locks due item jobs in turn order, from
-- the head of job_item_turn or after the worker's position (priority, turn,
-- id) in it (lock_item_jobs_v2 says what each sees); this locks their items
-- without waiting, so a job whose item another transaction holds for a moment
-- stays waiting for the next claim; the queue takes the jobs whose items are
-- held (take_item_jobs_v2: deleted, a one-shot delivery); and the guard moves
-- their items pending -> running, recording the claiming process (p_holder,
-- its worker registry number; the reaper names it when it hands an item back).
--
-- The guard is a function of its own so that it reads the items with a
-- snapshot taken after the take: the statement's own snapshot predates the
-- queue's functions, and may show an item that a job taken here was sent for
-- (a retry of a failed item, a re-dispatch) as it was before it became pending.
--
-- One row per job taken (the queue's claim row, job_ as a prefix where a name
-- is the item's too, its turn, and item_id), then one per item that passed the
-- guard (job_id NULL, item_id and the guard's columns); an item with no row of
-- the second kind was a phantom: a duplicate or late delivery. Payloads come
-- back as text, parsed only when a handler reads them.
CREATE OR REPLACE FUNCTION {schema}.claim_items_v3(
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

-- claim_items_v3 with the guard of guard_items_v3, and each job's item
-- locked by a probe of its own (below).
CREATE OR REPLACE FUNCTION {schema}.claim_items_v4(
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

-- The phantom-retry guard, for many items at once: pending -> running with a
-- new fencing token (the attempt), recording the process that runs it
-- (p_holder), or nothing for an item already running, finished or cancelled (a
-- duplicate or late delivery). Returns each passed item with what its handler
-- needs; an id missing from the result was a phantom. Used by claim_items_v3
-- and, alone, for item jobs a worker got another way.
CREATE OR REPLACE FUNCTION {schema}.guard_items_v2(p_ids bigint[], p_now timestamptz, p_holder integer)
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

-- guard_items_v2 with its fence written so that no index can serve it
-- (status::text): the items are found by primary key whatever the
-- statistics say. With statistics taken while no item was pending, v2's
-- planner walked item_task_status's whole pending range with the ids as a
-- filter; at 1,000,000 items waiting each claim outran the statement timeout
-- and the task stalled (tests/test_claim_plan.py). Used by claim_items_v4.
CREATE OR REPLACE FUNCTION {schema}.guard_items_v3(p_ids bigint[], p_now timestamptz, p_holder integer)
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

-- Records finished runs and completes their jobs in one statement (one commit
-- for both): running -> completed for each (item, fence, result), and
-- complete_jobs_v1 for each (job, attempt) (none for the jobs claim_items_v3
-- took, which are gone already). Rows: ('item', id) for each item completed
-- now, ('job', id) for each job completed now, and ('task', NULL, task id) for
-- each task left with nothing pending or running, so the worker wakes the
-- aggregator. An item missing from the result lost its fence, or was completed
-- by this same run before (a write retried after a lost acknowledgement). A
-- NULL result is JSON null.
--
-- Whether a task has anything left is asked by item_left_v1 (below), from the
-- live end of the index.
CREATE OR REPLACE FUNCTION {schema}.complete_items_v2(
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

-- complete_items_v4 (migration 0013) with its fence written so that no
-- index can serve it (status::text), as guard_items_v3's: with statistics
-- taken while no item ran, v4's planner could walk item_task_status's
-- running range for each item written.
--
-- v4 was complete_items_v3 with the task's counts from its item_tally rows
-- (migration 0013) instead of its items: whether anything is left, and
-- whether only this write's items were running. Rows as in v3. v3 asked the
-- item index from its live end, which at a task's very end (nothing left
-- live) walked the whole range of dead entries, once for each of the last
-- writes: about 0.25 s at 1,000,000 items, which the close waited for.
--
-- 'tail': two writes that end a task's last items at once each see the
-- other's items still running (neither has committed), and neither alone
-- reports the task finished. A writer that gets 'tail' asks again once its
-- own write has committed (finished_tasks): whichever commits last sees
-- both, so one of them wakes the aggregator. The running probe is asked only
-- where nothing is pending, as v2's coalesce did.
CREATE OR REPLACE FUNCTION {schema}.complete_items_v5(
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

-- An item of the task other than p_except that is pending or running (its id),
-- or NULL: the probe of complete_items_v2, of finished_tasks and of the
-- aggregator's close.
--
-- It reads each status backward from its highest id (ORDER BY id DESC LIMIT 1
-- in a scalar subquery: an EXISTS would drop the order and scan forward).
-- Items are claimed in turn order, which within a task is id order, and every
-- claim and result writes a new row version with a new entry in
-- item_task_status; the old entries stay until vacuum. So a task's
-- (task_id, 'pending') and (task_id, 'running') ranges fill with dead entries
-- from their low-id end while the live ones sit at the high-id end: a forward
-- probe walked past every item finished so far (about 12 ms at 500,000
-- finished items, on each of a big task's thousands of result writes), where a
-- backward probe reads a few pages whatever the task's size. At the very end of
-- a task (nothing left live) both walk the whole range, once for each of the
-- last writes.
CREATE OR REPLACE FUNCTION {schema}.item_left_v1(p_task_id uuid, p_except bigint[])
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

-- ---- Counting items by status (item_tally, migration 0013)

-- The item table's trigger, once per UPDATE statement: adds to item_tally,
-- per task, how many items each status gained or lost in the statement and
-- the latest finish among them, in this session's row (backend). Progress and
-- the close sum a task's rows (queries.sql: progress, close_tasks) instead of
-- counting its items. A trigger, not a clause in each statement that changes
-- a status: no statement can forget it, the previous release's statements
-- during a rolling deploy included.
--
-- The transition tables hold the rows the statement changed, before and
-- after, so the counts are of what it did, rechecked rows included. The
-- rows are summed without a join: each row counts +1 for its new status and
-- -1 for its old one, and a row whose status did not change cancels out. It
-- costs about 1 us of server time a row changed (a claimed item and its
-- result: about 2 us), against reading a task's whole index range at each
-- poll and at the close.
--
-- Only this session writes its own rows, so it never waits for a lock, and
-- no two statements wait for each other in a cycle: no order is needed.
CREATE OR REPLACE FUNCTION {schema}.tally_items_v1()
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

-- ---- The SQL API: create a task from SQL (docs/batch.md, "From SQL")

-- The SQL API's stable name: `SELECT shoal.create_task('kind', '[...]')`. It
-- calls the current version, so callers never name a version.
CREATE OR REPLACE FUNCTION {schema}.create_task(kind text, items jsonb, options jsonb DEFAULT NULL)
RETURNS uuid
LANGUAGE sql
AS $$
    SELECT {schema}.create_task_v3(kind, items, options);
$$;

-- Creates a task of a stored kind with its items and their jobs, in the
-- caller's transaction: what Batches.create does (the same checks in the same
-- order, the same messages, SQLSTATE 22023 naming the field), except that the
-- payload cap (8 KiB) is measured on jsonb's text, the item cap is the default
-- 100,000, and the item jobs take shoal's defaults where the kind names no
-- option. An item may name its partition key (an entry {{"ref", "data",
-- "partition_key"}}); otherwise a kind partitioned by a field of the item's
-- data keys it from that field, and a kind partitioned by a function (which
-- only a process with the kind's code can run) refuses an item that names no
-- key, with InvalidInput naming items[i].partition_key. The key is kept on the
-- item row, and the item jobs are written by the queue's insert_item_jobs_v3
-- with those keys. A request whose items name no key has the fingerprint it
-- had before items could name one. Returns the
-- task's id; with an idempotency key already used for the same request (as
-- this function fingerprints it), that task's id. The same key for a different
-- request raises 23505; a concurrent create holding the key past 5 s raises
-- 55P03 (lock_timeout, the function's own setting, restored when it returns).
-- Workers are woken when the caller commits.
--
-- The fingerprint is of the request's jsonb, so it differs from the Python
-- API's (which hashes its own JSON text): a key is matched against requests
-- made through the same API.
CREATE OR REPLACE FUNCTION {schema}.create_task_v3(p_kind text, p_items jsonb, p_options jsonb)
RETURNS uuid
LANGUAGE plpgsql
-- A concurrent create with the same key holds the unique index entry until
-- it commits: wait for it this long, then answer "still being created".
-- The setting is the function's alone, restored when it returns.
SET lock_timeout = '5s'
AS $$
DECLARE
    v_known text[] := ARRAY['deadline', 'idempotency_key', 'params'];
    v_options jsonb := coalesce(p_options, '{{}}'::jsonb);
    v_kind {schema}.batch_kind;
    v_key text;
    v_value jsonb;
    v_idempotency_key text;
    v_deadline_s float8;
    v_params jsonb;
    v_total integer;
    v_dup bigint;
    v_entry jsonb;
    v_ord bigint;
    v_ref jsonb;
    v_data jsonb;
    v_unknown text;
    v_size integer;
    v_hash text;
    v_task uuid;
    v_existing record;
    v_partition jsonb;
    v_unkeyed bigint;
BEGIN
    SELECT * INTO v_kind FROM {schema}.batch_kind k WHERE k.kind = p_kind;
    IF NOT FOUND THEN
        PERFORM {schema}.invalid_input_v1('kind', format('unknown batch kind %s; known: %s',
            {schema}.value_text_v1(to_jsonb(p_kind)),
            coalesce((SELECT string_agg(k.kind, ', ' ORDER BY k.kind)
                      FROM {schema}.batch_kind k), 'none registered')));
    END IF;
    IF jsonb_typeof(v_options) <> 'object' THEN
        PERFORM {schema}.invalid_input_v1('options', 'must be a JSON object of task options, got '
            || {schema}.value_text_v1(v_options));
    END IF;
    FOR v_key IN SELECT key FROM jsonb_each(v_options) ORDER BY key LOOP
        IF NOT v_key = ANY(v_known) THEN
            PERFORM {schema}.invalid_input_v1(v_key, 'unknown task option; known: '
                || array_to_string(v_known, ', '));
        END IF;
    END LOOP;

    -- In the order of Batches.create: idempotency key, deadline, items, params.
    v_value := v_options -> 'idempotency_key';
    IF jsonb_typeof(v_value) IS DISTINCT FROM 'null' AND v_value IS NOT NULL THEN
        v_idempotency_key := v_value #>> '{{}}';
        IF jsonb_typeof(v_value) <> 'string' OR v_idempotency_key = ''
           OR length(v_idempotency_key) > 255 THEN
            PERFORM {schema}.invalid_input_v1('idempotency_key',
                'must be a non-empty string of at most 255 characters');
        END IF;
    END IF;
    v_value := v_options -> 'deadline';
    IF jsonb_typeof(v_value) IS DISTINCT FROM 'null' AND v_value IS NOT NULL THEN
        IF jsonb_typeof(v_value) <> 'number' THEN
            PERFORM {schema}.invalid_input_v1('deadline_s', 'must be a number of seconds, got '
                || {schema}.value_text_v1(v_value));
        END IF;
        -- Compared as numeric first: 1e400 is valid JSON but no float8.
        IF v_value::text::numeric <= 0 OR v_value::text::numeric > 10 * 365 * 86400 THEN
            PERFORM {schema}.invalid_input_v1('deadline_s',
                'must be a positive number of seconds, got ' || {schema}.value_text_v1(v_value));
        END IF;
        v_deadline_s := v_value::text::float8;
    END IF;

    IF jsonb_typeof(p_items) IS DISTINCT FROM 'array' THEN
        PERFORM {schema}.invalid_input_v1('items',
            'must be a list of refs or {{ref, data}} objects');
    END IF;
    v_total := jsonb_array_length(p_items);
    IF v_total = 0 THEN
        PERFORM {schema}.invalid_input_v1('items', 'is empty: a task needs at least one item');
    END IF;
    IF v_total > 100000 THEN
        PERFORM {schema}.invalid_input_v1('items',
            format('has %s entries, over the cap of 100000', v_total));
    END IF;
    -- The first entry whose ref an earlier entry has: Python finds it in its
    -- loop with a set. Found here in one pass, it is reported only when the
    -- loop below reaches it, so an invalid entry before it is reported first,
    -- as Python does (an entry whose ref is no string is invalid where it
    -- stands, so it can only end the loop before it could be a duplicate).
    SELECT min(d.ord) INTO v_dup
    FROM (
        SELECT r.ord, row_number() OVER (PARTITION BY r.ref ORDER BY r.ord) AS n
        FROM (
            SELECT u.ord - 1 AS ord,
                   CASE jsonb_typeof(u.e) WHEN 'string' THEN u.e #>> '{{}}'
                                          WHEN 'object' THEN u.e ->> 'ref' END AS ref
            FROM jsonb_array_elements(p_items) WITH ORDINALITY AS u(e, ord)
        ) r
        WHERE r.ref IS NOT NULL
    ) d
    WHERE d.n = 2;
    FOR v_entry, v_ord IN
        SELECT u.e, u.ord - 1 FROM jsonb_array_elements(p_items) WITH ORDINALITY AS u(e, ord)
    LOOP
        IF jsonb_typeof(v_entry) = 'object' THEN
            SELECT '[' || string_agg({schema}.value_text_v1(to_jsonb(k)), ', '
                                     ORDER BY k COLLATE "C") || ']'
            INTO v_unknown
            FROM jsonb_object_keys(v_entry) AS k
            WHERE k NOT IN ('ref', 'data', 'partition_key');
            IF v_unknown IS NOT NULL THEN
                PERFORM {schema}.invalid_input_v1(format('items[%s]', v_ord),
                    'unknown field(s) ' || v_unknown);
            END IF;
            v_data := v_entry -> 'data';
            IF jsonb_typeof(v_data) <> 'null' THEN
                v_size := octet_length(v_data::text);
                IF v_size > 8192 THEN
                    PERFORM {schema}.invalid_input_v1(format('items[%s].data', v_ord), format(
                        'payload is %s bytes, over the 8192-byte cap; send ids and load the '
                        'documents in the handler', v_size));
                END IF;
            END IF;
            v_ref := coalesce(v_entry -> 'ref', 'null'::jsonb);
        ELSE
            v_ref := v_entry;
        END IF;
        IF jsonb_typeof(v_ref) <> 'string' OR (v_ref #>> '{{}}') = ''
           OR length(v_ref #>> '{{}}') > 512 THEN
            PERFORM {schema}.invalid_input_v1(format('items[%s].ref', v_ord),
                'must be a non-empty string of at most 512 characters without NUL, got '
                || left({schema}.value_text_v1(v_ref), 80));
        END IF;
        IF v_ord = v_dup THEN
            PERFORM {schema}.invalid_input_v1(format('items[%s].ref', v_ord),
                'duplicate ref ' || {schema}.value_text_v1(v_ref));
        END IF;
        -- A string or an integer, as shoal.queue.limits.partition_key_of
        -- takes it (the type named as Python names the decoded value); null
        -- is no key.
        v_partition := CASE jsonb_typeof(v_entry) WHEN 'object'
                            THEN coalesce(v_entry -> 'partition_key', 'null') ELSE 'null' END;
        IF jsonb_typeof(v_partition) = 'string'
           OR (jsonb_typeof(v_partition) = 'number' AND v_partition::text ~ '^-?[0-9]+$') THEN
            IF length(v_partition #>> '{{}}') > 512 THEN
                PERFORM {schema}.invalid_input_v1(format('items[%s].partition_key', v_ord),
                    'must be at most 512 characters, without NUL');
            END IF;
        ELSIF jsonb_typeof(v_partition) <> 'null' THEN
            PERFORM {schema}.invalid_input_v1(format('items[%s].partition_key', v_ord),
                'a partition key must be a string or an integer, got '
                || CASE jsonb_typeof(v_partition) WHEN 'boolean' THEN 'bool'
                        WHEN 'number' THEN 'float' WHEN 'array' THEN 'list'
                        ELSE 'dict' END);
        END IF;
    END LOOP;
    -- A kind partitioned by a function: only a process with the kind's code
    -- can key an item that names no key of its own, as CreatePlan says.
    IF v_kind.partition_function IS NOT NULL THEN
        SELECT min(u.ord) - 1 INTO v_unkeyed
        FROM jsonb_array_elements(p_items) WITH ORDINALITY AS u(e, ord)
        WHERE jsonb_typeof(u.e) <> 'object'
           OR jsonb_typeof(u.e -> 'partition_key') IS NULL
           OR jsonb_typeof(u.e -> 'partition_key') = 'null';
        IF v_unkeyed IS NOT NULL THEN
            PERFORM {schema}.invalid_input_v1(format('items[%s].partition_key', v_unkeyed),
                format('batch kind %s is partitioned by %s, which runs only in a process with '
                       'the kind''s code (Batches of its App); give each item a partition_key',
                       {schema}.value_text_v1(to_jsonb(p_kind)), v_kind.partition_function));
        END IF;
    END IF;

    v_params := coalesce(v_options -> 'params', 'null'::jsonb);
    v_size := octet_length(v_params::text);
    IF v_size > 8192 THEN
        PERFORM {schema}.invalid_input_v1('params', format('payload is %s bytes, over the '
            '8192-byte cap; send ids and load the documents in the handler', v_size));
    END IF;

    -- The request's fingerprint: "a" and {{"ref": "a", "data": null}} are the
    -- same item, as in Python.
    SELECT 'sql1:' || encode(sha256(convert_to(jsonb_build_array(
               p_kind, v_params, v_deadline_s,
               jsonb_agg(jsonb_build_array(
                   CASE jsonb_typeof(u.e) WHEN 'string' THEN u.e #>> '{{}}' ELSE u.e ->> 'ref' END,
                   CASE jsonb_typeof(u.e) WHEN 'object' THEN coalesce(u.e -> 'data', 'null')
                                          ELSE 'null' END)
                   -- An item's key, when it names one, is part of the request;
                   -- one without a key is fingerprinted as create_task_v2 did.
                   || CASE WHEN jsonb_typeof(u.e -> 'partition_key') IN ('string', 'number')
                           THEN jsonb_build_array(u.e ->> 'partition_key')
                           ELSE '[]'::jsonb END
                   ORDER BY u.ord))::text, 'UTF8')), 'hex')
    INTO v_hash
    FROM jsonb_array_elements(p_items) WITH ORDINALITY AS u(e, ord);

    BEGIN
        INSERT INTO {schema}.task (
            kind, idempotency_key, request_hash, params, total, max_attempts, zombie_timeout,
            deadline_at, item_queue, job_options, on_complete_queue, created_at)
        VALUES (
            p_kind, v_idempotency_key, v_hash, v_params, v_total, v_kind.max_attempts,
            v_kind.zombie_timeout, now() + v_deadline_s * interval '1 second',
            v_kind.item_queue, v_kind.job_options, v_kind.on_complete_queue, now())
        ON CONFLICT (idempotency_key) DO NOTHING
        RETURNING id INTO v_task;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'idempotency_key %: an identical request is still being created; '
            'retry shortly', {schema}.value_text_v1(to_jsonb(v_idempotency_key))
            USING ERRCODE = '55P03', COLUMN = 'idempotency_key';
    END;
    IF v_task IS NULL THEN
        SELECT t.id, t.request_hash INTO v_existing
        FROM {schema}.task t WHERE t.idempotency_key = v_idempotency_key;
        IF v_existing.request_hash IS DISTINCT FROM v_hash THEN
            RAISE EXCEPTION 'idempotency_key % was used for a different request (task %)',
                {schema}.value_text_v1(to_jsonb(v_idempotency_key)), v_existing.id
                USING ERRCODE = '23505', COLUMN = 'idempotency_key';
        END IF;
        RETURN v_existing.id;
    END IF;

    -- The items in input order and one job each, as the insert_items query
    -- of shoal/batch/queries.sql writes them: each item keyed by its own
    -- partition_key, else by its kind's partition field ('' when its data
    -- has none), else not at all (its kind is not partitioned).
    WITH items AS (
        INSERT INTO {schema}.item (task_id, ref, data, partition_key, updated_at)
        SELECT v_task,
               CASE jsonb_typeof(u.e) WHEN 'string' THEN u.e #>> '{{}}' ELSE u.e ->> 'ref' END,
               CASE jsonb_typeof(u.e) WHEN 'object' THEN coalesce(u.e -> 'data', 'null')
                                      ELSE 'null' END,
               CASE WHEN jsonb_typeof(u.e -> 'partition_key') IN ('string', 'number')
                    THEN u.e ->> 'partition_key'
                    WHEN v_kind.partition_field IS NOT NULL
                    THEN coalesce(u.e -> 'data' ->> v_kind.partition_field, '') END,
               now()
        FROM jsonb_array_elements(p_items) WITH ORDINALITY AS u(e, ord)
        ORDER BY u.ord
        RETURNING id, partition_key
    )
    SELECT {schema}.insert_item_jobs_v3(
        ARRAY(SELECT id FROM items ORDER BY id),
        ARRAY(SELECT 'item-' || id || ':0' FROM items ORDER BY id),
        ARRAY(SELECT partition_key FROM items ORDER BY id),
        v_kind.item_queue,
        coalesce((v_kind.job_options ->> 'priority')::integer, 0),
        coalesce((v_kind.job_options ->> 'retry_limit')::integer, 2),
        coalesce((v_kind.job_options ->> 'retry_delay')::float8, 0),
        coalesce((v_kind.job_options ->> 'retry_backoff')::boolean, false),
        coalesce((v_kind.job_options ->> 'retry_delay_max')::float8, 3600),
        coalesce((v_kind.job_options ->> 'expire_in')::float8, 900),
        v_kind.job_options ->> 'dead_letter', NULL, NULL, NULL)
    INTO v_size;
    -- The schema's channel, as the Python clients name it ("<schema>_jobs").
    PERFORM pg_notify(n.nspname || '_jobs', v_kind.item_queue)
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = '{schema}.task'::regclass;
    RETURN v_task;
END;
$$;
