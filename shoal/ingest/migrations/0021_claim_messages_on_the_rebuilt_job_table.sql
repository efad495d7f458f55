-- claim_messages of 0004_ingest_lease.sql, as it was (see there), on the
-- job table 0019 built again; 0018 dropped it so that the old table could go.
-- Kept for the workers of the release whose schema ended at migration 3.
CREATE FUNCTION {schema}.claim_messages(
    p_queue text, p_limit integer, p_now timestamptz, p_ack_wait interval)
RETURNS SETOF {schema}.job
LANGUAGE sql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
    -- Not flushed before returning, as in claim_jobs(): a claim lost to a
    -- server crash only makes its messages deliverable again.
    SELECT set_config('synchronous_commit', 'off', true);
    WITH next AS (
        SELECT id
        FROM {schema}.job
        WHERE queue = p_queue
          AND state IN ('created', 'retry')
          AND start_after <= coalesce(p_now, now())
          AND NOT EXISTS (SELECT 1 FROM {schema}.paused_queue p WHERE p.queue = p_queue)
        ORDER BY priority DESC, id
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
    RETURNING j.*;
$$;
