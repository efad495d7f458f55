-- The ingest layer's database function under a versioned name, the only name
-- shoal's code calls (see 0006_queue_functions_v1.sql for the rule: never
-- edited; a change is a new _v2 beside it). claim_messages of
-- 0004_ingest_lease.sql stays for the workers of the previous release.

-- claim_messages of 0004_ingest_lease.sql (a claim leased for the consumer's
-- ack wait, written into expire_in as well), returning the queue's claim row
-- (0006_queue_functions_v1.sql).
CREATE FUNCTION {schema}.claim_messages_v1(
    p_queue text, p_limit integer, p_now timestamptz, p_ack_wait interval)
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
        expire_in = p_ack_wait,
        lease_expires_at = coalesce(p_now, now()) + p_ack_wait
    FROM next
    WHERE j.id = next.id
    RETURNING j.id, j.queue, j.data::text, j.priority, j.attempt, j.retry_limit,
              extract(epoch FROM j.retry_delay)::float8, j.retry_backoff,
              extract(epoch FROM j.retry_delay_max)::float8,
              extract(epoch FROM j.expire_in)::float8, j.singleton_key, j.dead_letter,
              j.created_at, j.started_at, j.lease_expires_at;
$$;
