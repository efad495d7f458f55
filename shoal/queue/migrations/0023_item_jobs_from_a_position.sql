-- Item jobs claimed from a position, and deleted when taken.
--
-- lock_item_jobs_v2: lock_item_jobs_v1 that can start after a position in
-- job_item_turn, as claim_jobs_v2 (0017_claim_from_a_position.sql) does in
-- job_claim, and for the same reason. An item job taken leaves its waiting
-- version's entry at the head of job_item_turn until vacuum removes it, and
-- v1, which walks the index from the head, steps over every such entry on
-- every claim: 1,109 index pages (12 ms) before the first live entry once
-- 150,000 jobs of a task had been taken (bench/million_bench.py), and far
-- more behind a long transaction or between two autovacuum passes of an
-- hour's soak, where the claims fell behind the load (docs/benchmarks.md).
--
-- The index's order is priority descending, then the turn with jobs without
-- one first, then id. The position (priority, turn, id) is that of the last
-- job with a turn the worker claimed; a claim from it locks, in this order:
--   1. jobs of a higher priority, from their head;
--   2. jobs of the position's priority without a turn (retries, a reap's or
--      a hand-back's new jobs), from their head: the index puts them before
--      every turn, and a retry starts within its backoff plus one claim
--      whatever the queue holds, as with v1;
--   3. jobs of that priority after (turn, id);
--   4. jobs of lower priorities, from their head.
-- What it cannot see is what v1's claim from the head finds (p_after_id
-- NULL): jobs with a turn behind the position (a task's jobs that committed
-- after later turns were claimed, jobs another claim held locked). The
-- worker claims from the head after a claim that came back short and at
-- least once a second (shoal/queue/cursor.py).
--
-- PL/pgSQL, so its statements are planned once per session and kept.
CREATE FUNCTION {schema}.lock_item_jobs_v2(
    p_queue text, p_limit integer, p_now timestamptz,
    p_after_priority integer, p_after_turn bigint, p_after_id bigint)
RETURNS TABLE (id bigint, item_id bigint)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, now());
    v_after jsonb := to_jsonb(p_after_turn);
    v_left integer := p_limit;
    v_got integer;
BEGIN
    IF EXISTS (SELECT 1 FROM {schema}.paused_queue p WHERE p.queue = p_queue) THEN
        RETURN;
    END IF;
    IF p_after_id IS NULL OR p_after_turn IS NULL THEN
        RETURN QUERY
        SELECT j.id, (j.data->>'item')::bigint
        FROM {schema}.job j
        WHERE j.queue = p_queue AND j.state IN ('created', 'retry') AND j.data ? 'item'
          AND j.start_after <= v_now
        ORDER BY j.priority DESC, (j.data->'turn') NULLS FIRST, j.id
        LIMIT p_limit
        FOR UPDATE OF j SKIP LOCKED;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT j.id, (j.data->>'item')::bigint
    FROM {schema}.job j
    WHERE j.queue = p_queue AND j.state IN ('created', 'retry') AND j.data ? 'item'
      AND j.start_after <= v_now AND j.priority > p_after_priority
    ORDER BY j.priority DESC, (j.data->'turn') NULLS FIRST, j.id
    LIMIT v_left
    FOR UPDATE OF j SKIP LOCKED;
    GET DIAGNOSTICS v_got = ROW_COUNT;
    v_left := v_left - v_got;
    IF v_left > 0 THEN
        RETURN QUERY
        SELECT j.id, (j.data->>'item')::bigint
        FROM {schema}.job j
        WHERE j.queue = p_queue AND j.state IN ('created', 'retry') AND j.data ? 'item'
          AND j.start_after <= v_now AND j.priority = p_after_priority
          AND (j.data->'turn') IS NULL
        ORDER BY j.priority DESC, (j.data->'turn') NULLS FIRST, j.id
        LIMIT v_left
        FOR UPDATE OF j SKIP LOCKED;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_left := v_left - v_got;
    END IF;
    IF v_left > 0 THEN
        RETURN QUERY
        SELECT j.id, (j.data->>'item')::bigint
        FROM {schema}.job j
        WHERE j.queue = p_queue AND j.state IN ('created', 'retry') AND j.data ? 'item'
          AND j.start_after <= v_now AND j.priority = p_after_priority
          AND ((j.data->'turn'), j.id) > (v_after, p_after_id)
        ORDER BY j.priority DESC, (j.data->'turn') NULLS FIRST, j.id
        LIMIT v_left
        FOR UPDATE OF j SKIP LOCKED;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_left := v_left - v_got;
    END IF;
    IF v_left > 0 THEN
        RETURN QUERY
        SELECT j.id, (j.data->>'item')::bigint
        FROM {schema}.job j
        WHERE j.queue = p_queue AND j.state IN ('created', 'retry') AND j.data ? 'item'
          AND j.start_after <= v_now AND j.priority < p_after_priority
        ORDER BY j.priority DESC, (j.data->'turn') NULLS FIRST, j.id
        LIMIT v_left
        FOR UPDATE OF j SKIP LOCKED;
    END IF;
END;
$$;

-- take_item_jobs_v2: take_item_jobs_v1 that deletes the jobs it takes. A
-- taken item job is a one-shot delivery: nothing reads its row again (the
-- item row is the record of the run, its fence and its outcome; a run that
-- ends without a result sends its item a new job). v1 kept each taken job as
-- a completed row for the queue's retention (12 hours by default), so the job
-- table of a busy kind held every item of the last 12 hours: 26 million rows
-- and 18 GiB in the hour's soak, whose indexes outgrew the server's cache.
-- A delete leaves one dead version for vacuum, as the update did, writes less
-- WAL, and leaves nothing for the archive to move later.
--
-- The jobs are found by primary key whatever the statistics say. v1 joined
-- p_ids with the job table under the fence state IN ('created', 'retry'),
-- the predicate of job_claim and job_item_turn: with statistics taken while
-- no job waited (autovacuum's ANALYZE of a table whose jobs are all taken),
-- the planner scanned every waiting job's entry in job_claim for each claim,
-- and a claim of 500 item jobs took 37 s with 290,000 jobs waiting (the
-- soak, docs/benchmarks.md). Here the fence compares the state as text,
-- which implies no partial index's predicate, so the primary key is the only
-- index the delete can use. Returns the claim row (started_at the take's
-- time, lease_expires_at NULL), the item of each job taken and its turn
-- (NULL for a job without one), in id order.
CREATE FUNCTION {schema}.take_item_jobs_v2(p_ids bigint[], p_now timestamptz)
RETURNS TABLE (
    id bigint, queue text, data text, priority integer, attempt integer,
    retry_limit integer, retry_delay_s float8, retry_backoff boolean, retry_delay_max_s float8,
    expire_in_s float8, singleton_key text, dead_letter text, created_at timestamptz,
    started_at timestamptz, lease_expires_at timestamptz, item_id bigint, turn bigint)
LANGUAGE sql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
    DELETE FROM {schema}.job j
    WHERE j.id = ANY(p_ids) AND j.state::text IN ('created', 'retry')
    RETURNING j.id, j.queue, j.data::text, j.priority, j.attempt + 1, j.retry_limit,
              extract(epoch FROM j.retry_delay)::float8, j.retry_backoff,
              extract(epoch FROM j.retry_delay_max)::float8,
              extract(epoch FROM j.expire_in)::float8, j.singleton_key, j.dead_letter,
              j.created_at, coalesce(p_now, now()), NULL::timestamptz,
              (j.data->>'item')::bigint, (j.data->>'turn')::bigint;
$$;
