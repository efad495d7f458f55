-- SQL of the queue layer. Run only by shoal/queue/store.py.
-- Every time-dependent statement takes %(now)s; NULL means the database clock.

-- name: insert_jobs
-- Inserts many jobs in one statement, returning the id, queue and singleton
-- key of each job inserted (none where an unfinished job of that queue already
-- holds the key). Jobs arrive as (option set, data, singleton key) with the
-- distinct option sets sent once: a batch of 10,000 usually shares one.
-- Ids follow input order: nextval, a volatile output expression, is evaluated
-- after the ORDER BY (PostgreSQL's SELECT reference, "SELECT List"), so the
-- returned ids sorted are the inputs' in order, less the skipped ones
-- (store.InsertPlan.ids). No materialized list of ids joined back: for 10,000
-- jobs that list and its join took about 50 of the statement's 119 ms.
-- An option the send did not name (its bit in `given` is clear, bits as
-- store.GIVEN_BITS) takes the queue's stored default when it has one.
-- A job of a limited queue (one with a queue_limit row, read once per option
-- set) gets its partition key: '' when the queue is not partitioned, else the
-- one sent, else its data's partition field, else '' (docs/limits.md); other
-- jobs keep the key sent, usually none.
WITH sent AS (
    SELECT * FROM unnest(
        %(queue)s::text[], %(priority)s::int[], %(retry_limit)s::int[],
        %(retry_delay_s)s::float8[], %(retry_backoff)s::bool[], %(retry_delay_max_s)s::float8[],
        %(expire_in_s)s::float8[], %(dead_letter)s::text[], %(start_at)s::timestamptz[],
        %(start_in_s)s::float8[], %(given)s::int[]
    ) WITH ORDINALITY AS o(queue, priority, retry_limit, retry_delay_s, retry_backoff,
                          retry_delay_max_s, expire_in_s, dead_letter, start_at, start_in_s,
                          given, k)
), opts AS (
    SELECT s.queue,
           CASE WHEN s.given & 1 = 0 THEN coalesce(d.priority, s.priority) ELSE s.priority END
               AS priority,
           CASE WHEN s.given & 2 = 0 THEN coalesce(d.retry_limit, s.retry_limit)
                ELSE s.retry_limit END AS retry_limit,
           CASE WHEN s.given & 4 = 0
                THEN coalesce(extract(epoch FROM d.retry_delay)::float8, s.retry_delay_s)
                ELSE s.retry_delay_s END AS retry_delay_s,
           CASE WHEN s.given & 8 = 0 THEN coalesce(d.retry_backoff, s.retry_backoff)
                ELSE s.retry_backoff END AS retry_backoff,
           CASE WHEN s.given & 16 = 0
                THEN coalesce(extract(epoch FROM d.retry_delay_max)::float8, s.retry_delay_max_s)
                ELSE s.retry_delay_max_s END AS retry_delay_max_s,
           CASE WHEN s.given & 32 = 0
                THEN coalesce(extract(epoch FROM d.expire_in)::float8, s.expire_in_s)
                ELSE s.expire_in_s END AS expire_in_s,
           -- A queue whose default dead letter is NULL has none to give.
           CASE WHEN s.given & 64 = 0 AND d.dead_letter IS NOT NULL THEN d.dead_letter
                ELSE s.dead_letter END AS dead_letter,
           s.start_at, s.start_in_s, s.k,
           l.queue IS NOT NULL AS limited, l.partition_by IS NOT NULL AS partitioned,
           l.partition_field
    FROM sent s
    LEFT JOIN {schema}.queue_default d ON d.queue = s.queue
    LEFT JOIN {schema}.queue_limit l ON l.queue = s.queue
)
INSERT INTO {schema}.job (
    id, queue, data, priority, retry_limit, retry_delay, retry_backoff, retry_delay_max,
    expire_in, singleton_key, dead_letter, start_after, created_at, partition_key, cost)
SELECT nextval({job_id_seq}), o.queue, u.data::jsonb, o.priority, o.retry_limit,
       o.retry_delay_s * interval '1 second', o.retry_backoff,
       o.retry_delay_max_s * interval '1 second', o.expire_in_s * interval '1 second',
       u.singleton_key, o.dead_letter,
       coalesce(o.start_at,
                coalesce(%(now)s::timestamptz, now()) + coalesce(o.start_in_s, 0) * interval '1 second'),
       coalesce(%(now)s::timestamptz, now()),
       CASE WHEN NOT o.limited THEN u.partition_key
            WHEN NOT o.partitioned THEN ''
            ELSE coalesce(u.partition_key, u.data::jsonb ->> o.partition_field, '') END,
       coalesce(u.cost, 1)
FROM unnest(%(option_set)b::int[], %(data)b::text[], %(singleton_key)b::text[],
            %(partition_key)b::text[], %(cost)b::int[])
    WITH ORDINALITY AS u(k, data, singleton_key, partition_key, cost, ord)
JOIN opts o USING (k)
ORDER BY u.ord
ON CONFLICT DO NOTHING RETURNING id, queue, singleton_key

-- name: claim_limited_jobs
-- Claims up to %(limit)s waiting jobs of a limited queue within its limits
-- (claim_limited_jobs_v2, shoal/queue/functions.sql),
-- recording %(holder)s (this process's registry number, or NULL) on them: the claim row.
SELECT id, queue, data, priority, attempt, retry_limit, retry_delay_s, retry_backoff,
       retry_delay_max_s, expire_in_s, singleton_key, dead_letter, created_at, started_at,
       lease_expires_at
FROM {schema}.claim_limited_jobs_v2(%(queue)s, %(limit)s, %(now)s::timestamptz,
                                    %(holder)s::int)

-- name: claim_jobs
-- Claims up to %(limit)s waiting jobs of one queue, from the head of the claim
-- index or after the position (%(after_priority)s, %(after_id)s) in it
-- (claim_jobs_v5, shoal/queue/functions.sql),
-- recording %(holder)s (this process's registry number, or NULL) on them: the
-- lean claim row, read by name (shoal.queue.rows.lean_claims).
SELECT id, data, priority, attempt, retry_limit, retry_delay_s, retry_backoff,
       retry_delay_max_s, expire_in_s, singleton_key, dead_letter, created_at_s, started_at_s
FROM {schema}.claim_jobs_v5(%(queue)s, %(limit)s, %(now)s::timestamptz,
                            %(after_priority)s::int, %(after_id)s::bigint, %(holder)s::int)

-- name: complete_jobs
-- active -> completed, each fenced by the attempt its worker was handed
-- (complete_jobs_v3, shoal/queue/functions.sql: one primary-key
-- probe per job, whatever the statistics say about active jobs).
SELECT id FROM {schema}.complete_jobs_v3(
    %(ids)s::bigint[], %(attempts)s::int[], %(outputs)s::jsonb[], %(now)s::timestamptz)

-- name: fail_jobs
-- active -> retry | failed, each fenced by its attempt, appending the attempt's
-- error. With %(expired_only)s the row must also still be past its lease: a
-- heartbeat that landed after the rescuer read the row wins. A job that fails
-- for good with a dead_letter queue leaves a copy there, in this statement.
-- A job back to retry loses its holder: a claim by a process of 0.1.0
-- (claim_jobs) would not replace it, and the rescue of that
-- holder's jobs would then take a job another process runs.
WITH u AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(states)s::{schema}.job_state[],
                         %(retry_in_s)s::float8[], %(errors)s::jsonb[])
        AS u(id, attempt, state, retry_in_s, error)
), failed AS (
    UPDATE {schema}.job j
    SET state = u.state,
        start_after = CASE WHEN u.state = 'retry'
            THEN coalesce(%(now)s::timestamptz, now()) + u.retry_in_s * interval '1 second'
            ELSE j.start_after END,
        finished_at = CASE WHEN u.state = 'failed' THEN coalesce(%(now)s::timestamptz, now()) END,
        lease_expires_at = NULL,
        holder = CASE WHEN u.state = 'retry' THEN NULL ELSE j.holder END,
        errors = j.errors || jsonb_build_array(u.error)
    FROM u
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = u.id AND j.state = 'active'
      AND j.attempt = u.attempt
      AND (NOT %(expired_only)s OR j.lease_expires_at <= coalesce(%(now)s::timestamptz, now()))
    RETURNING j.*
), dead AS (
    INSERT INTO {schema}.job (
        queue, data, priority, retry_limit, retry_delay, retry_backoff, retry_delay_max,
        expire_in, origin_queue, origin_id, start_after, created_at)
    SELECT dead_letter, data, priority, retry_limit, retry_delay, retry_backoff, retry_delay_max,
           expire_in, queue, id, coalesce(%(now)s::timestamptz, now()),
           coalesce(%(now)s::timestamptz, now())
    FROM failed
    WHERE state = 'failed' AND dead_letter IS NOT NULL
)
SELECT id, state::text FROM failed

-- name: release_jobs
-- active -> created without costing an attempt: a snooze, or a job handed back
-- at shutdown, whose note (which process, when its run began) is appended to
-- its history. Fenced by attempt. An empty notes array: no notes at all. The
-- holder goes too (see fail_jobs).
UPDATE {schema}.job j
SET state = 'created',
    attempt = j.attempt - 1,
    started_at = NULL,
    lease_expires_at = NULL,
    holder = NULL,
    start_after = coalesce(%(now)s::timestamptz, now()) + u.delay_s * interval '1 second',
    errors = CASE WHEN u.note IS NULL THEN j.errors
                  ELSE j.errors || jsonb_build_array(u.note) END
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(delays_s)s::float8[], %(notes)s::jsonb[])
    AS u(id, attempt, delay_s, note)
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = u.id AND j.state = 'active'
  AND j.attempt = u.attempt
RETURNING j.id

-- name: cancel_active_job
-- active -> cancelled by the handler's own Cancel, fenced by attempt. A
-- cancelled job can be resumed: the holder goes (see fail_jobs).
UPDATE {schema}.job
SET state = 'cancelled',
    finished_at = coalesce(%(now)s::timestamptz, now()),
    lease_expires_at = NULL,
    holder = NULL,
    errors = errors || jsonb_build_array(%(error)s::jsonb)
WHERE id = %(id)s AND state = 'active' AND attempt = %(attempt)s
RETURNING id

-- name: extend_leases
-- A heartbeat: the lease runs expire_in from now again. Returns the jobs still
-- held; a missing id means this worker lost the job (expired, cancelled).
UPDATE {schema}.job j
SET lease_expires_at = coalesce(%(now)s::timestamptz, now()) + j.expire_in
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS u(id, attempt)
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = u.id AND j.state = 'active'
  AND j.attempt = u.attempt
RETURNING j.id, j.lease_expires_at

-- name: lock_expired_leases
-- Active jobs whose lease has passed: their worker died or hung. Locked so
-- that two rescuers never judge the same job.
SELECT id, attempt, retry_limit, extract(epoch FROM retry_delay)::float8, retry_backoff,
       extract(epoch FROM retry_delay_max)::float8, lease_expires_at, queue
FROM {schema}.job
WHERE state = 'active' AND lease_expires_at <= coalesce(%(now)s::timestamptz, now())
ORDER BY lease_expires_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: silent_workers
-- The time now, and the registered processes silent for longer than their
-- own rescue_after: the holders whose active jobs maintenance hands back. A
-- process of the previous release (no rescue_after_s) is never one. Silence
-- counts only from %(heard_since)s, when the asking process's passes began
-- reaching the database (NULL: now, none is silent yet): after an outage of
-- the database every process's heartbeat is old, and none of them is dead.
SELECT coalesce(%(now)s::timestamptz, now()), array(
    SELECT id FROM {schema}.worker
    WHERE rescue_after_s IS NOT NULL
      AND greatest(heartbeat_at, coalesce(%(heard_since)s::timestamptz, %(now)s::timestamptz, now()))
          < coalesce(%(now)s::timestamptz, now()) - rescue_after_s * interval '1 second'
    ORDER BY id)

-- name: lock_jobs_of_silent_workers
-- The active jobs those processes (%(holders)s) claimed while they still
-- heartbeated, with who held them: locked, so two rescuers never judge the
-- same job. The silence is checked again here (a process that came back
-- between the two statements keeps its jobs; %(heard_since)s as in
-- silent_workers). Reads every active job (job_lease): run only when some
-- process went silent.
SELECT j.id, j.attempt, j.retry_limit, extract(epoch FROM j.retry_delay)::float8,
       j.retry_backoff, extract(epoch FROM j.retry_delay_max)::float8, j.queue,
       w.id, w.host, w.pid, w.app, w.heartbeat_at, w.rescue_after_s
FROM {schema}.worker w
JOIN {schema}.job j ON j.holder = w.no
WHERE w.id = ANY(%(holders)s::text[])
  AND greatest(w.heartbeat_at, coalesce(%(heard_since)s::timestamptz, %(now)s::timestamptz, now()))
      < coalesce(%(now)s::timestamptz, now()) - w.rescue_after_s * interval '1 second'
  AND j.state = 'active'
  AND j.started_at <= w.heartbeat_at + w.rescue_after_s * interval '1 second'
ORDER BY j.id
LIMIT %(limit)s
FOR UPDATE OF j SKIP LOCKED

-- name: count_rescued
-- Adds to each silent process's row the jobs just handed back (the Workers page).
UPDATE {schema}.worker w
SET rescued = w.rescued + u.n, rescued_at = coalesce(%(now)s::timestamptz, now())
FROM unnest(%(ids)s::text[], %(counts)s::int[]) AS u(id, n)
WHERE w.id = u.id

-- name: cancel_jobs
-- created | retry | active -> cancelled, with a note on the job's history that
-- says who cancelled it and when. The process holding an active job is told in
-- the same transaction: a NOTIFY on the cancel channel naming the job's queue,
-- id and attempt, on which its worker stops the handler. A worker that misses
-- it learns at its next heartbeat, and loses its final write to the attempt
-- fence. The rows are locked first to read the state they had: only active
-- jobs have a handler to stop. A cancelled job can be resumed: the holder
-- goes (see fail_jobs).
WITH before AS (
    SELECT id, state FROM {schema}.job
    WHERE id = ANY(%(ids)s::bigint[]) AND state IN ('created', 'retry', 'active')
    FOR UPDATE
), cancelled AS (
    UPDATE {schema}.job j
    SET state = 'cancelled',
        finished_at = coalesce(%(now)s::timestamptz, now()),
        lease_expires_at = NULL,
        holder = NULL,
        errors = j.errors || jsonb_build_array(
            %(note)s::jsonb || jsonb_build_object(
                'attempt', j.attempt, 'at', coalesce(%(now)s::timestamptz, now())))
    FROM before b
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = b.id
      AND j.state IN ('created', 'retry', 'active')
    RETURNING j.id, j.queue, j.attempt, b.state AS was
)
SELECT id, CASE WHEN was = 'active' THEN pg_notify(
    %(channel)s, json_build_object('queue', queue, 'id', id, 'attempt', attempt)::text) END
FROM cancelled

-- name: note_stopped_runs
-- A run whose job was cancelled while its handler ran: the handler was
-- stopped, and the job's history says so. Fenced by the cancelled state and the
-- attempt the run was handed.
UPDATE {schema}.job j
SET errors = j.errors || jsonb_build_array(u.note)
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(notes)s::jsonb[]) AS u(id, attempt, note)
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = u.id AND j.state = 'cancelled'
  AND j.attempt = u.attempt
RETURNING j.id

-- name: cancelled_runs
-- Which of these runs (job id, attempt) had their job cancelled: asked when a
-- heartbeat found a job no longer held, or when the listen connection came
-- back (a cancel sent meanwhile was lost).
SELECT j.id
FROM {schema}.job j
JOIN unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS u(id, attempt) ON u.id = j.id
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.state = 'cancelled' AND j.attempt = u.attempt

-- name: resume_jobs
-- cancelled -> created. Skips a job whose singleton key an unfinished job now holds.
UPDATE {schema}.job j
SET state = 'created', finished_at = NULL, start_after = coalesce(%(now)s::timestamptz, now())
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.state = 'cancelled'
  AND (j.singleton_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM {schema}.job o
        WHERE o.queue = j.queue AND o.singleton_key = j.singleton_key
          AND o.state IN ('created', 'retry', 'active')))
RETURNING j.id

-- name: retry_jobs
-- failed -> retry, to run again now; earlier errors stay on the row.
UPDATE {schema}.job j
SET state = 'retry', finished_at = NULL, start_after = coalesce(%(now)s::timestamptz, now())
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.state = 'failed'
  AND (j.singleton_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM {schema}.job o
        WHERE o.queue = j.queue AND o.singleton_key = j.singleton_key
          AND o.state IN ('created', 'retry', 'active')))
RETURNING j.id

-- name: redrive
-- Moves waiting jobs of a dead-letter queue back to the queues they came from,
-- as new jobs with fresh attempts; the dead-letter copies are completed with a
-- pointer to their replacement. One statement: no job is lost or doubled.
WITH picked AS (
    SELECT id FROM {schema}.job
    WHERE queue = %(queue)s AND state IN ('created', 'retry') AND origin_queue IS NOT NULL
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), copies AS (
    SELECT nextval({job_id_seq}) AS new_id, d.*
    FROM {schema}.job d JOIN picked USING (id)
), inserted AS (
    INSERT INTO {schema}.job (
        id, queue, data, priority, retry_limit, retry_delay, retry_backoff, retry_delay_max,
        expire_in, dead_letter, start_after, created_at)
    SELECT new_id, origin_queue, data, priority, retry_limit, retry_delay, retry_backoff,
           retry_delay_max, expire_in, queue, coalesce(%(now)s::timestamptz, now()),
           coalesce(%(now)s::timestamptz, now())
    FROM copies
    RETURNING id
)
UPDATE {schema}.job j
SET state = 'completed',
    finished_at = coalesce(%(now)s::timestamptz, now()),
    lease_expires_at = NULL,
    output = jsonb_build_object('redriven_to', c.new_id)
FROM copies c
WHERE j.id = c.id
RETURNING j.id, c.new_id

-- name: archive_finished
-- Moves finished jobs past their retention to the archive. Waiting and active
-- jobs are never touched: a job that has not run is never removed.
WITH moved AS (
    DELETE FROM {schema}.job
    WHERE id IN (
        SELECT id FROM {schema}.job
        WHERE state IN ('completed', 'cancelled', 'failed')
          AND finished_at < coalesce(%(now)s::timestamptz, now()) - %(retention_s)s * interval '1 second'
        ORDER BY finished_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED)
    RETURNING *
)
INSERT INTO {schema}.job_archive (
    id, queue, state, priority, data, attempt, retry_limit, retry_delay, retry_backoff,
    retry_delay_max, expire_in, singleton_key, dead_letter, origin_queue, origin_id,
    start_after, created_at, started_at, lease_expires_at, finished_at, output, errors,
    partition_key, cost, holder, archived_at)
SELECT id, queue, state, priority, data, attempt, retry_limit, retry_delay, retry_backoff,
       retry_delay_max, expire_in, singleton_key, dead_letter, origin_queue, origin_id,
       start_after, created_at, started_at, lease_expires_at, finished_at, output, errors,
       partition_key, cost, holder, coalesce(%(now)s::timestamptz, now())
FROM moved

-- name: prune_archive
-- Deletes archived jobs past the archive's retention.
DELETE FROM {schema}.job_archive
WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM {schema}.job_archive
    WHERE archived_at < coalesce(%(now)s::timestamptz, now()) - %(retention_s)s * interval '1 second'
    LIMIT %(limit)s))

-- name: queue_stats
-- Jobs per queue and state, and the age of the oldest job that could run now.
SELECT queue, state::text, count(*),
       max(coalesce(%(now)s::timestamptz, now()) - greatest(created_at, start_after))
           FILTER (WHERE state IN ('created', 'retry')
                   AND start_after <= coalesce(%(now)s::timestamptz, now()))
FROM {schema}.job
GROUP BY queue, state
ORDER BY queue, state

-- name: paused_queues
SELECT queue FROM {schema}.paused_queue ORDER BY queue

-- name: pause_queue
INSERT INTO {schema}.paused_queue (queue, paused_at)
VALUES (%(queue)s, coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (queue) DO NOTHING

-- name: resume_queue
DELETE FROM {schema}.paused_queue WHERE queue = %(queue)s

-- name: get_job
-- One job, live or archived. Its start_after and lease end within what
-- Python loads (readable_time_v1, shoal/queue/functions.sql): an
-- older row may hold 'infinity', or a lease of thousands of years.
SELECT id, queue, state::text AS state, data, priority, attempt, retry_limit,
       extract(epoch FROM retry_delay)::float8 AS retry_delay_s, retry_backoff,
       extract(epoch FROM retry_delay_max)::float8 AS retry_delay_max_s,
       extract(epoch FROM expire_in)::float8 AS expire_in_s,
       singleton_key, dead_letter, origin_queue, origin_id,
       {schema}.readable_time_v1(start_after) AS start_after, created_at, started_at,
       {schema}.readable_time_v1(lease_expires_at) AS lease_expires_at, finished_at, output,
       errors, (SELECT w.id FROM {schema}.worker w WHERE w.no = holder) AS holder
FROM {schema}.job WHERE id = %(id)s
UNION ALL
SELECT id, queue, state::text AS state, data, priority, attempt, retry_limit,
       extract(epoch FROM retry_delay)::float8 AS retry_delay_s, retry_backoff,
       extract(epoch FROM retry_delay_max)::float8 AS retry_delay_max_s,
       extract(epoch FROM expire_in)::float8 AS expire_in_s,
       singleton_key, dead_letter, origin_queue, origin_id,
       {schema}.readable_time_v1(start_after) AS start_after, created_at, started_at,
       {schema}.readable_time_v1(lease_expires_at) AS lease_expires_at, finished_at, output,
       errors, (SELECT w.id FROM {schema}.worker w WHERE w.no = holder) AS holder
FROM {schema}.job_archive WHERE id = %(id)s
LIMIT 1

-- name: list_jobs
-- A page of jobs in some states, newest first, below a cursor id; of one
-- queue, or (queue NULL) of every queue, leaving out the queues whose names
-- start with %(hide_prefix)s (none when NULL). Used by Shoal.jobs and the console.
SELECT id, queue, state::text AS state, data, priority, attempt, retry_limit,
       extract(epoch FROM retry_delay)::float8 AS retry_delay_s, retry_backoff,
       extract(epoch FROM retry_delay_max)::float8 AS retry_delay_max_s,
       extract(epoch FROM expire_in)::float8 AS expire_in_s,
       singleton_key, dead_letter, origin_queue, origin_id,
       {schema}.readable_time_v1(start_after) AS start_after, created_at, started_at,
       {schema}.readable_time_v1(lease_expires_at) AS lease_expires_at, finished_at, output,
       errors, (SELECT w.id FROM {schema}.worker w WHERE w.no = holder) AS holder
FROM {schema}.job
WHERE state = ANY(%(states)s::{schema}.job_state[])
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(hide_prefix)s::text IS NULL OR NOT starts_with(queue, %(hide_prefix)s::text))
  AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s::bigint)
ORDER BY id DESC
LIMIT %(limit)s

-- name: upsert_schedule
-- Creates or replaces a cron schedule. A new schedule's first tick is the next
-- one after now; a replaced one keeps its place.
INSERT INTO {schema}.schedule (name, queue, cron, timezone, data, options, last_tick, created_at, updated_at)
VALUES (%(name)s, %(queue)s, %(cron)s, %(timezone)s, %(data)s::jsonb, %(options)s::jsonb,
        coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()),
        coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (name) DO UPDATE
SET queue = excluded.queue, cron = excluded.cron, timezone = excluded.timezone,
    data = excluded.data, options = excluded.options, updated_at = excluded.updated_at

-- name: delete_schedule
DELETE FROM {schema}.schedule WHERE name = %(name)s RETURNING name

-- name: list_schedules
-- Every schedule, paused or not, with the state of the job its latest tick
-- sent (live or archived). The scheduler skips the paused ones; the console
-- lists them all.
SELECT s.name, s.queue, s.cron, s.timezone, s.data, s.options, s.last_tick,
       coalesce(%(now)s::timestamptz, now()), s.created_at, s.updated_at, s.paused_at,
       s.owner, s.last_job_id, coalesce(j.state::text, a.state::text)
FROM {schema}.schedule s
LEFT JOIN {schema}.job j ON j.id = s.last_job_id
LEFT JOIN {schema}.job_archive a ON j.id IS NULL AND a.id = s.last_job_id
ORDER BY s.name

-- name: advance_schedule
-- Claims one tick of a schedule: only the process whose update moves last_tick
-- forward enqueues that tick's job (in the same transaction).
UPDATE {schema}.schedule
SET last_tick = %(tick)s
WHERE name = %(name)s AND last_tick < %(tick)s
RETURNING name

-- name: record_tick_job
-- The job a tick sent, in the tick's transaction (the console shows its state).
UPDATE {schema}.schedule SET last_job_id = %(job_id)s WHERE name = %(name)s

-- name: own_schedules
-- Marks schedules as declared by an App (App.start), see drop_disowned_schedules.
UPDATE {schema}.schedule SET owner = %(owner)s WHERE name = ANY(%(names)s::text[])

-- name: drop_disowned_schedules
-- The schedules an App declared before and declares no more.
DELETE FROM {schema}.schedule
WHERE owner = %(owner)s AND NOT (name = ANY(%(names)s::text[]))
RETURNING name

-- name: notify_queues
-- Wakes idle workers of these queues in every process (delivered on commit).
SELECT pg_notify(%(channel)s, q) FROM unnest(%(queues)s::text[]) AS q

-- name: set_queue_default
-- Creates or replaces a queue's default job options (NULL: no default for it).
INSERT INTO {schema}.queue_default (
    queue, priority, retry_limit, retry_delay, retry_backoff, retry_delay_max, expire_in,
    dead_letter, updated_at)
VALUES (%(queue)s, %(priority)s, %(retry_limit)s, %(retry_delay_s)s * interval '1 second',
        %(retry_backoff)s, %(retry_delay_max_s)s * interval '1 second',
        %(expire_in_s)s * interval '1 second', %(dead_letter)s, now())
ON CONFLICT (queue) DO UPDATE SET
    priority = EXCLUDED.priority, retry_limit = EXCLUDED.retry_limit,
    retry_delay = EXCLUDED.retry_delay, retry_backoff = EXCLUDED.retry_backoff,
    retry_delay_max = EXCLUDED.retry_delay_max, expire_in = EXCLUDED.expire_in,
    dead_letter = EXCLUDED.dead_letter, updated_at = EXCLUDED.updated_at

-- name: delete_queue_default
DELETE FROM {schema}.queue_default WHERE queue = %(queue)s

-- name: get_queue_default
-- A queue's default options, intervals in seconds.
SELECT queue, priority, retry_limit, extract(epoch FROM retry_delay)::float8, retry_backoff,
       extract(epoch FROM retry_delay_max)::float8, extract(epoch FROM expire_in)::float8,
       dead_letter, updated_at
FROM {schema}.queue_default WHERE queue = %(queue)s

-- name: declare_limits
-- Creates or replaces a queue's limits (every worker that declares them, when
-- it starts). The cursor of partition turns is kept.
INSERT INTO {schema}.queue_limit AS l (
    queue, concurrency, rate_count, rate_period, rate_burst, partition_field, partition_by,
    declared_at)
VALUES (%(queue)s, %(concurrency)s, %(rate_count)s, %(rate_period_s)s * interval '1 second',
        %(rate_burst)s, %(partition_field)s, %(partition_by)s,
        coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (queue) DO UPDATE
SET concurrency = excluded.concurrency, rate_count = excluded.rate_count,
    rate_period = excluded.rate_period, rate_burst = excluded.rate_burst,
    partition_field = excluded.partition_field, partition_by = excluded.partition_by,
    declared_at = excluded.declared_at

-- name: stamp_partitions
-- Gives the unfinished jobs of a limited queue that have no partition key
-- theirs (as the insert would have): jobs sent before the queue's limits were
-- declared, or by an insert whose snapshot did not see the declaration yet.
-- Active ones too, so they hold their slots.
UPDATE {schema}.job j
SET partition_key = CASE WHEN l.partition_by IS NULL THEN ''
                         ELSE coalesce(j.data ->> l.partition_field, '') END
FROM {schema}.queue_limit l
WHERE l.queue = %(queue)s AND j.queue = l.queue
  AND j.state IN ('created', 'retry', 'active') AND j.partition_key IS NULL

-- name: clear_limits
DELETE FROM {schema}.queue_limit WHERE queue = %(queue)s RETURNING queue

-- name: is_limited
SELECT EXISTS (SELECT 1 FROM {schema}.queue_limit WHERE queue = %(queue)s)

-- name: other_transactions
-- The transactions running now in other sessions (their virtual ids): an
-- insert among them may have read queue_limit before a declaration committed.
SELECT array_agg(l.virtualtransaction) FROM pg_locks l
JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'virtualxid' AND l.granted AND l.pid <> pg_backend_pid()
  AND a.datname = current_database() AND a.backend_type = 'client backend'

-- name: transactions_running
-- How many of those are still running.
SELECT count(*) FROM pg_locks
WHERE locktype = 'virtualxid' AND granted AND virtualtransaction = ANY(%(vxids)s::text[])

-- name: pause_partitions
-- A handler's RetryAfter: no job of its job's partition starts before now +
-- delay (a later pause already there is kept). The key is read from the job
-- row ('' when it has none).
INSERT INTO {schema}.limit_bucket AS b (queue, partition_key, tokens, refilled_at, paused_until)
SELECT j.queue, coalesce(j.partition_key, ''), coalesce(l.rate_burst, 0),
       coalesce(%(now)s::timestamptz, now()),
       coalesce(%(now)s::timestamptz, now()) + u.delay_s * interval '1 second'
FROM unnest(%(ids)s::bigint[], %(delays_s)s::float8[]) AS u(id, delay_s)
JOIN {schema}.job j ON j.id = u.id
LEFT JOIN {schema}.queue_limit l ON l.queue = j.queue
ORDER BY j.queue, coalesce(j.partition_key, '')  -- bucket rows in key order, as the claim writes them
ON CONFLICT (queue, partition_key) DO UPDATE
SET paused_until = greatest(b.paused_until, excluded.paused_until)

-- name: limit_states
-- Per limited queue and partition: its limits, active and waiting jobs, the
-- tokens its bucket holds now and its pause. Partitions with jobs or a
-- bucket row, busiest first, at most %(limit)s.
WITH counts AS (
    SELECT j.queue, j.partition_key,
           count(*) FILTER (WHERE j.state = 'active') AS running,
           count(*) FILTER (WHERE j.state IN ('created', 'retry')) AS waiting
    FROM {schema}.queue_limit l
    JOIN {schema}.job j ON j.queue = l.queue AND j.partition_key IS NOT NULL
        AND j.state IN ('created', 'retry', 'active')
    GROUP BY j.queue, j.partition_key
), parts AS (
    SELECT coalesce(c.queue, b.queue) AS queue,
           coalesce(c.partition_key, b.partition_key) AS partition_key,
           coalesce(c.running, 0) AS running, coalesce(c.waiting, 0) AS waiting,
           b.tokens, b.refilled_at, b.paused_until
    FROM counts c
    FULL JOIN ({schema}.limit_bucket b JOIN {schema}.queue_limit bl ON bl.queue = b.queue)
        ON b.queue = c.queue AND b.partition_key = c.partition_key
)
SELECT l.queue, p.partition_key, l.concurrency, l.rate_count,
       extract(epoch FROM l.rate_period)::float8, l.rate_burst, l.partition_by,
       coalesce(p.running, 0), coalesce(p.waiting, 0),
       CASE WHEN l.rate_count IS NULL THEN NULL
            WHEN p.tokens IS NULL THEN l.rate_burst::float8
            ELSE least(l.rate_burst::float8, p.tokens + l.rate_count
                 * greatest(0, extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - p.refilled_at))
                 / extract(epoch FROM l.rate_period)) END,
       CASE WHEN p.paused_until > coalesce(%(now)s::timestamptz, now()) THEN p.paused_until END
FROM {schema}.queue_limit l
LEFT JOIN parts p ON p.queue = l.queue
WHERE %(queue)s::text IS NULL OR l.queue = %(queue)s::text
ORDER BY l.queue, coalesce(p.running, 0) + coalesce(p.waiting, 0) DESC, p.partition_key
LIMIT %(limit)s

-- name: prune_buckets
-- Deletes partition state that says nothing a missing row would not: a
-- bucket that has refilled to full (or has no rate) and no pause in force.
-- A partition's first claim after that finds a full bucket, as before. A claim
-- that read the row before this deletes it writes it back from that read.
DELETE FROM {schema}.limit_bucket b
WHERE b.ctid = ANY(ARRAY(
    SELECT b2.ctid FROM {schema}.limit_bucket b2
    LEFT JOIN {schema}.queue_limit l ON l.queue = b2.queue
    WHERE (b2.paused_until IS NULL OR b2.paused_until <= coalesce(%(now)s::timestamptz, now()))
      AND (l.rate_count IS NULL
           OR b2.tokens + l.rate_count
              * greatest(0, extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - b2.refilled_at))
              / extract(epoch FROM l.rate_period) >= l.rate_burst)
    LIMIT %(limit)s))
  AND (b.paused_until IS NULL OR b.paused_until <= coalesce(%(now)s::timestamptz, now()))

-- name: report_costs
-- What runs really cost (Job.report_cost), against the rates of their queues:
-- each partition's bucket gives (or gets back) the difference from the cost
-- its jobs' starts already took, capped at a full bucket. A partition with no
-- row had a full bucket. Queues without a rate are left alone.
INSERT INTO {schema}.limit_bucket AS b (queue, partition_key, tokens, refilled_at)
SELECT j.queue, j.partition_key, l.rate_burst - sum(u.cost - j.cost),
       coalesce(%(now)s::timestamptz, now())
FROM unnest(%(ids)s::bigint[], %(costs)s::int[]) AS u(id, cost)
JOIN {schema}.job j ON j.id = u.id
JOIN {schema}.queue_limit l ON l.queue = j.queue AND l.rate_count IS NOT NULL
WHERE j.partition_key IS NOT NULL
GROUP BY j.queue, j.partition_key, l.rate_burst
ORDER BY j.queue, j.partition_key  -- bucket rows in key order, as the claim writes them
ON CONFLICT (queue, partition_key) DO UPDATE
SET tokens = least(
    b.tokens + excluded.tokens
        - (SELECT l.rate_burst FROM {schema}.queue_limit l WHERE l.queue = b.queue),
    (SELECT l.rate_burst FROM {schema}.queue_limit l WHERE l.queue = b.queue))

-- name: stamp_unkeyed
-- stamp_partitions for every limited queue: the unfinished jobs that reached
-- one without a key (sent by the previous release's code, or by an insert
-- that raced the queue's first declaration). Reads every waiting job of the
-- limited queues: maintenance runs it now and then, not on every pass.
UPDATE {schema}.job j
SET partition_key = CASE WHEN l.partition_by IS NULL THEN ''
                         ELSE coalesce(j.data ->> l.partition_field, '') END
FROM {schema}.queue_limit l
WHERE j.queue = l.queue
  AND j.state IN ('created', 'retry', 'active') AND j.partition_key IS NULL

-- name: register_worker
-- This process's row in the worker registry (shoal/queue/registry.py); its
-- number is what this process's claims record on each job (job.holder).
INSERT INTO {schema}.worker (id, host, pid, app, queues, started_at, heartbeat_at,
                             rescue_after_s)
VALUES (%(id)s, %(host)s, %(pid)s, %(app)s, %(queues)s::jsonb,
        coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()),
        %(rescue_after_s)s)
ON CONFLICT (id) DO UPDATE
SET queues = excluded.queues, heartbeat_at = excluded.heartbeat_at,
    rescue_after_s = excluded.rescue_after_s
RETURNING no

-- name: heartbeat_worker
-- Returns nothing when the row was dropped (the process stalled past the drop
-- timeout): the caller registers again.
UPDATE {schema}.worker
SET heartbeat_at = coalesce(%(now)s::timestamptz, now()), running = %(running)s,
    running_by_queue = %(running_by_queue)s::jsonb, done = %(done)s,
    queues = %(queues)s::jsonb
WHERE id = %(id)s
RETURNING id

-- name: drop_gone_workers
DELETE FROM {schema}.worker
WHERE heartbeat_at < coalesce(%(now)s::timestamptz, now()) - %(drop_s)s * interval '1 second'

-- name: deregister_worker
DELETE FROM {schema}.worker WHERE id = %(id)s

-- name: list_workers
-- Every registered process, live or gone (the console's Workers page).
SELECT id, host, pid, app, queues, started_at, heartbeat_at, running, done,
       -- gone: silent past the gone timeout, or past its own rescue_after when
       -- shorter (its jobs are handed back by then)
       heartbeat_at < coalesce(%(now)s::timestamptz, now())
                      - least(%(gone_s)s, rescue_after_s) * interval '1 second',
       rescued, rescued_at
FROM {schema}.worker
ORDER BY host, pid, started_at
