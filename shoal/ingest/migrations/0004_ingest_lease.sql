-- The postgres transport's claim: the lease of a delivery comes from the
-- consumer that takes it. A topic's messages are jobs (see 0003_ingest.sql);
-- claim_jobs() leases a job for the expire_in it was inserted with, which for
-- a message is the publisher's setting, so a consumer's ack wait was ignored
-- and a message its dead consumer held stayed in flight for the publisher's
-- 5 minutes. This claim writes the consumer's ack wait into expire_in as well
-- as into the lease, so a touch (extend_leases) extends by the same ack wait
-- and maintenance expires the lease exactly as for any job.
-- Same shape and planner switches as claim_jobs() (see 0001_queue.sql for why).
CREATE OR REPLACE FUNCTION {schema}.claim_messages(
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
