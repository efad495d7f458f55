-- The queue layer's database functions under versioned names, the only names
-- shoal's code calls. A versioned function is never edited: one whose
-- behaviour must change is created anew as _v2 by a later migration, beside
-- the _v1 that workers of the previous release still call; the older name is
-- dropped by a migration of a later release (docs/upgrading.md). The
-- unversioned functions of 0001_queue.sql (claim_jobs, take_jobs,
-- complete_jobs) stay for the workers of the release before this one.
--
-- Every claim returns the same columns, by these names (the claim row): the
-- job's settings with intervals in seconds and the payload as text, parsed
-- only if a handler reads it.

-- claim_jobs of 0001_queue.sql (same plan, same planner switches, same
-- asynchronous commit; see there for why), returning the claim row.
CREATE FUNCTION {schema}.claim_jobs_v1(p_queue text, p_limit integer, p_now timestamptz)
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
        lease_expires_at = coalesce(p_now, now()) + j.expire_in
    FROM next
    WHERE j.id = next.id
    RETURNING j.id, j.queue, j.data::text, j.priority, j.attempt, j.retry_limit,
              extract(epoch FROM j.retry_delay)::float8, j.retry_backoff,
              extract(epoch FROM j.retry_delay_max)::float8,
              extract(epoch FROM j.expire_in)::float8, j.singleton_key, j.dead_letter,
              j.created_at, j.started_at, j.lease_expires_at;
$$;

-- complete_jobs of 0001_queue.sql, unchanged: active -> completed, each fenced
-- by the attempt its worker was handed; the ids completed.
CREATE FUNCTION {schema}.complete_jobs_v1(
    p_ids bigint[], p_attempts integer[], p_outputs jsonb[], p_now timestamptz)
RETURNS TABLE (id bigint)
LANGUAGE sql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
    UPDATE {schema}.job j
    SET state = 'completed',
        finished_at = coalesce(p_now, now()),
        lease_expires_at = NULL,
        output = u.output
    FROM unnest(p_ids, p_attempts, p_outputs) AS u(id, attempt, output)
    WHERE j.id = u.id AND j.state = 'active' AND j.attempt = u.attempt
    RETURNING j.id;
$$;


-- Jobs for items: the queue's contract with the batch layer, which keeps its
-- own record of each run (item rows) and so needs no lease. An item job's
-- payload is {{"item": <item id>, "turn": <turn>}}. The batch layer writes and
-- reads the job table only through these functions.
--
-- Turns make the tasks that share a queue fair: each job of a new task
-- carries its position in the task counted from the queue's current turn, and
-- item jobs are taken by turn (index job_item_turn of 0005_batch_fairness.sql),
-- jobs without a turn first (retries, re-dispatches: a retry starts within its
-- backoff plus one claim whatever the queue holds).

-- One job per item of p_items, all with one set of options, each with the
-- singleton key at the same place in p_keys; the turns continue from the
-- queue's current turn (that of its first due item job with a turn, 0 with
-- none) in p_items' order. Returns how many were inserted. A key an
-- unfinished job of the queue holds fails the statement: the keys are new.
CREATE FUNCTION {schema}.insert_item_jobs_v1(
    p_items bigint[], p_keys text[], p_queue text, p_priority integer, p_retry_limit integer,
    p_retry_delay_s float8, p_retry_backoff boolean, p_retry_delay_max_s float8,
    p_expire_in_s float8, p_dead_letter text, p_start_at timestamptz, p_start_in_s float8,
    p_now timestamptz)
RETURNS bigint
LANGUAGE sql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
    WITH turn AS (
        SELECT coalesce((
            SELECT (j.data->>'turn')::bigint
            FROM {schema}.job j
            WHERE j.queue = p_queue
              AND j.state IN ('created', 'retry')
              AND j.data ? 'item'
              AND j.data ? 'turn'
              AND j.start_after <= coalesce(p_now, now())
            ORDER BY j.priority DESC, (j.data->'turn') NULLS FIRST, j.id
            LIMIT 1), 0) AS first
    ), jobs AS (
        INSERT INTO {schema}.job (
            queue, data, priority, retry_limit, retry_delay, retry_backoff, retry_delay_max,
            expire_in, singleton_key, dead_letter, start_after, created_at)
        SELECT p_queue,
               jsonb_build_object('item', u.item, 'turn', turn.first + u.ord - 1),
               p_priority, p_retry_limit, p_retry_delay_s * interval '1 second', p_retry_backoff,
               p_retry_delay_max_s * interval '1 second', p_expire_in_s * interval '1 second',
               u.key, p_dead_letter,
               coalesce(p_start_at,
                        coalesce(p_now, now()) + coalesce(p_start_in_s, 0) * interval '1 second'),
               coalesce(p_now, now())
        FROM unnest(p_items, p_keys) WITH ORDINALITY AS u(item, key, ord), turn
        RETURNING 1
    )
    SELECT count(*) FROM jobs;
$$;

-- Locks up to p_limit due item jobs of one queue, in turn order, skipping
-- jobs another transaction holds: the first half of a take. The caller locks
-- what else it needs (the items) without waiting, then takes the jobs it can
-- use with take_item_jobs_v1 in the same transaction; the others are released
-- when it ends, still waiting.
CREATE FUNCTION {schema}.lock_item_jobs_v1(p_queue text, p_limit integer, p_now timestamptz)
RETURNS TABLE (id bigint, item_id bigint)
LANGUAGE sql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
    SELECT j.id, (j.data->>'item')::bigint
    FROM {schema}.job j
    WHERE j.queue = p_queue
      AND j.state IN ('created', 'retry')
      AND j.data ? 'item'
      AND j.start_after <= coalesce(p_now, now())
      AND NOT EXISTS (SELECT 1 FROM {schema}.paused_queue p WHERE p.queue = p_queue)
    ORDER BY j.priority DESC, (j.data->'turn') NULLS FIRST, j.id
    LIMIT p_limit
    FOR UPDATE OF j SKIP LOCKED;
$$;

-- Takes waiting jobs this transaction locked (lock_item_jobs_v1): created |
-- retry -> completed in one step, a one-shot delivery. No lease is taken, so
-- nothing expires and no completion is written later. Returns the claim row
-- (lease_expires_at NULL) and the item of each job taken, in p_ids' order
-- (one primary-key probe per id, in turn: the order the jobs were locked in).
CREATE FUNCTION {schema}.take_item_jobs_v1(p_ids bigint[], p_now timestamptz)
RETURNS TABLE (
    id bigint, queue text, data text, priority integer, attempt integer,
    retry_limit integer, retry_delay_s float8, retry_backoff boolean, retry_delay_max_s float8,
    expire_in_s float8, singleton_key text, dead_letter text, created_at timestamptz,
    started_at timestamptz, lease_expires_at timestamptz, item_id bigint)
LANGUAGE sql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
    UPDATE {schema}.job j
    SET state = 'completed',
        attempt = j.attempt + 1,
        started_at = coalesce(p_now, now()),
        finished_at = coalesce(p_now, now())
    FROM unnest(p_ids) AS u(id)
    WHERE j.id = u.id AND j.state IN ('created', 'retry')
    RETURNING j.id, j.queue, j.data::text, j.priority, j.attempt, j.retry_limit,
              extract(epoch FROM j.retry_delay)::float8, j.retry_backoff,
              extract(epoch FROM j.retry_delay_max)::float8,
              extract(epoch FROM j.expire_in)::float8, j.singleton_key, j.dead_letter,
              j.created_at, j.started_at, NULL::timestamptz, (j.data->>'item')::bigint;
$$;

-- Whether an unfinished job (created, retry, active) of the queue holds the
-- singleton key: one probe of job_singleton. A function with planner
-- switches is never inlined, so a caller that asks for many keys gets one
-- index probe for each, never a join of every job of the queue with them.
CREATE FUNCTION {schema}.singleton_held_v1(p_queue text, p_singleton_key text)
RETURNS boolean
LANGUAGE sql
STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
    SELECT EXISTS (
        SELECT 1 FROM {schema}.job j
        WHERE j.queue = p_queue AND j.singleton_key = p_singleton_key
          AND j.state IN ('created', 'retry', 'active'));
$$;
