-- The worker's claim and completion, leaner per job: claim_jobs_v5 returns
-- the lean claim row (the times as seconds, no queue and no lease end, which
-- the worker knows), and it and complete_jobs_v3 keep their plans for the
-- session. claim_jobs_v4 stays for claim_limited_jobs_v2 and the workers of
-- 0.2.0, complete_jobs_v2 for the latter.

-- claim_jobs_v5: its definition and the reasons for it are in shoal/queue/functions.sql.
CREATE FUNCTION {schema}.claim_jobs_v5(
    p_queue text, p_limit integer, p_now timestamptz,
    p_after_priority integer, p_after_id bigint, p_holder integer)
RETURNS TABLE (
    id bigint, data text, priority integer, attempt integer,
    retry_limit integer, retry_delay_s float8, retry_backoff boolean, retry_delay_max_s float8,
    expire_in_s float8, singleton_key text, dead_letter text, created_at_s float8,
    started_at_s float8)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan
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
                  AND j.start_after <= v_now
                  AND j.priority >= p_after_priority AND j.priority <= p_after_priority
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
        lease_expires_at = v_now + j.expire_in,
        holder = p_holder
    WHERE j.id = ANY(v_ids)
    RETURNING j.id, j.data::text, j.priority, j.attempt, j.retry_limit,
              date_part('epoch', j.retry_delay), j.retry_backoff,
              date_part('epoch', j.retry_delay_max),
              date_part('epoch', j.expire_in), j.singleton_key, j.dead_letter,
              date_part('epoch', j.created_at), date_part('epoch', v_now);
END;
$$;


-- complete_jobs_v3: its definition and the reasons for it are in shoal/queue/functions.sql.
CREATE FUNCTION {schema}.complete_jobs_v3(
    p_ids bigint[], p_attempts integer[], p_outputs jsonb[], p_now timestamptz)
RETURNS TABLE (id bigint)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_nestloop = off
SET enable_hashjoin = on
SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    UPDATE {schema}.job j
    SET state = 'completed',
        finished_at = coalesce(p_now, now()),
        lease_expires_at = NULL,
        output = u.output
    FROM unnest(p_ids, p_attempts, p_outputs) AS u(id, attempt, output)
    WHERE j.id = ANY(p_ids) AND j.id = u.id
      AND j.lease_expires_at IS NOT NULL AND j.attempt = u.attempt
    RETURNING j.id;
END;
$$;
