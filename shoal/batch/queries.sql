-- SQL of the batch layer. Run only by shoal/batch/store.py and sync_store.py.
-- Every time-dependent statement takes %(now)s; NULL means the database clock.

-- name: insert_task
-- Creates the task; with an idempotency key already used, inserts nothing
-- (the unique index decides, so two racing requests cannot both create).
INSERT INTO {schema}.task (
    kind, idempotency_key, request_hash, params, total, max_attempts, zombie_timeout,
    deadline_at, item_queue, job_options, on_complete_queue, created_at)
VALUES (
    %(kind)s, %(idempotency_key)s, %(request_hash)s, %(params)s::jsonb, %(total)s,
    %(max_attempts)s, %(zombie_timeout_s)s * interval '1 second',
    coalesce(%(now)s::timestamptz, now()) + %(deadline_s)s * interval '1 second',
    %(item_queue)s, %(job_options)s::jsonb, %(on_complete_queue)s,
    coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id::text

-- name: analyze_items
-- Fresh statistics of the item table, after a create of many items (see
-- Batches.create): an autovacuum that ran while the create was in flight
-- counted none of its uncommitted rows, and until the table was analyzed
-- again the planner took it for empty and probed items through
-- item_task_status, a walk of the whole index per probe.
ANALYZE {schema}.item

-- name: task_by_key
SELECT id::text, request_hash FROM {schema}.task WHERE idempotency_key = %(idempotency_key)s

-- name: set_lock_timeout
-- Sets lock_timeout for the rest of this transaction and returns the value in
-- force before, so a create in the caller's transaction can put it back. The
-- subquery is fenced (OFFSET 0) so the old value is read before the new is set.
SELECT b.before, set_config('lock_timeout', %(timeout)s, true)
FROM (SELECT current_setting('lock_timeout') AS before OFFSET 0) b

-- name: raise_statement_timeout
-- Raises statement_timeout to %(ms)s milliseconds for the rest of this
-- transaction (never lowers it; 0, no limit, stays) and returns the value in
-- force before, to be set back with set_statement_timeout: a create of more
-- items than one deadline covers writes them in one statement given as long
-- as its size needs (create_deadline in plans.py).
SELECT b.before,
       set_config('statement_timeout',
                  CASE WHEN b.ms = 0 OR b.ms >= %(ms)s THEN b.before ELSE %(ms)s::text END, true)
FROM (SELECT current_setting('statement_timeout') AS before,
             (SELECT setting::bigint FROM pg_settings WHERE name = 'statement_timeout') AS ms
      OFFSET 0) b

-- name: set_statement_timeout
-- Sets statement_timeout for the rest of this transaction (back to what
-- raise_statement_timeout returned).
SELECT set_config('statement_timeout', %(timeout)s, true)

-- name: put_kinds
-- Creates or replaces the stored settings of these kinds (a worker's start),
-- for creators without the kinds' code (SyncBatches, create_task() in SQL).
-- In kind order, so two workers starting at once lock the rows in one order.
INSERT INTO {schema}.batch_kind (
    kind, max_attempts, zombie_timeout, item_queue, job_options, on_complete_queue,
    partition_field, partition_function, updated_at)
SELECT u.kind, u.max_attempts, u.zombie_timeout_s * interval '1 second', u.item_queue,
       u.job_options::jsonb, u.on_complete_queue, u.partition_field, u.partition_function,
       coalesce(%(now)s::timestamptz, now())
FROM unnest(%(kinds)s::text[], %(max_attempts)s::int[], %(zombie_timeout_s)s::float8[],
            %(item_queues)s::text[], %(job_options)s::text[], %(on_complete_queues)s::text[],
            %(partition_fields)s::text[], %(partition_functions)s::text[])
     AS u(kind, max_attempts, zombie_timeout_s, item_queue, job_options, on_complete_queue,
          partition_field, partition_function)
ORDER BY u.kind
ON CONFLICT (kind) DO UPDATE
SET max_attempts = excluded.max_attempts, zombie_timeout = excluded.zombie_timeout,
    item_queue = excluded.item_queue, job_options = excluded.job_options,
    on_complete_queue = excluded.on_complete_queue, partition_field = excluded.partition_field,
    partition_function = excluded.partition_function, updated_at = excluded.updated_at

-- name: get_kinds
-- Every stored kind (a handful of rows), for a create by a client without the kinds' code.
SELECT kind, max_attempts, extract(epoch FROM zombie_timeout)::float8, item_queue, job_options,
       on_complete_queue, partition_field, partition_function
FROM {schema}.batch_kind
ORDER BY kind

-- name: insert_items
-- The task's items and one job per item, in one statement; returns how many
-- jobs were sent. Items are numbered in input order. The jobs are the queue's
-- to write (insert_item_jobs_v3 in shoal/queue/migrations, which gives the
-- jobs of a kind with limits their partition key): each carries its item's
-- id and its turn, and the singleton key item-<id>:0 (the key of an item's
-- first run; see dispatch_items in aggregator.py). The options are
-- the queue's insert_jobs ones, shared by every job of the task: written
-- here, the ids of 100,000 items never travel to the client and back as
-- 100,000 payloads. A NULL data entry (or none at all) is JSON null.
-- Each item keeps its partition key (CreatePlan): the one in partition_keys
-- (an empty array when no item has one), else, for a kind partitioned by a
-- field (partition_field), that field of its data ('' when absent), else
-- none; its job gets it. Only a keyed task (keyed) passes its keys on: an
-- array of 100,000 NULLs is not built for a kind without.
WITH items AS (
    INSERT INTO {schema}.item (task_id, ref, data, partition_key, updated_at)
    SELECT %(task_id)s::uuid, u.ref, coalesce(u.data::jsonb, 'null'),
           coalesce(u.partition_key,
                    CASE WHEN %(partition_field)s::text IS NOT NULL
                         THEN coalesce(u.data::jsonb ->> %(partition_field)s::text, '') END),
           coalesce(%(now)s::timestamptz, now())
    FROM unnest(%(refs)b::text[], %(data)b::text[], %(partition_keys)b::text[])
        WITH ORDINALITY AS u(ref, data, partition_key, ord)
    ORDER BY u.ord
    RETURNING id, partition_key
)
SELECT {schema}.insert_item_jobs_v3(
    ARRAY(SELECT id FROM items), ARRAY(SELECT 'item-' || id || ':0' FROM items),
    CASE WHEN %(keyed)s::bool THEN ARRAY(SELECT partition_key FROM items)
         ELSE '{{}}'::text[] END,
    %(queue)s::text, %(priority)s::int, %(retry_limit)s::int, %(retry_delay_s)s::float8,
    %(retry_backoff)s::bool, %(retry_delay_max_s)s::float8, %(expire_in_s)s::float8,
    %(dead_letter)s::text, %(start_at)s::timestamptz, %(start_in_s)s::float8,
    %(now)s::timestamptz)

-- name: guard_items
-- The phantom-retry guard for many items (guard_items_v3 in
-- shoal/batch/functions.sql: it records %(holder)s, this
-- process's registry number, on each): each passed item's new fencing
-- token and what its handler needs, under the names of the guard columns of
-- claim_items below; an id missing from the result was a phantom. Payloads
-- come back as text, parsed only when a handler reads them.
SELECT id AS item_id, attempt AS fence, run, ref, data::text AS item_data, task_id::text, kind,
       params::text, max_attempts
FROM {schema}.guard_items_v3(%(ids)s::bigint[], %(now)s::timestamptz, %(holder)s::int)

-- name: claim_items
-- A worker's claim of item jobs with the guard of their items, in one round
-- trip, from the head of job_item_turn or after the position
-- (%(after_priority)s, %(after_turn)s, %(after_id)s) in it (claim_items_v4 in
-- shoal/batch/functions.sql, whose guard records %(holder)s on the items): one row per job taken,
-- with the queue's claim row under its own names and the job's turn, then the
-- guard columns for its item (all NULL for a phantom), in the claim's order
-- (the take returns them by id), so the worker runs them in turns. Read by
-- name. The function returns jobs and guarded items as rows of their own;
-- they are paired here, where the planner may hash them.
WITH c AS MATERIALIZED (
    SELECT * FROM {schema}.claim_items_v4(%(queue)s, %(limit)s, %(now)s::timestamptz,
                                          %(after_priority)s::int, %(after_turn)s::bigint,
                                          %(after_id)s::bigint, %(holder)s::int)
)
SELECT j.job_id AS id, j.queue, j.job_data AS data, j.priority, j.job_attempt AS attempt,
       j.retry_limit, j.retry_delay_s, j.retry_backoff, j.retry_delay_max_s, j.expire_in_s,
       j.singleton_key, j.dead_letter, j.created_at, j.started_at, j.lease_expires_at, j.turn,
       g.item_id, g.fence, g.run, g.ref, g.data AS item_data, g.task_id, g.kind, g.params,
       g.max_attempts
FROM c j
LEFT JOIN c g ON g.job_id IS NULL AND g.item_id = j.item_id
WHERE j.job_id IS NOT NULL
ORDER BY j.priority DESC, j.turn NULLS FIRST, j.job_id

-- name: complete_items
-- Records finished runs and completes their jobs in one statement
-- (complete_items_v5, shoal/batch/functions.sql).
-- Arrays come as text literals.
SELECT what, id, task_id::text
FROM {schema}.complete_items_v5(
    %(ids)s::bigint[], %(attempts)s::int[], %(results)s::jsonb[], %(job_ids)s::bigint[],
    %(job_attempts)s::int[], %(now)s::timestamptz)

-- name: completed_items
-- Which of these items are completed under the given fence: a write retried
-- after its acknowledgement was lost finds its results recorded.
SELECT i.id
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS u(id, attempt)
JOIN {schema}.item i ON i.id = u.id
WHERE i.id = ANY(%(ids)s::bigint[]) AND i.status = 'completed' AND i.attempt = u.attempt

-- name: fail_item
-- running -> error (permanent, or no attempts left) | pending (transient, to be
-- retried by the job's backoff), fenced by attempt; the error is appended.
-- Each history entry is numbered here, from the row: attempt is the item's
-- run count over its whole life (the fencing token, which retry-failed never
-- resets), run its run since it was last (re)opened, started_at the run's
-- start; the caller's entry gives the end (at) and the error.
UPDATE {schema}.item
SET status = %(status)s::{schema}.item_status,
    error = %(message)s,
    errors = errors || jsonb_build_array(%(entry)s::jsonb || jsonb_build_object(
        'attempt', attempt, 'run', attempt - attempt_base, 'started_at', started_at)),
    finished_at = CASE WHEN %(status)s = 'error' THEN coalesce(%(now)s::timestamptz, now()) END,
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(item_id)s AND status = 'running' AND attempt = %(attempt)s
RETURNING id, partition_key

-- name: hand_back_items
-- running -> pending for runs that cost no attempt: those our own shutdown
-- stopped (guarded but never started, or cut off after the grace period), and
-- those whose handler snoozed (Snooze, RetryAfter), fenced by attempt. No
-- attempt is spent: attempt (the fencing token) stays monotonic, and
-- attempt_base moves up with it, so the runs counted (attempt - attempt_base)
-- are as before the run. Not an error either: the item's error is left
-- alone, and a note of %(type)s ("Interrupted", "Snoozed", "RetryAfter") is
-- appended to its history. Returns the items handed back, as dispatches of a
-- new job.
UPDATE {schema}.item i
SET status = 'pending',
    attempt_base = i.attempt_base + 1,
    errors = i.errors || jsonb_build_array(jsonb_build_object(
        'attempt', i.attempt, 'run', i.attempt - i.attempt_base, 'started_at', i.started_at,
        'at', coalesce(%(now)s::timestamptz, now()),
        'type', %(type)s::text, 'message', %(message)s::text, 'traceback', NULL)),
    finished_at = NULL,
    updated_at = coalesce(%(now)s::timestamptz, now())
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS u(id, attempt), {schema}.task t
WHERE i.id = ANY(%(ids)s::bigint[]) AND i.id = u.id AND i.status::text = 'running'
  AND i.attempt = u.attempt AND t.id = i.task_id
RETURNING i.id, i.attempt, i.status::text, t.item_queue, t.job_options,
          i.partition_key

-- name: mark_handlers
-- Marks running items whose handler runs now (on = true) and unmarks those
-- whose handler ended before their result was recorded (on = false), fenced
-- by attempt, in one statement; an item finished or reaped meanwhile is left
-- alone. Returns the ids changed.
UPDATE {schema}.item i
SET in_handler = u.on_
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(on)s::boolean[]) AS u(id, attempt, on_)
WHERE i.id = ANY(%(ids)s::bigint[]) AND i.id = u.id AND i.status::text = 'running'
  AND i.attempt = u.attempt AND i.in_handler <> u.on_
RETURNING i.id

-- name: heartbeat_items
-- Sign of life for running items, fenced by attempt; returns those still held.
UPDATE {schema}.item i
SET updated_at = coalesce(%(now)s::timestamptz, now())
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS u(id, attempt)
WHERE i.id = ANY(%(ids)s::bigint[]) AND i.id = u.id AND i.status::text = 'running'
  AND i.attempt = u.attempt
RETURNING i.id

-- name: reap_zombies
-- Running items whose last sign of life is older than their task's zombie
-- timeout: back to pending while attempts remain (and the task is not being
-- cancelled), else error. The update repeats the state and heartbeat horizon
-- after taking the row lock, so an item that finished or heartbeated a moment
-- earlier is never touched. Judged by updated_at, never started_at.
-- Only processing tasks can hold running items (a task closes once none is
-- pending or running), and only those created a zombie timeout ago can hold
-- stale ones (no item's updated_at is older than its task): their running
-- items are found through item_task_status, and a young task costs one probe.
WITH stale AS (
    SELECT i.id
    FROM {schema}.task t
    JOIN {schema}.item i ON i.task_id = t.id AND i.status = 'running'
    WHERE t.status = 'processing'
      AND t.created_at < coalesce(%(now)s::timestamptz, now()) - t.zombie_timeout
      AND i.updated_at < coalesce(%(now)s::timestamptz, now()) - t.zombie_timeout
    ORDER BY i.updated_at
    LIMIT %(limit)s
    FOR UPDATE OF i SKIP LOCKED
)
UPDATE {schema}.item i
SET status = CASE WHEN i.attempt - i.attempt_base < t.max_attempts AND t.cancel_reason IS NULL
                  THEN 'pending' ELSE 'error' END::{schema}.item_status,
    error = 'no sign of life for ' || t.zombie_timeout::text || ' (worker crashed or hung)',
    errors = i.errors || jsonb_build_array(jsonb_build_object(
        'attempt', i.attempt, 'run', i.attempt - i.attempt_base, 'started_at', i.started_at,
        'at', coalesce(%(now)s::timestamptz, now()),
        'type', 'Zombie', 'message',
        'no sign of life since ' || i.updated_at::text
        || coalesce(' from worker process ' || {schema}.worker_named_v1(i.holder), '')
        || '; reaped by the aggregator',
        'traceback', NULL)),
    finished_at = CASE WHEN i.attempt - i.attempt_base < t.max_attempts AND t.cancel_reason IS NULL
                       THEN NULL ELSE coalesce(%(now)s::timestamptz, now()) END,
    updated_at = coalesce(%(now)s::timestamptz, now())
FROM stale, {schema}.task t
WHERE i.id = stale.id AND t.id = i.task_id
  AND i.status = 'running'
  AND i.updated_at < coalesce(%(now)s::timestamptz, now()) - t.zombie_timeout
RETURNING i.id, i.attempt, i.status::text, t.item_queue, t.job_options,
          i.partition_key

-- name: sweep_orphans
-- Pending items that truly have no job: no job of their queue with their
-- singleton key (item-<id>:<attempt>, the key every dispatch of the item's
-- current run uses) is waiting or active. Such an item is stranded (its job
-- was cancelled or deleted through the queue's API, say); it is touched and
-- handed back for a re-dispatch. A pending item whose job waits is not an
-- orphan, however long it has waited: it is neither locked nor touched, so
-- the sweep never queues behind a claim taking that job (see the lock order
-- at the top of shoal/batch/functions.sql). Each pass examines at most %(limit)s pending
-- items older than a zombie timeout, in index order (a task's oldest items
-- first), with one lookup in job_singleton each: a queue of 100,000 waiting
-- items costs a pass no more than a small one, and an orphan deep in a queue
-- is found once the items ahead of it have run (its task cannot close
-- before). Tasks younger than a zombie timeout are skipped by their creation
-- time, as in reap_zombies. The candidates carry their job's queue and key,
-- and the probe is the queue's singleton_held_v1, a function the planner
-- cannot inline, so job_singleton is searched by both for each candidate
-- whatever the statistics say (written as a NOT EXISTS, the probe lets the
-- planner compare every job of the queue with each item, and a pass over a
-- 50,000-item queue takes 10-14 s).
WITH candidates AS MATERIALIZED (
    SELECT i.id, t.item_queue AS queue, 'item-' || i.id || ':' || i.attempt AS singleton_key
    FROM {schema}.task t
    JOIN {schema}.item i ON i.task_id = t.id AND i.status = 'pending'
    WHERE t.status = 'processing'
      AND t.created_at < coalesce(%(now)s::timestamptz, now()) - t.zombie_timeout
      AND i.updated_at < coalesce(%(now)s::timestamptz, now()) - t.zombie_timeout
    LIMIT %(limit)s
), orphans AS (
    SELECT i.id
    FROM candidates c
    JOIN {schema}.item i ON i.id = c.id
    WHERE i.status = 'pending'
      AND NOT {schema}.singleton_held_v1(c.queue, c.singleton_key)
    FOR UPDATE OF i SKIP LOCKED
)
UPDATE {schema}.item i
SET updated_at = coalesce(%(now)s::timestamptz, now())
FROM orphans, {schema}.task t
WHERE i.id = orphans.id AND t.id = i.task_id AND i.status = 'pending'
RETURNING i.id, i.attempt, i.status::text, t.item_queue, t.job_options,
          i.partition_key

-- name: expire_deadlines
-- Tasks past their deadline stop taking new work, as timed_out.
UPDATE {schema}.task
SET cancel_reason = 'timed_out', cancel_requested_at = coalesce(%(now)s::timestamptz, now())
WHERE status = 'processing' AND cancel_reason IS NULL
  AND deadline_at <= coalesce(%(now)s::timestamptz, now())
RETURNING id::text

-- name: lock_task
-- The task row lock that cancel, retry-failed and close all take first.
SELECT id::text, kind, status::text, cancel_reason::text
FROM {schema}.task WHERE id = %(task_id)s::uuid
FOR UPDATE

-- name: request_cancel
UPDATE {schema}.task
SET cancel_reason = %(reason)s::{schema}.task_outcome,
    cancel_requested_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(task_id)s::uuid AND status = 'processing' AND cancel_reason IS NULL
RETURNING id

-- name: cancel_pending_items
-- Pending items of stopped tasks never start: their jobs find them cancelled.
UPDATE {schema}.item
SET status = 'cancelled',
    finished_at = coalesce(%(now)s::timestamptz, now()),
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE task_id = ANY(%(task_ids)s::uuid[]) AND status = 'pending'

-- name: cancel_running_items
-- Running items of a task being cancelled: cancelled now, with a note on their
-- history. The process running each is told in the same transaction (a NOTIFY
-- on the queue layer's cancel channel naming the item's queue, id and fence)
-- and stops its handler; one that missed it finds the item gone at its next
-- heartbeat. A handler that runs on (a thread cannot be stopped) loses its
-- result to the fence: the item is no longer running. Items are locked after
-- the task row, as cancel_pending_items.
WITH cancelled AS (
    UPDATE {schema}.item i
    SET status = 'cancelled',
        in_handler = false,
        finished_at = coalesce(%(now)s::timestamptz, now()),
        updated_at = coalesce(%(now)s::timestamptz, now()),
        errors = i.errors || jsonb_build_array(jsonb_build_object(
            'attempt', i.attempt, 'run', i.attempt - i.attempt_base, 'started_at', i.started_at,
            'at', coalesce(%(now)s::timestamptz, now()),
            'type', 'Cancelled', 'message', 'its task was cancelled while it ran',
            'traceback', NULL))
    FROM {schema}.task t
    WHERE i.task_id = ANY(%(task_ids)s::uuid[]) AND i.status = 'running' AND t.id = i.task_id
    RETURNING i.id, i.attempt, t.item_queue
)
SELECT count(pg_notify(
    %(channel)s, json_build_object('queue', item_queue, 'item', id, 'fence', attempt)::text))
FROM cancelled

-- name: cancelled_items
-- Which of these runs (item id, fence) had their item cancelled: asked for
-- items a heartbeat no longer found running, and when the listen connection
-- came back (a cancel sent meanwhile was lost).
SELECT i.id
FROM {schema}.item i
JOIN unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS u(id, attempt) ON u.id = i.id
WHERE i.id = ANY(%(ids)s::bigint[]) AND i.status = 'cancelled' AND i.attempt = u.attempt

-- name: reopen_failed_items
-- error and cancelled -> pending for retry-failed (cancelled items exist only
-- in a cancelled task, which retry-failed reopens), with a fresh allowance of
-- attempts on top of those spent (attempt stays monotonic: it is the fencing
-- token, so a cancelled run's handler still going loses its write). A
-- cancelled item's job may still be waiting: the re-dispatch of the same key
-- is then dropped and that job runs the item; if that job was ending meanwhile
-- (a cancelled run), sweep_orphans sends a new one.
UPDATE {schema}.item i
SET status = 'pending', attempt_base = i.attempt, error = NULL, result = NULL,
    finished_at = NULL, updated_at = coalesce(%(now)s::timestamptz, now())
FROM {schema}.task t
WHERE i.task_id = %(task_id)s::uuid AND i.status IN ('error', 'cancelled') AND t.id = i.task_id
RETURNING i.id, i.attempt, i.status::text, t.item_queue, t.job_options,
          i.partition_key

-- name: reopen_task
-- Back to processing, and a cancel undone (retry-failed of a cancelled task).
-- A task that timed out stays stopped: its deadline has passed.
UPDATE {schema}.task
SET status = 'processing', outcome = NULL, completed_at = NULL, last_item_at = NULL,
    cancel_reason = NULL, cancel_requested_at = NULL
WHERE id = %(task_id)s::uuid AND status IN ('processing', 'completed', 'cancelled')
  AND cancel_reason IS DISTINCT FROM 'timed_out'

-- name: close_tasks
-- Closes every task with no pending or running item, in one statement: the
-- outcome from its cancel reason and error count. Candidates are locked (and
-- skipped when locked), so two aggregators never close one task twice; cancel
-- and retry-failed take the same row lock before they touch items. What is
-- left, the errors and the last finish are the sums of the task's item_tally
-- rows (migration 0013), which change in the transactions of the items they
-- count: a few rows whatever the task's size, where counting the items read
-- all of them (0.8 s at 1,000,000).
WITH candidates AS (
    SELECT t.id
    FROM {schema}.task t
    WHERE t.status = 'processing'
      AND t.total + coalesce((SELECT sum(x.pending + x.waiting + x.running)
                              FROM {schema}.item_tally x WHERE x.task_id = t.id), 0) = 0
    ORDER BY t.created_at
    LIMIT %(limit)s
    FOR UPDATE OF t SKIP LOCKED
), counts AS (
    SELECT c.id AS task_id,
           coalesce(sum(x.error), 0) AS errors,
           max(x.last_finished_at) AS last_item_at
    FROM candidates c LEFT JOIN {schema}.item_tally x ON x.task_id = c.id
    GROUP BY c.id
)
UPDATE {schema}.task t
SET status = CASE WHEN t.cancel_reason IS NULL THEN 'completed' ELSE 'cancelled' END::{schema}.task_status,
    outcome = CASE WHEN t.cancel_reason IS NOT NULL THEN t.cancel_reason
                   WHEN counts.errors > 0 THEN 'completed_with_errors'
                   ELSE 'completed' END::{schema}.task_outcome,
    completed_at = coalesce(%(now)s::timestamptz, now()),
    last_item_at = counts.last_item_at
FROM counts
WHERE t.id = counts.task_id AND t.status = 'processing'
RETURNING t.id::text, t.kind, t.outcome::text, t.on_complete_queue, t.params,
          t.created_at, t.completed_at, t.last_item_at

-- name: get_task
SELECT id::text, kind, status::text, outcome::text, params, total, created_at, completed_at,
       deadline_at, cancel_reason::text, last_item_at, item_queue
FROM {schema}.task WHERE id = %(task_id)s::uuid

-- name: list_tasks
-- Newest first, paged by (created_at, id), optionally of one kind and status.
SELECT id::text, kind, status::text, outcome::text, params, total, created_at, completed_at,
       deadline_at, cancel_reason::text, last_item_at, item_queue
FROM {schema}.task
WHERE (%(before_created)s::timestamptz IS NULL
       OR (created_at, id) < (%(before_created)s::timestamptz, %(before_id)s::uuid))
  AND (%(status)s::text IS NULL OR status = %(status)s::{schema}.task_status)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s

-- name: progress
-- A task's items by status, from its item_tally rows (migration 0013): the
-- total as pending plus what each statement since moved, a few rows whatever
-- the task's size. Completed items are left out, as the rest of the total.
-- Running items no handler runs yet (claimed, in a worker's buffer) are
-- counted as pending, so "running" means a handler is running it. A status
-- with no item has no row.
SELECT c.status, c.n::bigint
FROM (
    SELECT t.total + coalesce(sum(x.pending + x.waiting), 0) AS pending,
           coalesce(sum(x.running), 0) AS running,
           coalesce(sum(x.error), 0) AS error,
           coalesce(sum(x.cancelled), 0) AS cancelled
    FROM {schema}.task t LEFT JOIN {schema}.item_tally x ON x.task_id = t.id
    WHERE t.id = %(task_id)s::uuid
    GROUP BY t.total
) s,
LATERAL (VALUES ('pending', s.pending), ('running', s.running), ('error', s.error),
                ('cancelled', s.cancelled)) AS c(status, n)
WHERE c.n > 0

-- name: progress_many
-- As progress, for many tasks.
SELECT s.id::text, c.status, c.n::bigint
FROM (
    SELECT t.id,
           t.total + coalesce(sum(x.pending + x.waiting), 0) AS pending,
           coalesce(sum(x.running), 0) AS running,
           coalesce(sum(x.error), 0) AS error,
           coalesce(sum(x.cancelled), 0) AS cancelled
    FROM {schema}.task t LEFT JOIN {schema}.item_tally x ON x.task_id = t.id
    WHERE t.id = ANY(%(task_ids)s::uuid[])
    GROUP BY t.id, t.total
) s,
LATERAL (VALUES ('pending', s.pending), ('running', s.running), ('error', s.error),
                ('cancelled', s.cancelled)) AS c(status, n)
WHERE c.n > 0

-- name: list_items
-- A page of a task's items, optionally in one status, by id after a cursor.
SELECT id, ref, status::text, attempt - attempt_base, data, result, error, errors, started_at,
       updated_at, finished_at
FROM {schema}.item
WHERE task_id = %(task_id)s::uuid
  AND (%(status)s::text IS NULL OR status = %(status)s::{schema}.item_status)
  AND id > %(after_id)s
ORDER BY id
LIMIT %(limit)s

-- name: search_items
-- list_items of the items whose ref contains %(ref)s. No index serves the
-- search, and an index of refs would cost every item update an entry more
-- (see 0002_batch.sql): the materialized CTE reads the task's items through
-- item_task_status, one task and not the table. Left to itself the planner
-- walked the whole table in id order for a rare ref (100,000 rows for 10).
WITH task_items AS MATERIALIZED (
    SELECT id, ref, status, attempt, attempt_base, data, result, error, errors, started_at,
           updated_at, finished_at
    FROM {schema}.item
    WHERE task_id = %(task_id)s::uuid AND strpos(ref, %(ref)s::text) > 0
      AND (%(status)s::text IS NULL OR status = %(status)s::{schema}.item_status)
      AND id > %(after_id)s
)
SELECT id, ref, status::text, attempt - attempt_base, data, result, error, errors, started_at,
       updated_at, finished_at
FROM task_items
ORDER BY id
LIMIT %(limit)s

-- name: count_event
INSERT INTO {schema}.counter (name, value) VALUES (%(name)s, %(n)s)
ON CONFLICT (name) DO UPDATE SET value = {schema}.counter.value + excluded.value

-- name: counters
SELECT name, value FROM {schema}.counter ORDER BY name

-- name: items_by_status
-- Items of unfinished tasks by kind and status, for /metrics, from their
-- item_tally rows (as progress); running items no handler runs yet count as
-- pending, as in progress.
SELECT s.kind, c.status, c.n::bigint
FROM (
    SELECT t.kind,
           sum(t.total) + coalesce(sum(x.pending + x.waiting), 0) AS pending,
           coalesce(sum(x.running), 0) AS running,
           coalesce(sum(x.completed), 0) AS completed,
           coalesce(sum(x.error), 0) AS error,
           coalesce(sum(x.cancelled), 0) AS cancelled
    FROM (SELECT k.kind, k.id, k.total FROM {schema}.task k WHERE k.status = 'processing') t
    LEFT JOIN LATERAL (
        SELECT sum(y.pending) AS pending, sum(y.waiting) AS waiting, sum(y.running) AS running,
               sum(y.completed) AS completed, sum(y.error) AS error,
               sum(y.cancelled) AS cancelled
        FROM {schema}.item_tally y WHERE y.task_id = t.id
    ) x ON true
    GROUP BY t.kind
) s,
LATERAL (VALUES ('pending', s.pending), ('running', s.running), ('completed', s.completed),
                ('error', s.error), ('cancelled', s.cancelled)) AS c(status, n)
WHERE c.n > 0

-- name: completion_latencies
-- Seconds from the last item finishing to the task being closed, recent tasks.
SELECT kind, extract(epoch FROM completed_at - last_item_at)::float8
FROM {schema}.task
WHERE completed_at IS NOT NULL AND last_item_at IS NOT NULL
ORDER BY completed_at DESC
LIMIT %(limit)s

-- name: finished_tasks
-- Which of these tasks have nothing pending or running (as this statement
-- sees it): the worker that finished their last items wakes the aggregator.
-- Asked after a result write that named a task 'tail' has committed.
-- Counted from the tasks' item_tally rows, as close_tasks is.
SELECT t.id::text
FROM {schema}.task t
WHERE t.id = ANY(%(task_ids)s::uuid[])
  AND t.total + coalesce((SELECT sum(x.pending + x.waiting + x.running)
                          FROM {schema}.item_tally x WHERE x.task_id = t.id), 0) = 0

-- name: count_skip
-- A delivery the guard turned away, counted by why: the item of a stopped
-- task (cancelled) is no phantom; anything else (running, finished, gone)
-- is. Returns the counter it added to.
INSERT INTO {schema}.counter (name, value)
SELECT CASE WHEN i.status = 'cancelled' THEN %(cancelled)s ELSE %(phantom)s END, 1
FROM (SELECT (SELECT status FROM {schema}.item WHERE id = %(item)s) AS status) i
ON CONFLICT (name) DO UPDATE SET value = {schema}.counter.value + excluded.value
RETURNING name
