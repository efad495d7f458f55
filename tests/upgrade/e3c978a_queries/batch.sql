-- SQL of the batch layer. Run only by shoal/batch/store.py.
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

-- name: task_by_key
SELECT id::text, request_hash FROM {schema}.task WHERE idempotency_key = %(idempotency_key)s

-- name: insert_items
-- The task's items and one job per item, in one statement; returns how many.
-- Items are numbered in input order. Each job carries only its item's id, with
-- the singleton key item-<id>:0 (see dispatch_items in aggregator.py). The job
-- columns are the queue's insert_jobs ones, for jobs that all share one set of
-- options: written here, the ids of 100,000 items never travel to the client
-- and back as 100,000 payloads. A NULL data entry (or none at all) is JSON null.
WITH items AS (
    INSERT INTO {schema}.item (task_id, ref, data, updated_at)
    SELECT %(task_id)s::uuid, u.ref, coalesce(u.data::jsonb, 'null'),
           coalesce(%(now)s::timestamptz, now())
    FROM unnest(%(refs)b::text[], %(data)b::text[]) WITH ORDINALITY AS u(ref, data, ord)
    ORDER BY u.ord
    RETURNING id
), jobs AS (
    INSERT INTO {schema}.job (
        queue, data, priority, retry_limit, retry_delay, retry_backoff, retry_delay_max,
        expire_in, singleton_key, dead_letter, start_after, created_at)
    SELECT %(queue)s, jsonb_build_object('item', items.id), %(priority)s, %(retry_limit)s,
           %(retry_delay_s)s * interval '1 second', %(retry_backoff)s,
           %(retry_delay_max_s)s * interval '1 second', %(expire_in_s)s * interval '1 second',
           'item-' || items.id || ':0', %(dead_letter)s,
           coalesce(%(start_at)s::timestamptz,
                    coalesce(%(now)s::timestamptz, now())
                    + coalesce(%(start_in_s)s::float8, 0) * interval '1 second'),
           coalesce(%(now)s::timestamptz, now())
    FROM items
    RETURNING 1
)
SELECT count(*) FROM jobs

-- name: guard_items
-- The phantom-retry guard for many items (see guard_items() in 0002_batch.sql):
-- each passed item's new fencing token and what its handler needs; an id
-- missing from the result was a phantom. Payloads come back as text, parsed
-- only when a handler reads them.
SELECT id, attempt, run, ref, data::text, task_id::text, kind, params::text, max_attempts
FROM {schema}.guard_items(%(ids)s::bigint[], %(now)s::timestamptz)

-- name: claim_items
-- A worker's claim of item jobs with the guard of their items, in one round
-- trip (see claim_items() in 0002_batch.sql): one row per job taken, with the
-- columns of claim_jobs in shoal/queue/queries.sql, in its order, then the
-- columns of guard_items above for its item (all NULL for a phantom). The
-- function returns jobs and guarded items as rows of their own; they are
-- paired here, where the planner may hash them.
WITH c AS MATERIALIZED (
    SELECT * FROM {schema}.claim_items(%(queue)s, %(limit)s, %(now)s::timestamptz)
)
SELECT j.job_id, j.queue, j.job_data, j.priority, j.job_attempt, j.retry_limit, j.retry_delay_s,
       j.retry_backoff, j.retry_delay_max_s, j.expire_in_s, j.singleton_key, j.dead_letter,
       j.created_at, j.started_at, j.lease_expires_at,
       g.item_id, g.fence, g.run, g.ref, g.data, g.task_id, g.kind, g.params, g.max_attempts
FROM c j
LEFT JOIN c g ON g.job_id IS NULL AND g.item_id = j.item_id
WHERE j.job_id IS NOT NULL

-- name: complete_items
-- Records finished runs and completes their jobs in one statement (see
-- complete_items() in 0002_batch.sql). Arrays come as text literals.
SELECT what, id, task_id::text
FROM {schema}.complete_items(
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
UPDATE {schema}.item
SET status = %(status)s::{schema}.item_status,
    error = %(message)s,
    errors = errors || jsonb_build_array(%(entry)s::jsonb),
    finished_at = CASE WHEN %(status)s = 'error' THEN coalesce(%(now)s::timestamptz, now()) END,
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(item_id)s AND status = 'running' AND attempt = %(attempt)s
RETURNING id

-- name: hand_back_items
-- running -> pending for items guarded but never started (a worker stopping),
-- fenced by attempt, each with an "Interrupted" entry appended; returns the
-- items handed back, as dispatches of a new job.
UPDATE {schema}.item i
SET status = 'pending',
    error = %(message)s,
    errors = i.errors || jsonb_build_array(jsonb_build_object(
        'attempt', i.attempt - i.attempt_base, 'at', coalesce(%(now)s::timestamptz, now()),
        'type', 'Interrupted', 'message', %(message)s::text, 'traceback', NULL)),
    finished_at = NULL,
    updated_at = coalesce(%(now)s::timestamptz, now())
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS u(id, attempt), {schema}.task t
WHERE i.id = ANY(%(ids)s::bigint[]) AND i.id = u.id AND i.status = 'running'
  AND i.attempt = u.attempt AND t.id = i.task_id
RETURNING i.id, i.attempt, i.status::text, t.item_queue, t.job_options

-- name: heartbeat_items
-- Sign of life for running items, fenced by attempt; returns those still held.
UPDATE {schema}.item i
SET updated_at = coalesce(%(now)s::timestamptz, now())
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS u(id, attempt)
WHERE i.id = ANY(%(ids)s::bigint[]) AND i.id = u.id AND i.status = 'running'
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
        'attempt', i.attempt, 'at', coalesce(%(now)s::timestamptz, now()),
        'type', 'Zombie', 'message',
        'no sign of life since ' || i.updated_at::text || '; reaped by the aggregator')),
    finished_at = CASE WHEN i.attempt - i.attempt_base < t.max_attempts AND t.cancel_reason IS NULL
                       THEN NULL ELSE coalesce(%(now)s::timestamptz, now()) END,
    updated_at = coalesce(%(now)s::timestamptz, now())
FROM stale, {schema}.task t
WHERE i.id = stale.id AND t.id = i.task_id
  AND i.status = 'running'
  AND i.updated_at < coalesce(%(now)s::timestamptz, now()) - t.zombie_timeout
RETURNING i.id, i.attempt, i.status::text, t.item_queue, t.job_options

-- name: sweep_orphans
-- Pending items untouched for a zombie timeout may have lost their job (its
-- last attempt expired, say). Touch them and hand them back for a re-dispatch;
-- the job's singleton key makes that a no-op where a job is still waiting.
-- Tasks younger than a zombie timeout are skipped by their creation time, as in
-- reap_zombies: a big new task's pending items are not walked every second.
WITH old AS (
    SELECT i.id
    FROM {schema}.task t
    JOIN {schema}.item i ON i.task_id = t.id AND i.status = 'pending'
    WHERE t.status = 'processing'
      AND t.created_at < coalesce(%(now)s::timestamptz, now()) - t.zombie_timeout
      AND i.updated_at < coalesce(%(now)s::timestamptz, now()) - t.zombie_timeout
    ORDER BY i.updated_at
    LIMIT %(limit)s
    FOR UPDATE OF i SKIP LOCKED
)
UPDATE {schema}.item i
SET updated_at = coalesce(%(now)s::timestamptz, now())
FROM old, {schema}.task t
WHERE i.id = old.id AND t.id = i.task_id AND i.status = 'pending'
RETURNING i.id, i.attempt, i.status::text, t.item_queue, t.job_options

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

-- name: reopen_failed_items
-- error -> pending for retry-failed, with a fresh allowance of attempts on top
-- of those spent (attempt stays monotonic: it is the fencing token).
UPDATE {schema}.item i
SET status = 'pending', attempt_base = i.attempt, error = NULL, result = NULL,
    finished_at = NULL, updated_at = coalesce(%(now)s::timestamptz, now())
FROM {schema}.task t
WHERE i.task_id = %(task_id)s::uuid AND i.status = 'error' AND t.id = i.task_id
RETURNING i.id, i.attempt, i.status::text, t.item_queue, t.job_options

-- name: reopen_task
UPDATE {schema}.task
SET status = 'processing', outcome = NULL, completed_at = NULL, last_item_at = NULL
WHERE id = %(task_id)s::uuid AND status IN ('processing', 'completed')

-- name: close_tasks
-- Closes every task with no pending or running item, in one statement: the
-- outcome from its cancel reason and error count. Candidates are locked (and
-- skipped when locked), so two aggregators never close one task twice; cancel
-- and retry-failed take the same row lock before they touch items.
WITH candidates AS (
    SELECT t.id
    FROM {schema}.task t
    WHERE t.status = 'processing'
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.item i
          WHERE i.task_id = t.id AND i.status IN ('pending', 'running'))
    ORDER BY t.created_at
    LIMIT %(limit)s
    FOR UPDATE OF t SKIP LOCKED
), counts AS (
    SELECT i.task_id,
           count(*) FILTER (WHERE i.status = 'error') AS errors,
           max(i.finished_at) AS last_item_at
    FROM {schema}.item i JOIN candidates c ON c.id = i.task_id
    GROUP BY i.task_id
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
       deadline_at, cancel_reason::text, last_item_at
FROM {schema}.task WHERE id = %(task_id)s::uuid

-- name: list_tasks
-- Newest first, paged by (created_at, id).
SELECT id::text, kind, status::text, outcome::text, params, total, created_at, completed_at,
       deadline_at, cancel_reason::text, last_item_at
FROM {schema}.task
WHERE (%(before_created)s::timestamptz IS NULL
       OR (created_at, id) < (%(before_created)s::timestamptz, %(before_id)s::uuid))
  AND (%(status)s::text IS NULL OR status = %(status)s::{schema}.task_status)
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s

-- name: progress
-- Progress is one GROUP BY status over the (task_id, status) index. Completed
-- items are not counted: they are the rest of the task's total (items are
-- never deleted), and in a big task they are most of it, so a poll near the
-- end reads little of the index, and no item rows.
SELECT status::text, count(*)
FROM {schema}.item
WHERE task_id = %(task_id)s::uuid AND status IN ('pending', 'running', 'error', 'cancelled')
GROUP BY status

-- name: progress_many
-- As progress, for many tasks.
SELECT task_id::text, status::text, count(*)
FROM {schema}.item
WHERE task_id = ANY(%(task_ids)s::uuid[])
  AND status IN ('pending', 'running', 'error', 'cancelled')
GROUP BY task_id, status

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

-- name: count_event
INSERT INTO {schema}.counter (name, value) VALUES (%(name)s, %(n)s)
ON CONFLICT (name) DO UPDATE SET value = {schema}.counter.value + excluded.value

-- name: counters
SELECT name, value FROM {schema}.counter ORDER BY name

-- name: items_by_status
-- Items of unfinished and recent tasks by status, for /metrics.
SELECT t.kind, i.status::text, count(*)
FROM {schema}.item i JOIN {schema}.task t ON t.id = i.task_id
WHERE t.status = 'processing'
GROUP BY t.kind, i.status

-- name: completion_latencies
-- Seconds from the last item finishing to the task being closed, recent tasks.
SELECT kind, extract(epoch FROM completed_at - last_item_at)::float8
FROM {schema}.task
WHERE completed_at IS NOT NULL AND last_item_at IS NOT NULL
ORDER BY completed_at DESC
LIMIT %(limit)s

-- name: finished_tasks
-- Which of these tasks have nothing pending or running (as this transaction
-- sees it): the worker that finished their last items wakes the aggregator.
SELECT t.id::text
FROM unnest(%(task_ids)s::uuid[]) AS t(id)
WHERE NOT EXISTS (
    SELECT 1 FROM {schema}.item i WHERE i.task_id = t.id AND i.status IN ('pending', 'running'))
