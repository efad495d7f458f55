-- SQL of the queue layer's history sampler (the console's charts), run by
-- shoal/queue/store.py for shoal/queue/history.py. The charts' read is the
-- console's (shoal/console/console.sql).

-- name: sample
-- One sample of every queue (and of all: queue '*' for every queue but
-- shoal's own, those named %(internal_prefix)s..., the console's default chart;
-- '**' for every queue) at the latest multiple
-- of %(resolution)s seconds, unless there is one: jobs finished since the
-- previous sample (at most one interval back), their run-time and queue-wait
-- percentiles, and the depths now. Finished jobs are read through the
-- job_finished index, waiting and retrying through job_claim and job_retry_queue
-- (a queue's created and retry jobs estimated past %(depth_cap)s, see claimable),
-- running from the registry: the worker processes whose heartbeat is at most
-- %(gone_s)s seconds old report it per queue.
-- At most %(finished_cap)s finished jobs are read, the latest: when more
-- finished in the interval, the counts are those read scaled by the interval
-- over the time they span (an estimate, exact at a steady rate), and the
-- percentiles are those of the jobs read. Reading every one of them cost a
-- round 0.9 s with 190,000 finished in 10 s (docs/benchmarks.md).
WITH RECURSIVE slot AS (
    SELECT to_timestamp(floor(extract(epoch FROM coalesce(%(now)s::timestamptz, now()))
                              / %(resolution)s) * %(resolution)s) AS at
), span AS (
    SELECT slot.at, greatest(prev.at, slot.at - %(resolution)s * interval '1 second') AS since
    FROM slot, (
        SELECT max(at) AS at FROM {schema}.history
        WHERE resolution = %(resolution)s AND queue = '*'
    ) prev
    WHERE prev.at IS NULL OR prev.at < slot.at
), finished AS MATERIALIZED (
    SELECT j.queue, j.state, j.finished_at,
           -- NULL (left out of the percentiles) for a job completed as it was
           -- taken (a batch item's delivery, a redriven copy): it never ran.
           extract(epoch FROM nullif(j.finished_at - j.started_at, interval '0')) AS run_s,
           extract(epoch FROM j.started_at - j.created_at) AS wait_s
    FROM span, LATERAL (
        SELECT queue, state, finished_at, started_at, created_at
        FROM {schema}.job
        WHERE state IN ('completed', 'cancelled', 'failed')
          AND finished_at > span.since AND finished_at <= span.at
        ORDER BY finished_at DESC
        LIMIT %(finished_cap)s + 1
    ) j
), scale AS MATERIALIZED (
    -- 1 when every finished job was read; else the interval over the span read.
    -- Materialized: inlined, it was computed again for each finished job
    -- (2,001 times, 5-10 ms of a sample).
    SELECT CASE WHEN count(*) <= %(finished_cap)s THEN 1.0
                ELSE extract(epoch FROM span.at - span.since)
                     / greatest(extract(epoch FROM span.at - min(f.finished_at)), 0.001)
           END AS factor
    FROM span LEFT JOIN finished f ON true
    GROUP BY span.at, span.since
), scoped_finished AS (
    -- Each finished job counts for its queue, for '**', and for '*' unless
    -- its queue is shoal's own.
    SELECT queue AS scope, state, finished_at, run_s, wait_s FROM finished
    UNION ALL
    SELECT '**', state, finished_at, run_s, wait_s FROM finished
    UNION ALL
    SELECT '*', state, finished_at, run_s, wait_s FROM finished
    WHERE NOT starts_with(queue, %(internal_prefix)s)
), by_finished AS (
    SELECT scope AS queue,
           round(count(*) FILTER (WHERE state = 'completed') * min(scale.factor))::bigint
               AS completed,
           round(count(*) FILTER (WHERE state = 'failed') * min(scale.factor))::bigint AS failed,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY run_s) AS run_p50,
           percentile_cont(0.95) WITHIN GROUP (ORDER BY run_s) AS run_p95,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY wait_s) AS wait_p50,
           percentile_cont(0.95) WITHIN GROUP (ORDER BY wait_s) AS wait_p95
    FROM scoped_finished, scale
    GROUP BY scope
), claim_queues (queue) AS (
    -- The queues with created or retry jobs: one step down job_claim each.
    SELECT min(queue) FROM {schema}.job WHERE state IN ('created', 'retry')
    UNION ALL
    SELECT (SELECT min(j.queue) FROM {schema}.job j
            WHERE j.state IN ('created', 'retry') AND j.queue > c.queue)
    FROM claim_queues c
    WHERE c.queue IS NOT NULL
), claimable AS (
    -- Created and retry jobs per queue from the head of job_claim: exact up
    -- to %(depth_cap)s. Past it, when the head and the tail of the queue are
    -- of one priority, the count is estimated from the ids: the head's jobs
    -- per id times the ids from its first job to the queue's last (its jobs
    -- spread evenly over the ids between). Else it is counted. Counting a
    -- queue that a drain is emptying checked every one of its fresh index
    -- entries against the table: 0.4 s a sample with 600,000 of them.
    SELECT c.queue,
           CASE WHEN h.n <= %(depth_cap)s THEN h.n
                WHEN h.low = h.high AND h.high = t.priority AND h.last_id > h.first_id
                     AND t.id >= h.last_id
                THEN round(h.n * (t.id - h.first_id + 1)::numeric
                           / (h.last_id - h.first_id + 1))::bigint
                ELSE (SELECT count(*) FROM {schema}.job
                      WHERE queue = c.queue AND state IN ('created', 'retry'))
           END AS n
    FROM claim_queues c
    CROSS JOIN LATERAL (
        SELECT count(*) AS n, min(priority) AS low, max(priority) AS high,
               min(id) AS first_id, max(id) AS last_id
        FROM (SELECT priority, id FROM {schema}.job
              WHERE queue = c.queue AND state IN ('created', 'retry')
              ORDER BY priority DESC, id
              LIMIT %(depth_cap)s + 1) head
    ) h
    CROSS JOIN LATERAL (
        SELECT priority, id FROM {schema}.job
        WHERE queue = c.queue AND state IN ('created', 'retry')
        ORDER BY priority, id DESC
        LIMIT 1
    ) t
    WHERE c.queue IS NOT NULL
), depth AS (
    -- Each count from an index of its own, without reading the table where
    -- the visibility map allows (the index job_retry_queue): created and retry
    -- together (job_claim, above), retry (job_retry_queue).
    -- One count over all three states read every unfinished job's row: 450 ms
    -- a sample with 200,000 of them. The round runs with sequential scans
    -- off and JIT off (plan_switches): with statistics older than a drain's
    -- insert the planner took a sequential scan of the whole table for a count.
    SELECT queue, n, 0::bigint AS retrying, 0::bigint AS running FROM claimable
    UNION ALL
    SELECT queue, 0, count(*), 0 FROM {schema}.job WHERE state = 'retry' GROUP BY queue
    UNION ALL
    -- Running: what the live worker processes reported at their last
    -- heartbeat, not a count of job_lease (shoal/queue/history.py says why).
    SELECT r.key, 0, 0, sum(r.value::bigint)::bigint
    FROM {schema}.worker w, jsonb_each_text(w.running_by_queue) r
    WHERE w.heartbeat_at >= coalesce(%(now)s::timestamptz, now()) - %(gone_s)s * interval '1 second'
    GROUP BY r.key
), scoped_depth AS (
    SELECT queue AS scope, n, retrying, running FROM depth
    UNION ALL
    SELECT '**', n, retrying, running FROM depth
    UNION ALL
    SELECT '*', n, retrying, running FROM depth
    WHERE NOT starts_with(queue, %(internal_prefix)s)
), by_depth AS (
    SELECT scope AS queue,
           greatest(sum(n - retrying), 0)::bigint AS waiting,
           sum(running)::bigint AS running,
           sum(retrying)::bigint AS retrying
    FROM scoped_depth
    GROUP BY scope
), scopes AS (
    -- '*' and '**' have a row in every sample, jobs or none.
    SELECT queue FROM by_finished UNION SELECT queue FROM by_depth
    UNION VALUES ('*'), ('**')
)
INSERT INTO {schema}.history (resolution, queue, at, completed, failed, waiting, running,
                              retrying, run_p50_s, run_p95_s, wait_p50_s, wait_p95_s)
SELECT %(resolution)s, queue, span.at, coalesce(f.completed, 0), coalesce(f.failed, 0),
       coalesce(d.waiting, 0), coalesce(d.running, 0), coalesce(d.retrying, 0),
       f.run_p50, f.run_p95, f.wait_p50, f.wait_p95
FROM span, scopes LEFT JOIN by_finished f USING (queue) LEFT JOIN by_depth d USING (queue)
ON CONFLICT DO NOTHING

-- name: plan_switches
-- For the sampling round's transaction: its counts read indexes, whatever
-- the table's statistics say (see sample), and without JIT compilation: the
-- estimated cost of those plans passes jit_above_cost, and compiling them
-- took 1 s, ten times running them.
SELECT set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true)

-- name: prune_history
DELETE FROM {schema}.history
WHERE resolution = %(resolution)s
  AND at < coalesce(%(now)s::timestamptz, now()) - %(keep_s)s * interval '1 second'
