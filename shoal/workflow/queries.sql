-- The workflow layer's statements, run only by shoal/workflow/store.py.
-- Tables: shoal/workflow/migrations; the functions called here, with their
-- reasons: shoal/workflow/functions.sql and shoal/queue/functions.sql.

-- name: start_runs
-- New runs and the jobs that run them, in one statement (concurrent starts
-- share it; in its own transaction or the caller's): one row per run
-- created. An id taken already gives no row (a start is idempotent by id).
-- The ids are distinct: the store sends a repeated one in a statement of its
-- own. The jobs' settings are each workflow's, checked when it was declared
-- (the queue's send_job_v2); a job's data may carry the starter's trace
-- context (shoal/tracing.py), so the run's first job is its child.
WITH given AS (
    SELECT * FROM unnest(
        %(ids)s::text[], %(names)s::text[], %(inputs)s::jsonb[], %(done_keys)s::text[],
        %(queues)s::text[], %(retry_limits)s::integer[], %(retry_delays_s)s::float8[],
        %(retry_backoffs)s::boolean[], %(retry_delay_maxes_s)s::float8[],
        %(expires_in_s)s::float8[], %(dead_letters)s::text[], %(traces)s::jsonb[],
        %(nows)s::timestamptz[])
        AS g(id, name, input, done_key, queue, retry_limit, retry_delay_s, retry_backoff,
             retry_delay_max_s, expire_in_s, dead_letter, trace, at)
), run AS (
    INSERT INTO {schema}.workflow_run (id, name, input, done_key, created_at, updated_at)
    SELECT id, name, input, done_key, coalesce(at, now()), coalesce(at, now())
    FROM given ORDER BY id
    ON CONFLICT (id) DO NOTHING
    RETURNING id
)
SELECT g.id, {schema}.send_job_v2(
    g.queue, jsonb_build_object('run', g.id) || coalesce(g.trace, '{{}}'::jsonb),
    g.retry_limit, g.retry_delay_s,
    g.retry_backoff, g.retry_delay_max_s, g.expire_in_s, g.dead_letter, NULL, g.at)
FROM run JOIN given g ON g.id = run.id

-- name: begin_runs
-- Jobs take runs to replay them: each run's next epoch (which fences out
-- any older runner's checkpoints), and its checkpoints so far. A run that
-- sleeps or waits is taken only by the job that was to wake it; a finished
-- run by none (the job then has nothing to do). The runs are distinct.
UPDATE {schema}.workflow_run r
SET epoch = r.epoch + 1, status = 'running', job = g.job,
    wake_job = NULL, wait_seq = NULL, wait_key = NULL,
    updated_at = coalesce(g.at, now())
FROM unnest(%(runs)s::text[], %(jobs)s::bigint[], %(nows)s::timestamptz[]) AS g(run, job, at)
WHERE r.id = g.run
  AND (r.status IN ('pending', 'running') OR r.wake_job = g.job)
RETURNING r.id, r.name, r.input, r.epoch,
    (SELECT coalesce(jsonb_agg(jsonb_build_array(
                s.seq, s.name, s.kind, s.status, s.attempts, s.result, s.error)
             ORDER BY s.seq), '[]'::jsonb)
     FROM {schema}.workflow_step s WHERE s.run_id = r.id) AS steps

-- name: record_steps
-- Steps' checkpoints, each written only by the runner holding its run's
-- current epoch (the share lock waits for a begin_runs in flight, then sees
-- its epoch). A completed checkpoint is never overwritten: a second writer
-- gets no row. The (run, seq) pairs are distinct; the runs are locked in id
-- order.
WITH given AS (
    SELECT * FROM unnest(
        %(runs)s::text[], %(epochs)s::integer[], %(seqs)s::integer[], %(names)s::text[],
        %(kinds)s::text[], %(statuses)s::text[], %(attempts)s::integer[],
        %(results)s::jsonb[], %(errors)s::text[], %(started)s::timestamptz[],
        %(finished)s::timestamptz[])
        AS g(run, epoch, seq, name, kind, status, attempts, result, error, started, finished)
), fence AS (
    SELECT g.* FROM given g
    JOIN {schema}.workflow_run r ON r.id = g.run AND r.epoch = g.epoch AND r.status = 'running'
    ORDER BY r.id
    FOR SHARE OF r
)
INSERT INTO {schema}.workflow_step AS s (
    run_id, seq, name, kind, status, attempts, result, error, started_at, finished_at)
SELECT run, seq, name, kind, status, attempts, result, error, coalesce(started, now()), finished
FROM fence
ON CONFLICT (run_id, seq) DO UPDATE
SET status = excluded.status, attempts = excluded.attempts, result = excluded.result,
    error = excluded.error, finished_at = excluded.finished_at
WHERE s.status <> 'completed'
RETURNING s.run_id, s.seq

-- name: finish_runs
-- Runs end, each fenced by its epoch; a child run's end is an event to its
-- parent (done_key), in the same statement. The runs are distinct.
WITH finished AS (
    UPDATE {schema}.workflow_run r
    SET status = g.status, result = g.result, error = g.error, job = NULL, wait_key = NULL,
        finished_at = coalesce(g.at, now()), updated_at = coalesce(g.at, now())
    FROM unnest(%(runs)s::text[], %(epochs)s::integer[], %(statuses)s::text[],
                %(results)s::jsonb[], %(errors)s::text[], %(nows)s::timestamptz[])
        AS g(run, epoch, status, result, error, at)
    WHERE r.id = g.run AND r.epoch = g.epoch AND r.status = 'running'
    RETURNING r.id, r.done_key, r.status, r.result, r.error, g.at
)
SELECT f.id, CASE WHEN f.done_key IS NOT NULL THEN {schema}.signal_v1(
           f.done_key,
           jsonb_build_object('status', f.status, 'result', f.result, 'error', f.error),
           f.at) END
FROM finished f


-- name: begin_waiting_run
-- As begin_runs, for the job that ends a wait with no wake job of its own: a
-- batch task's completion job names the task, and the run waiting for it is
-- found by its wait_key. The key stays on the run until it next waits or
-- ends, so that the same job, retried after the database failed under the
-- run (its attempt failed), finds the run it had taken and takes it again.
UPDATE {schema}.workflow_run r
SET epoch = r.epoch + 1, status = 'running', job = %(job)s,
    wake_job = NULL, wait_seq = NULL,
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE r.wait_key = %(key)s
  AND (r.status = 'waiting' OR (r.status = 'running' AND r.job = %(job)s))
RETURNING r.id, r.name, r.input, r.epoch,
    (SELECT coalesce(jsonb_agg(jsonb_build_array(
                s.seq, s.name, s.kind, s.status, s.attempts, s.result, s.error)
             ORDER BY s.seq), '[]'::jsonb)
     FROM {schema}.workflow_step s WHERE s.run_id = r.id) AS steps

-- name: suspend_run
-- The run sleeps or waits until wake_job runs (or an event wakes it early).
UPDATE {schema}.workflow_run
SET status = %(status)s, wake_job = %(wake_job)s, wait_seq = %(seq)s, wait_key = %(key)s,
    job = NULL, updated_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(run)s AND epoch = %(epoch)s AND status = 'running'
RETURNING id

-- name: fail_abandoned_run
-- A run whose job failed for good (its retries spent: the database failed
-- under its bookkeeping each time, or each worker running it died) fails,
-- naming why, instead of staying pending or running with no job to go on.
-- Only a run that job held or was to wake: one taken since by another job is
-- left to it.
WITH failed AS (
    UPDATE {schema}.workflow_run
    SET status = 'failed', error = %(error)s, job = NULL, wake_job = NULL,
        wait_seq = NULL, wait_key = NULL,
        finished_at = coalesce(%(now)s::timestamptz, now()),
        updated_at = coalesce(%(now)s::timestamptz, now())
    WHERE id = %(run)s
      AND ((status IN ('pending', 'running') AND (job IS NULL OR job = %(job)s))
           OR (status IN ('sleeping', 'waiting') AND wake_job = %(job)s))
    RETURNING id, done_key, status, error
)
SELECT f.id, CASE WHEN f.done_key IS NOT NULL THEN {schema}.signal_v1(
           f.done_key, jsonb_build_object('status', f.status, 'error', f.error),
           %(now)s::timestamptz) END
FROM failed f

-- name: lock_event_key
-- Serializes a wait with signal_v1 on one key (shoal/workflow/functions.sql
-- says why); held to the end of the transaction.
SELECT pg_advisory_xact_lock(hashtextextended('shoal.workflow.event:{schema}:' || %(key)s, 0))

-- name: take_event
-- The oldest event of a key no wait has taken, taken by this run's step.
UPDATE {schema}.workflow_event e
SET taken_by = %(run)s, taken_seq = %(seq)s, taken_at = coalesce(%(now)s::timestamptz, now())
WHERE e.id = (
    SELECT id FROM {schema}.workflow_event
    WHERE key = %(key)s AND taken_by IS NULL
    ORDER BY id LIMIT 1)
RETURNING e.payload

-- name: signal
SELECT {schema}.signal_v1(%(key)s, %(payload)s::jsonb, %(now)s::timestamptz)

-- name: cancel_run
-- The jobs that hold or would resume the run come back, to be cancelled, and
-- what it waited for (a batch task or a child run is cancelled with it). A
-- child run's parent hears of it as of any other end.
WITH cancelled AS (
    UPDATE {schema}.workflow_run r
    SET status = 'cancelled', wait_key = NULL,
        finished_at = coalesce(%(now)s::timestamptz, now()),
        updated_at = coalesce(%(now)s::timestamptz, now())
    FROM (SELECT id, wait_key FROM {schema}.workflow_run WHERE id = %(run)s FOR UPDATE) old
    WHERE r.id = old.id AND r.status NOT IN ('completed', 'failed', 'cancelled')
    RETURNING r.job, r.wake_job, old.wait_key, r.done_key
)
SELECT c.job, c.wake_job, c.wait_key,
       CASE WHEN c.done_key IS NOT NULL THEN {schema}.signal_v1(
           c.done_key, jsonb_build_object('status', 'cancelled'), %(now)s::timestamptz) END
FROM cancelled c

-- name: reopen_run
-- A failed or cancelled run goes back to pending, without the checkpoint of
-- the step that failed: it runs again, the steps before it do not.
WITH run AS (
    UPDATE {schema}.workflow_run
    SET status = 'pending', error = NULL, result = NULL, finished_at = NULL,
        job = NULL, wake_job = NULL, wait_seq = NULL, wait_key = NULL,
        epoch = epoch + 1, updated_at = coalesce(%(now)s::timestamptz, now())
    WHERE id = %(run)s AND status IN ('failed', 'cancelled')
    RETURNING id, name
), dropped AS (
    DELETE FROM {schema}.workflow_step s USING run
    WHERE s.run_id = run.id AND s.status = 'failed'
)
SELECT id, name FROM run

-- name: get_run
SELECT id, name, status, input, result, error, created_at, updated_at, finished_at,
       wait_key, epoch
FROM {schema}.workflow_run WHERE id = %(run)s

-- name: run_steps
SELECT seq, name, kind, status, attempts, result, error, started_at, finished_at
FROM {schema}.workflow_step WHERE run_id = %(run)s ORDER BY seq

-- name: list_runs
-- Newest first, a page after the (created_at, id) of the previous page's last.
SELECT id, name, status, input, result, error, created_at, updated_at, finished_at,
       wait_key, epoch
FROM {schema}.workflow_run
WHERE (%(name)s::text IS NULL OR name = %(name)s)
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(before_at)s::timestamptz IS NULL
       OR (created_at, id) < (%(before_at)s::timestamptz, %(before_id)s::text))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s

-- name: count_open_runs
-- Runs per workflow and status, of the statuses the workflow_run_open index
-- covers (unfinished, and failed), reading at most `cap` of them.
SELECT name, status, count(*)
FROM (SELECT name, status FROM {schema}.workflow_run
      WHERE status IN ('pending', 'running', 'sleeping', 'waiting', 'failed')
      LIMIT %(cap)s) open
GROUP BY name, status
