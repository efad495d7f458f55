-- SQL of the console (the API's console routes and pages, the console CLI):
-- reads of every layer's tables, and the operator's controls of queues, jobs
-- and schedules. Run only by shoal/console/store.py.
-- Every time-dependent statement takes %(now)s; NULL means the database clock.

-- == queues, jobs and schedules (the queue layer's tables) ==================

-- name: queue_names
-- Every queue there is a trace of: waiting or failed jobs (each walked one
-- name at a time down its partial index: a few probes per queue however many
-- jobs), a recent history sample (queues whose jobs all finished), a pause, a
-- schedule, a live worker serving it.
WITH RECURSIVE waiting AS (
    (SELECT queue FROM {schema}.job WHERE state IN ('created', 'retry') ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM {schema}.job j
            WHERE j.state IN ('created', 'retry') AND j.queue > w.queue
            ORDER BY j.queue LIMIT 1)
    FROM waiting w WHERE w.queue IS NOT NULL
), failed AS (
    (SELECT queue FROM {schema}.job WHERE state = 'failed' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM {schema}.job j
            WHERE j.state = 'failed' AND j.queue > f.queue
            ORDER BY j.queue LIMIT 1)
    FROM failed f WHERE f.queue IS NOT NULL
)
SELECT queue FROM waiting WHERE queue IS NOT NULL
UNION SELECT queue FROM failed WHERE queue IS NOT NULL
UNION SELECT DISTINCT queue FROM {schema}.history
      WHERE resolution = 300 AND queue NOT IN ('*', '**')
        AND at > coalesce(%(now)s::timestamptz, now()) - interval '1 day'
UNION SELECT queue FROM {schema}.paused_queue
UNION SELECT queue FROM {schema}.schedule
UNION SELECT jsonb_object_keys(queues) FROM {schema}.worker
ORDER BY 1

-- name: queue_known
-- Probes the cheap traces first; only a name none of them knows costs a
-- scan of the job table (an error path: a mistyped name).
SELECT EXISTS (SELECT 1 FROM {schema}.job WHERE queue = %(queue)s AND state IN ('created', 'retry'))
    OR EXISTS (SELECT 1 FROM {schema}.job WHERE queue = %(queue)s AND state = 'failed')
    OR EXISTS (SELECT 1 FROM {schema}.paused_queue WHERE queue = %(queue)s)
    OR EXISTS (SELECT 1 FROM {schema}.schedule WHERE queue = %(queue)s)
    OR EXISTS (SELECT 1 FROM {schema}.worker WHERE queues ? %(queue)s)
    OR EXISTS (SELECT 1 FROM {schema}.job WHERE queue = %(queue)s)

-- name: queue_paused_at
SELECT queue, paused_at FROM {schema}.paused_queue ORDER BY queue

-- name: job_rows_estimate
-- The planner's count of the job table's rows (-1 before its first analyze):
-- whether counting every job of every queue is cheap enough to do exactly.
SELECT reltuples::float8 FROM pg_class WHERE oid = %(job_table)s::regclass

-- name: queue_counts_indexed
-- Jobs per queue in the states that each have an index of their own, read
-- from the index alone where the visibility map allows: created and retry
-- together (job_claim), retry (job_retry_queue), failed (job_failed_queue),
-- active (job_lease; few: at most the workers' concurrency). Created is the
-- first minus the second. The age of each queue's next due job (in claim
-- order, walking job_claim from its head) stands for its oldest wait.
WITH claimable AS (
    SELECT queue, count(*) AS n FROM {schema}.job WHERE state IN ('created', 'retry') GROUP BY queue
), retrying AS (
    SELECT queue, count(*) AS n FROM {schema}.job WHERE state = 'retry' GROUP BY queue
), failed AS (
    SELECT queue, count(*) AS n FROM {schema}.job WHERE state = 'failed' GROUP BY queue
), active AS (
    SELECT queue, count(*) AS n FROM {schema}.job WHERE state = 'active' GROUP BY queue
)
SELECT q.queue, coalesce(c.n, 0) - coalesce(r.n, 0), coalesce(r.n, 0), coalesce(a.n, 0),
       coalesce(f.n, 0),
       (SELECT coalesce(%(now)s::timestamptz, now()) - greatest(j.created_at, j.start_after)
        FROM {schema}.job j
        WHERE j.queue = q.queue AND j.state IN ('created', 'retry')
          AND j.start_after <= coalesce(%(now)s::timestamptz, now())
        ORDER BY j.priority DESC, j.id
        LIMIT 1)
FROM (SELECT queue FROM claimable UNION SELECT queue FROM failed
      UNION SELECT queue FROM active) q
LEFT JOIN claimable c USING (queue)
LEFT JOIN retrying r USING (queue)
LEFT JOIN failed f USING (queue)
LEFT JOIN active a USING (queue)

-- name: finished_estimates
-- Completed and cancelled jobs per queue as the planner estimates them: the
-- (queue, state) statistics of job_queue_state (an extended statistics object) times the
-- table's rows, as fresh as the last analyze. A pair too rare to be among
-- the statistics' most common values is left out (counted as 0).
SELECT s.most_common_vals[i][1], s.most_common_vals[i][2],
       round(s.most_common_freqs[i] * c.reltuples)::bigint
FROM pg_stats_ext s
CROSS JOIN LATERAL generate_subscripts(s.most_common_vals, 1) AS i
JOIN pg_class c ON c.oid = %(job_table)s::regclass
WHERE s.schemaname = %(schema_name)s AND s.statistics_name = 'job_queue_state'
  AND s.most_common_vals[i][2] IN ('completed', 'cancelled')

-- name: failed_total
-- Failed jobs of every queue but those named %(hide_prefix)s... (none when
-- NULL), from job_failed_queue alone (the overview's count).
SELECT count(*) FROM {schema}.job
WHERE state = 'failed'
  AND (%(hide_prefix)s::text IS NULL OR NOT starts_with(queue, %(hide_prefix)s::text))

-- name: queue_finished_since
-- Jobs that finished per queue since %(since_s)s seconds ago (the job_finished index).
SELECT queue,
       count(*) FILTER (WHERE state = 'completed'),
       count(*) FILTER (WHERE state = 'failed')
FROM {schema}.job
WHERE state IN ('completed', 'cancelled', 'failed')
  AND finished_at > coalesce(%(now)s::timestamptz, now()) - %(since_s)s * interval '1 second'
GROUP BY queue

-- name: list_failed_jobs
-- list_jobs (queries.sql) for the failed state alone: the literal state
-- lets the planner walk the job_failed_queue index (a bound list of states
-- cannot prove its predicate).
SELECT id, queue, state::text AS state, data, priority, attempt, retry_limit,
       extract(epoch FROM retry_delay)::float8 AS retry_delay_s, retry_backoff,
       extract(epoch FROM retry_delay_max)::float8 AS retry_delay_max_s,
       extract(epoch FROM expire_in)::float8 AS expire_in_s,
       singleton_key, dead_letter, origin_queue, origin_id,
       {schema}.readable_time_v1(start_after) AS start_after, created_at, started_at,
       {schema}.readable_time_v1(lease_expires_at) AS lease_expires_at, finished_at, output,
       errors, (SELECT w.id FROM {schema}.worker w WHERE w.no = holder) AS holder
FROM {schema}.job
WHERE state = 'failed'
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(hide_prefix)s::text IS NULL OR NOT starts_with(queue, %(hide_prefix)s::text))
  AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s::bigint)
ORDER BY id DESC
LIMIT %(limit)s

-- name: search_jobs
-- list_jobs (queries.sql) for a search: the job with the id, and those
-- with the singleton key, found through the primary key and the two
-- singleton indexes (finished jobs, and the unfinished ones of each queue),
-- then filtered. Filtering the
-- whole list by the search walked every job of the table in id order: 150 ms
-- at 1,000,000 jobs, for one row.
WITH found AS (
    SELECT * FROM {schema}.job WHERE id = %(search_id)s::bigint
    UNION ALL
    SELECT * FROM {schema}.job
    WHERE singleton_key = %(search)s::text AND state IN ('completed', 'cancelled', 'failed')
      AND id IS DISTINCT FROM %(search_id)s::bigint
    UNION ALL
    SELECT * FROM {schema}.job
    WHERE singleton_key = %(search)s::text AND state IN ('created', 'retry', 'active')
      AND id IS DISTINCT FROM %(search_id)s::bigint
)
SELECT id, queue, state::text AS state, data, priority, attempt, retry_limit,
       extract(epoch FROM retry_delay)::float8 AS retry_delay_s, retry_backoff,
       extract(epoch FROM retry_delay_max)::float8 AS retry_delay_max_s,
       extract(epoch FROM expire_in)::float8 AS expire_in_s,
       singleton_key, dead_letter, origin_queue, origin_id,
       {schema}.readable_time_v1(start_after) AS start_after, created_at, started_at,
       {schema}.readable_time_v1(lease_expires_at) AS lease_expires_at, finished_at, output,
       errors, (SELECT w.id FROM {schema}.worker w WHERE w.no = holder) AS holder
FROM found
WHERE state = ANY(%(states)s::{schema}.job_state[])
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s::bigint)
ORDER BY id DESC
LIMIT %(limit)s

-- name: retry_job
-- failed -> retry or cancelled -> created, to run again now; earlier errors
-- stay. Skipped while another unfinished job of the queue holds its singleton key.
UPDATE {schema}.job j
SET state = CASE WHEN j.state = 'failed' THEN 'retry'::{schema}.job_state
                 ELSE 'created'::{schema}.job_state END,
    finished_at = NULL,
    start_after = coalesce(%(now)s::timestamptz, now())
WHERE j.id = %(id)s AND j.state IN ('failed', 'cancelled')
  AND (j.singleton_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM {schema}.job o
        WHERE o.queue = j.queue AND o.singleton_key = j.singleton_key
          AND o.state IN ('created', 'retry', 'active')))
RETURNING j.queue

-- name: retry_failed
-- Every failed job of a queue back to retry, as retry_job does for one.
UPDATE {schema}.job j
SET state = 'retry', finished_at = NULL, start_after = coalesce(%(now)s::timestamptz, now())
WHERE j.queue = %(queue)s AND j.state = 'failed'
  AND (j.singleton_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM {schema}.job o
        WHERE o.queue = j.queue AND o.singleton_key = j.singleton_key
          AND o.state IN ('created', 'retry', 'active')))

-- name: delete_failed
DELETE FROM {schema}.job WHERE queue = %(queue)s AND state = 'failed'

-- name: delete_job
-- A job that is not running, live or archived. A running job must be cancelled first.
WITH live AS (
    DELETE FROM {schema}.job WHERE id = %(id)s AND state <> 'active' RETURNING id
), archived AS (
    DELETE FROM {schema}.job_archive WHERE id = %(id)s RETURNING id
)
SELECT id FROM live UNION ALL SELECT id FROM archived

-- name: schedule_names
SELECT name FROM {schema}.schedule ORDER BY name

-- name: pause_schedule
UPDATE {schema}.schedule
SET paused_at = coalesce(paused_at, coalesce(%(now)s::timestamptz, now()))
WHERE name = %(name)s
RETURNING name

-- name: resume_schedule
-- Ticks missed while paused are not sent: the next tick is the first after now.
UPDATE {schema}.schedule
SET paused_at = NULL,
    last_tick = CASE WHEN paused_at IS NULL THEN last_tick
                     ELSE greatest(last_tick, coalesce(%(now)s::timestamptz, now())) END
WHERE name = %(name)s
RETURNING name

-- == what a worker process runs (jobs, and batch items) ====================

-- name: worker_running
-- What the registered process %(worker)s runs now, oldest first, each part
-- at most %(limit)s rows: its active jobs (found through job_lease, the
-- partial index of active jobs: no more of them than the workers'
-- concurrency, however many jobs the table holds), then its running batch
-- items (an item's job is taken, not held, at its claim: the item names its
-- process itself), the running items of each processing task
-- (task_processing) through item_task_status. A preview of each payload, cut
-- to %(preview)s characters, stands for its data.
WITH w AS (
    SELECT no FROM {schema}.worker WHERE id = %(worker)s
), jobs AS (
    SELECT 'job' AS what, j.id, j.queue, NULL::text AS task_id, NULL::text AS ref, j.attempt,
           j.started_at, {schema}.readable_time_v1(j.lease_expires_at) AS lease_expires_at,
           left(j.data::text, %(preview)s) AS preview
    FROM {schema}.job j
    WHERE j.state = 'active' AND j.holder = (SELECT no FROM w)
    ORDER BY j.started_at, j.id
    LIMIT %(limit)s
), items AS (
    SELECT 'item' AS what, i.id, %(item_prefix)s || t.kind AS queue, t.id::text AS task_id,
           i.ref, i.attempt, i.started_at, NULL::timestamptz AS lease_expires_at,
           left(i.data::text, %(preview)s) AS preview
    FROM {schema}.task t
    CROSS JOIN LATERAL (
        SELECT i.id, i.ref, i.attempt, i.started_at, i.data
        FROM {schema}.item i
        WHERE i.task_id = t.id AND i.status = 'running' AND i.holder = (SELECT no FROM w)
    ) i
    WHERE t.status = 'processing'
    ORDER BY i.started_at, i.id
    LIMIT %(limit)s
)
SELECT * FROM jobs
UNION ALL
SELECT * FROM items

-- == topics and dead letters (the ingest layer's tables) ===================

-- name: topics
-- Every topic the backlog monitor has seen or that has dead letters, with what
-- the monitor last saw and the dead letters waiting for a redrive.
SELECT coalesce(t.topic, d.topic), coalesce(t.depth, 0), coalesce(t.ready, 0),
       coalesce(t.in_flight, 0), coalesce(t.delayed, 0), t.oldest_age_s, t.wait_s,
       coalesce(t.paused, false), t.checked_at, coalesce(d.waiting, 0)
FROM {schema}.ingest_topic t
FULL JOIN (
    SELECT topic, count(*) FILTER (WHERE redriven_at IS NULL) AS waiting
    FROM {schema}.ingest_dead GROUP BY topic
) d ON d.topic = t.topic
ORDER BY 1

-- name: topic_known
SELECT EXISTS (SELECT 1 FROM {schema}.ingest_topic WHERE topic = %(topic)s)
    OR EXISTS (SELECT 1 FROM {schema}.ingest_dead WHERE topic = %(topic)s)

-- name: topic_names
SELECT topic FROM {schema}.ingest_topic
UNION SELECT DISTINCT topic FROM {schema}.ingest_dead
ORDER BY 1

-- name: dead_page
-- A page of a topic's dead letters, oldest first, after a cursor id; waiting
-- ones only unless %(all)s.
SELECT id, topic, message_id, envelope::text, reason, error, attempt, dead_at, redriven_at
FROM {schema}.ingest_dead
WHERE topic = %(topic)s AND (%(all)s OR redriven_at IS NULL)
  AND (%(after_id)s::bigint IS NULL OR id > %(after_id)s::bigint)
ORDER BY id
LIMIT %(limit)s

-- name: discard_dead
-- Deletes one dead letter of a topic, waiting or redriven; its message id.
DELETE FROM {schema}.ingest_dead
WHERE topic = %(topic)s AND id = %(id)s
RETURNING message_id

-- name: discard_dead_job
-- The postgres transport's own record of a message dead-lettered past its
-- retries: the job its term failed, in the topic's queue. Deleted with the
-- letter, or "retry failed" of that queue would deliver the discarded
-- message again. Walks job_failed_queue (queue, id); the envelope's id is in
-- the job's data. (A nats topic has no jobs: nothing to delete.)
DELETE FROM {schema}.job
WHERE queue = %(queue)s AND state = 'failed' AND data ->> 'id' = %(message_id)s

-- == history (the queue layer's samples, shoal/queue/history.py) ===========

-- name: history
-- The samples of one queue (or '*', or '**') at one resolution over the last %(window_s)s seconds.
SELECT at, completed, failed, waiting, running, retrying, run_p50_s, run_p95_s, wait_p50_s,
       wait_p95_s
FROM {schema}.history
WHERE resolution = %(resolution)s AND queue = %(queue)s
  AND at > coalesce(%(now)s::timestamptz, now()) - %(window_s)s * interval '1 second'
ORDER BY at
