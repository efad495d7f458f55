-- claim_jobs_leased_v2: the ingest layer's claim (claim_jobs_leased_v1 of
-- 0014_queue_ingest_contract.sql) from a position, in PL/pgSQL, returning
-- only what a delivery needs.
--
-- Three costs of v1, all paid on every claim:
--
-- - It walks job_claim from the head, so it steps over the entry of every
--   message claimed since the last vacuum, and reads the row of each one
--   whose old version an open snapshot may still see (the consumer's own
--   applies and the producers' publishes hold such snapshots all the time;
--   a long transaction keeps every message claimed since it began so). The position is
--   claim_jobs_v2's (0017_claim_from_a_position.sql, where the rules are):
--   the subscription passes the (priority, id) of the last message it
--   claimed and claims from the head only after a claim came back short and
--   at least once a second (shoal/queue/cursor.py).
-- - It is a SQL function with planner switches, which PostgreSQL plans on
--   every call. A PL/pgSQL body could keep its plans, but the claim's must
--   be made again for each call: the generic plan of the branch after the
--   position walks the primary key from the position through every later
--   job of every queue. What can be kept is: the pause check and the update
--   of the claimed rows by primary key (the only index they can use) run in
--   the two helpers below, whose plans are kept for the session. With the
--   job table's eleven indexes each statement planned costs 100 to 140 us;
--   2,000 claims of an empty topic in a DO loop on the 2-core development
--   machine took 610 us a call with the four statements planned each time,
--   370 with two.
-- - It returns the queue's fifteen-column claim row, three durations of it
--   computed in numeric arithmetic, of which a delivery reads three columns.
--   This returns the id, the priority (the position), the attempt (the
--   delivery's fence) and the payload.
--
-- Measured with bench/ingest_bench.py at 100,000 observations on the 2-core
-- development machine (pg_stat_statements): the claims' execution time fell
-- from 92 to 62 us an observation (two messages), their WAL unchanged.
--
-- The lease is the caller's, written into expire_in as well, as in v1. v1
-- stays for the workers of the previous release.

-- Whether the queue is paused: a STABLE SQL function, so a PL/pgSQL caller
-- evaluates it as an expression whose plan it keeps.
CREATE FUNCTION {schema}.queue_paused_v1(p_queue text)
RETURNS boolean
LANGUAGE sql
STABLE
AS $$
    SELECT EXISTS (SELECT 1 FROM {schema}.paused_queue p WHERE p.queue = p_queue);
$$;

-- Leases the claimed jobs p_ids (locked by the caller's claim) for p_lease
-- from p_now, returning what a delivery needs. By primary key, the only
-- index the statement can use: its generic plan is the custom one, and it is
-- kept for the session.
CREATE FUNCTION {schema}.lease_claimed_jobs_v1(
    p_ids bigint[], p_now timestamptz, p_lease interval)
RETURNS TABLE (id bigint, priority integer, attempt integer, data text)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
BEGIN
    RETURN QUERY
    UPDATE {schema}.job j
    SET state = 'active',
        attempt = j.attempt + 1,
        started_at = p_now,
        expire_in = p_lease,
        lease_expires_at = p_now + p_lease
    WHERE j.id = ANY(p_ids)
    RETURNING j.id, j.priority, j.attempt, j.data::text;
END;
$$;

CREATE FUNCTION {schema}.claim_jobs_leased_v2(
    p_queue text, p_limit integer, p_now timestamptz, p_lease interval,
    p_after_priority integer, p_after_id bigint)
RETURNS TABLE (id bigint, priority integer, attempt integer, data text)
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
    IF {schema}.queue_paused_v1(p_queue) THEN
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
    RETURN QUERY SELECT * FROM {schema}.lease_claimed_jobs_v1(v_ids, v_now, p_lease);
END;
$$;
