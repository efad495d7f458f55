-- claim_jobs_v2: claim_jobs_v1 that can start after a position in job_claim.
--
-- v1 walks job_claim from the head of the queue on every claim. A claimed
-- job leaves its waiting version's entry behind in job_claim, and the entry
-- is skipped for free only once the version is dead to every transaction:
-- then the first scan that meets it marks it dead in the index, and vacuum
-- removes it. While any transaction in the database is older than the claim
-- (a long report, a session left idle in a transaction), neither may happen,
-- so each claim steps over the entries of every job claimed since that
-- transaction began, reading the table for each to see it is not waiting.
-- That work grows with the transaction's age: the ten-minute run of
-- bench/long_tx_bench.py (docs/benchmarks.md) showed 21,000 buffers and
-- 340 ms per claim after 270 s, and the drain fell to 46% of its rate.
--
-- A worker passes the position (priority, id) of the last job it claimed,
-- and the claim starts just after it in the index's order (priority
-- descending, then id): jobs of a higher priority from the head, the rest of
-- that priority after the id, then the lower priorities from their heads.
-- The entries behind the position are never read again.
--
-- What a claim from a position cannot see: waiting jobs behind it (an
-- insert that committed after jobs with higher ids were claimed, a job put
-- back to retry, one whose start_after passed, one another claim held
-- locked). So the worker claims from the head (p_after_id NULL: exactly v1's
-- claim) after a claim came back short and at least once a second, and
-- spends at most a twentieth of its time doing so (shoal/queue/cursor.py).
--
-- PL/pgSQL, not SQL: its statements are planned once per session and kept,
-- where a SQL function with SET clauses is planned on every call. The planner
-- switches and the asynchronous commit are v1's, for the same reasons.
CREATE FUNCTION {schema}.claim_jobs_v2(
    p_queue text, p_limit integer, p_now timestamptz,
    p_after_priority integer, p_after_id bigint)
RETURNS TABLE (
    id bigint, queue text, data text, priority integer, attempt integer,
    retry_limit integer, retry_delay_s float8, retry_backoff boolean, retry_delay_max_s float8,
    expire_in_s float8, singleton_key text, dead_letter text, created_at timestamptz,
    started_at timestamptz, lease_expires_at timestamptz)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, now());
    v_ids bigint[];
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    IF EXISTS (SELECT 1 FROM {schema}.paused_queue p WHERE p.queue = p_queue) THEN
        RETURN;
    END IF;
    IF p_after_id IS NULL THEN
        v_ids := ARRAY(
            SELECT j.id FROM {schema}.job j
            WHERE j.queue = p_queue AND j.state IN ('created', 'retry')
              AND j.start_after <= v_now
            ORDER BY j.priority DESC, j.id
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED);
    ELSE
        v_ids := ARRAY(
            SELECT j.id FROM {schema}.job j
            WHERE j.queue = p_queue AND j.state IN ('created', 'retry')
              AND j.start_after <= v_now AND j.priority > p_after_priority
            ORDER BY j.priority DESC, j.id
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED);
        IF cardinality(v_ids) < p_limit THEN
            v_ids := v_ids || ARRAY(
                SELECT j.id FROM {schema}.job j
                WHERE j.queue = p_queue AND j.state IN ('created', 'retry')
                  AND j.start_after <= v_now AND j.priority = p_after_priority
                  AND j.id > p_after_id
                ORDER BY j.priority DESC, j.id
                LIMIT p_limit - cardinality(v_ids)
                FOR UPDATE SKIP LOCKED);
        END IF;
        IF cardinality(v_ids) < p_limit THEN
            v_ids := v_ids || ARRAY(
                SELECT j.id FROM {schema}.job j
                WHERE j.queue = p_queue AND j.state IN ('created', 'retry')
                  AND j.start_after <= v_now AND j.priority < p_after_priority
                ORDER BY j.priority DESC, j.id
                LIMIT p_limit - cardinality(v_ids)
                FOR UPDATE SKIP LOCKED);
        END IF;
    END IF;
    RETURN QUERY
    UPDATE {schema}.job j
    SET state = 'active',
        attempt = j.attempt + 1,
        started_at = v_now,
        lease_expires_at = v_now + j.expire_in
    WHERE j.id = ANY(v_ids)
    RETURNING j.id, j.queue, j.data::text, j.priority, j.attempt, j.retry_limit,
              extract(epoch FROM j.retry_delay)::float8, j.retry_backoff,
              extract(epoch FROM j.retry_delay_max)::float8,
              extract(epoch FROM j.expire_in)::float8, j.singleton_key, j.dead_letter,
              j.created_at, j.started_at, j.lease_expires_at;
END;
$$;
