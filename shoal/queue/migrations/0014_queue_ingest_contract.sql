-- Jobs for messages: the queue's contract with the ingest layer, whose
-- postgres transport keeps a topic's messages as the jobs of one queue. The
-- ingest layer reads and writes the job table only through these functions
-- (and the queue's store for nak, term and touch). Versioned as in
-- 0006_queue_functions_v1.sql: never edited; a change is a new _v2 beside it.

-- claim_jobs_v1 with the lease chosen by the caller: a consumer leases what
-- it takes for its own ack wait, whatever the job was inserted with. The
-- lease is written into expire_in as well, so a touch (extend_leases) extends
-- by the same amount and maintenance expires it as any job's lease. Same
-- plan, planner switches and asynchronous commit as claim_jobs of
-- 0001_queue.sql (see there for why). Returns the claim row.
CREATE FUNCTION {schema}.claim_jobs_leased_v1(
    p_queue text, p_limit integer, p_now timestamptz, p_lease interval)
RETURNS TABLE (
    id bigint, queue text, data text, priority integer, attempt integer,
    retry_limit integer, retry_delay_s float8, retry_backoff boolean, retry_delay_max_s float8,
    expire_in_s float8, singleton_key text, dead_letter text, created_at timestamptz,
    started_at timestamptz, lease_expires_at timestamptz)
LANGUAGE sql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
    SELECT set_config('synchronous_commit', 'off', true);
    WITH next AS (
        SELECT j.id
        FROM {schema}.job j
        WHERE j.queue = p_queue
          AND j.state IN ('created', 'retry')
          AND j.start_after <= coalesce(p_now, now())
          AND NOT EXISTS (SELECT 1 FROM {schema}.paused_queue p WHERE p.queue = p_queue)
        ORDER BY j.priority DESC, j.id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    )
    UPDATE {schema}.job j
    SET state = 'active',
        attempt = j.attempt + 1,
        started_at = coalesce(p_now, now()),
        expire_in = p_lease,
        lease_expires_at = coalesce(p_now, now()) + p_lease
    FROM next
    WHERE j.id = next.id
    RETURNING j.id, j.queue, j.data::text, j.priority, j.attempt, j.retry_limit,
              extract(epoch FROM j.retry_delay)::float8, j.retry_backoff,
              extract(epoch FROM j.retry_delay_max)::float8,
              extract(epoch FROM j.expire_in)::float8, j.singleton_key, j.dead_letter,
              j.created_at, j.started_at, j.lease_expires_at;
$$;

-- Deletes active jobs, each fenced by the attempt its taker was handed (a
-- job claimed again since is not the caller's): an acknowledgement that keeps
-- no finished row, for callers that record the outcome themselves (a topic's
-- done-marker). A delete writes no new row version and no index entries.
-- Returns the ids deleted. One primary-key probe per id.
CREATE FUNCTION {schema}.delete_jobs_v1(p_ids bigint[], p_attempts integer[])
RETURNS TABLE (id bigint)
LANGUAGE sql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
    DELETE FROM {schema}.job AS j
    USING unnest(p_ids, p_attempts) AS u(id, attempt)
    WHERE j.id = u.id AND j.attempt = u.attempt AND j.state = 'active'
    RETURNING j.id;
$$;

-- The backlog of one queue: jobs ready to claim, active, and delayed (waiting
-- for their start_after), and the age in seconds of the oldest unfinished one
-- (NULL when there is none). STABLE and a single SELECT without planner
-- switches, so the planner inlines it into the caller's statement.
CREATE FUNCTION {schema}.queue_depth_v1(p_queue text, p_now timestamptz)
RETURNS TABLE (ready bigint, in_flight bigint, delayed bigint, oldest_age_s float8)
LANGUAGE sql
STABLE
AS $$
    SELECT count(*) FILTER (WHERE j.state IN ('created', 'retry')
                            AND j.start_after <= coalesce(p_now, now())),
           count(*) FILTER (WHERE j.state = 'active'),
           count(*) FILTER (WHERE j.state IN ('created', 'retry')
                            AND j.start_after > coalesce(p_now, now())),
           extract(epoch FROM coalesce(p_now, now()) - min(j.created_at))::float8
    FROM {schema}.job j
    WHERE j.queue = p_queue AND j.state IN ('created', 'retry', 'active');
$$;
