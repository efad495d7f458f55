-- The batch layer's part of shoal 0.2.0's schema change from 0.1.0: the
-- migrations written while 0.2.0 was developed (steps 4-36, in their order),
-- folded into one file per layer at the release. Only the database functions
-- 0.2.0's code calls are created; versions replaced before the release never
-- shipped and are left out. Each live function's definition and the reasons
-- for it are in shoal/batch/functions.sql; the comments below say why each
-- table, column and index change is made, step by step.

-- ---- step 5 of the development of 0.2.0 ----
-- Level 2, revised claim: item jobs are taken without ever waiting for a lock.
--
-- Lock order, for every statement that touches items and jobs: job rows
-- first, then item rows, and only the claim holds a job row while it locks an
-- item. The claim (claim_items below) locks waiting jobs with SKIP LOCKED and
-- then their items with SKIP LOCKED: it never waits, so it cannot be part of
-- a cycle of waits. Every other writer locks item rows (the worker's
-- fail_item and hand_back_items, the aggregator's reap_zombies and
-- sweep_orphans, cancel, retry-failed) and then at most inserts NEW jobs for
-- those items; an insert waits on a job row only when an uncommitted job
-- holds the same singleton key, and only a claim taking that very job can be
-- uncommitted with it, and a claim never waits. (0002's claim_items waited for
-- item rows while holding the jobs it had taken: with the old sweep, which
-- re-sent jobs for items whose job was still waiting, that was a deadlock.)

-- True while a worker's handler runs the item's current run: set by the
-- worker a moment after the handler starts (marks of many items share one
-- statement; a handler done sooner is never marked), cleared when it ends.
-- The guard (claim) leaves it false: a running item without it is claimed
-- and waiting in its worker's buffer, or finished with its result not yet
-- recorded. Progress counts only marked items as running, so a kind's
-- concurrency bounds what users see running in one worker; the others are
-- shown as pending (waiting for a handler).
ALTER TABLE {schema}.item ADD COLUMN in_handler boolean NOT NULL DEFAULT false;

-- The phantom guard of 0002_batch.sql, for jobs a worker did not claim
-- through claim_items; it also leaves the new run unmarked.
CREATE OR REPLACE FUNCTION {schema}.guard_items(p_ids bigint[], p_now timestamptz)
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

-- A worker's claim of item jobs, with the guard of their items, in one
-- statement (see 0002_batch.sql for the row shapes, unchanged). Unlike 0002's,
-- it walks job_item_turn (jobs without a turn, then by turn: see above), and
-- it locks the items of the jobs it picked with SKIP LOCKED and takes only
-- the jobs whose items it holds: a job whose item another transaction holds
-- for a moment stays waiting for the next claim instead of making this one
-- wait. (So does a job naming no item, which shoal never sends: items are
-- never deleted.)
CREATE OR REPLACE FUNCTION {schema}.claim_items(p_queue text, p_limit integer, p_now timestamptz)
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
    -- As take_jobs: the claim need not wait for its WAL flush (lost to a
    -- server crash, the take and the guard are both undone).
    SELECT set_config('synchronous_commit', 'off', true);
    WITH next AS (
        SELECT j.id, (j.data->>'item')::bigint AS item_id
        FROM {schema}.job j
        WHERE j.queue = p_queue
          AND j.state IN ('created', 'retry')
          AND j.data ? 'item'
          AND j.start_after <= coalesce(p_now, now())
          AND NOT EXISTS (SELECT 1 FROM {schema}.paused_queue p WHERE p.queue = p_queue)
        ORDER BY j.priority DESC, (j.data->'turn') NULLS FIRST, j.id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), held AS (
        -- The lock the guard's update takes, taken here without waiting: a
        -- job whose item is locked drops out of the join. Each item is
        -- reached by one primary-key probe per job (no comparison of every
        -- job with every item: the planner switches rule out hashing).
        SELECT n.id, n.item_id
        FROM next n
        JOIN {schema}.item i ON i.id = n.item_id
        FOR NO KEY UPDATE OF i SKIP LOCKED
    ), taken AS (
        UPDATE {schema}.job j
        SET state = 'completed',
            attempt = j.attempt + 1,
            started_at = coalesce(p_now, now()),
            finished_at = coalesce(p_now, now())
        FROM held n
        WHERE j.id = n.id
        RETURNING j.id, j.queue, j.data, j.priority, j.attempt, j.retry_limit, j.retry_delay,
                  j.retry_backoff, j.retry_delay_max, j.expire_in, j.singleton_key,
                  j.dead_letter, j.created_at, j.started_at, n.item_id
    ), guarded AS (
        UPDATE {schema}.item i
        SET status = 'running',
            attempt = i.attempt + 1,
            in_handler = false,
            started_at = coalesce(p_now, now()),
            updated_at = coalesce(p_now, now())
        FROM {schema}.task t
        WHERE i.id = ANY(ARRAY(SELECT c.item_id FROM taken c)) AND i.status = 'pending'
          AND t.id = i.task_id
        RETURNING i.id, i.attempt, i.attempt - i.attempt_base AS run, i.ref, i.data, i.task_id,
                  t.kind, t.params, t.max_attempts
    )
    SELECT c.id, c.queue, c.data::text, c.priority, c.attempt, c.retry_limit,
           extract(epoch FROM c.retry_delay)::float8, c.retry_backoff,
           extract(epoch FROM c.retry_delay_max)::float8, extract(epoch FROM c.expire_in)::float8,
           c.singleton_key, c.dead_letter, c.created_at, c.started_at, NULL::timestamptz,
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

-- ---- step 12 of the development of 0.2.0 ----
-- Batch kinds known to the database, and creating a task from SQL
-- (docs/batch.md, "Creating a task from synchronous code and SQL").
--
-- batch_kind: what creating a task of a kind needs of it, written by a
-- worker's start for each kind its App declares (the last start wins), read
-- by creators that do not hold the kind's code: shoal.SyncBatches and
-- create_task(). The handler, classifier and hook stay in the worker's
-- code; a task's row copies these values, so a kind changed later changes
-- no task already created.
CREATE TABLE {schema}.batch_kind (
    kind              text COLLATE "C" PRIMARY KEY CHECK (length(kind) BETWEEN 1 AND 128),
    max_attempts      integer NOT NULL CHECK (max_attempts > 0),
    zombie_timeout    interval NOT NULL CHECK (zombie_timeout > interval '0'),
    item_queue        text COLLATE "C" NOT NULL,
    -- The options of the item jobs, as BatchKind.job_options gives them
    -- (durations in seconds): retry_limit, retry_delay, retry_backoff,
    -- expire_in, priority.
    job_options       jsonb NOT NULL CHECK (jsonb_typeof(job_options) = 'object'),
    on_complete_queue text COLLATE "C",
    updated_at        timestamptz NOT NULL
);

-- ---- step 16 of the development of 0.2.0 ----

-- item_left_v1: its definition and the reasons for it are in shoal/batch/functions.sql.
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

-- complete_items_v2: its definition and the reasons for it are in shoal/batch/functions.sql.
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

-- ---- step 20 of the development of 0.2.0 ----
-- job_item_turn (step 5) on the job table that
-- step 19 built again: the same index, by the
-- same name, so the item claim (lock_item_jobs_v1) walks it as before.
CREATE INDEX job_item_turn ON {schema}.job
    (queue, priority DESC, (data -> 'turn') NULLS FIRST, id)
    WHERE state IN ('created', 'retry') AND data ? 'item';

-- ---- step 34 of the development of 0.2.0 ----
-- Items name the worker process that runs them, as jobs do (step 31).
--
-- Why. A job held by a process whose heartbeat stopped is handed back with a
-- note naming that process (step 31); an item
-- whose worker died was reaped with a note giving only its last sign of
-- life. The guard that moves an item pending -> running now records the
-- claiming process's registry number (item.holder, 4 bytes in a row the guard
-- writes anyway), and the reaper names it (worker_named_v1, 0033).
--
-- guard_items_v2 and claim_items_v3 are guard_items_v1
-- (step 7) and claim_items_v2
-- (step 24) with that one column more; v1 and v2
-- stay for the previous release's workers, whose items name no holder.
ALTER TABLE {schema}.item ADD COLUMN holder integer;

-- guard_items_v2: its definition and the reasons for it are in shoal/batch/functions.sql.
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

-- claim_items_v3: its definition and the reasons for it are in shoal/batch/functions.sql.
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

-- ---- step 36 of the development of 0.2.0 ----
-- Items keep their partition key: a batch kind can be partitioned.
--
-- Why. A kind's limits (global_concurrency, rate_limit) were counted for the
-- whole kind: partition_by was refused, because an item's key would come
-- from the item's data, which its jobs do not carry (their data is the
-- item's id), and a job sent again for an item (after a reap, an orphan
-- sweep, a retry-failed, a hand-back at shutdown) had nothing to key it by.
-- Now each item is keyed once, when its task is created (where its data is
-- at hand, and the kind's partition_by function if it has one), and keeps
-- its key on its row (item.partition_key); every job of the item is sent
-- with it (insert_item_jobs_v3 in 0035, or the queue's insert with the key
-- given), so a retried, rescued or re-sent item stays in its partition.
--
-- item.partition_key: the key the item named itself, else the one its kind's
-- partition_by gave it ('' for data without the field); NULL when its kind
-- was not partitioned and it named none. A nullable column without a
-- default: adding it rewrites nothing, and an item without a key stores
-- nothing more.
ALTER TABLE {schema}.item ADD COLUMN partition_key text COLLATE "C";

-- How a kind is partitioned, stored with its other settings for creators
-- without its code (SyncBatches, create_task()): by a field of the item's
-- data (read by them), or by a function (named here; only a process with
-- the kind's code can run it, so they take only items that name their key).
ALTER TABLE {schema}.batch_kind
    ADD COLUMN partition_field text,
    ADD COLUMN partition_function text,
    ADD CONSTRAINT batch_kind_partitioned_once
        CHECK (partition_field IS NULL OR partition_function IS NULL);

-- create_task_v3: its definition and the reasons for it are in shoal/batch/functions.sql.
CREATE FUNCTION {schema}.create_task_v3(p_kind text, p_items jsonb, p_options jsonb)
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

-- create_task: its definition and the reasons for it are in shoal/batch/functions.sql.
CREATE OR REPLACE FUNCTION {schema}.create_task(kind text, items jsonb, options jsonb DEFAULT NULL)
RETURNS uuid
LANGUAGE sql
AS $$
    SELECT {schema}.create_task_v3(kind, items, options);
$$;
