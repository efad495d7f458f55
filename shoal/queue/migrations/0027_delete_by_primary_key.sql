-- delete_jobs_v2: delete_jobs_v1 of 0014_queue_ingest_contract.sql (the
-- ingest layer's ack) with complete_jobs_v2's fence and plan
-- (0015_drain_cost.sql), and its plan kept for the session.
--
-- v1 fences on state = 'active', the predicate of the partial index
-- job_lease. With statistics that say no job is active (the table analyzed
-- while every job waited, or while it was empty, as after a drain), the
-- planner expects one active row, scans job_lease as the outer side of a
-- nested loop and reads the unnested ids again for each active job: work of
-- (active jobs of every queue) x (ids acked) per ack, instead of one
-- primary-key probe per id. v2 finds the rows by primary key
-- (id = ANY(p_ids)) and matches the attempts with a hash join; its fence,
-- lease_expires_at IS NOT NULL, is the same as state = 'active' by the
-- table's CHECK active_has_lease but the predicate of no partial index, so
-- the primary key is the only index the statement can use.
--
-- With that, the plan has one shape whatever the parameters and the
-- statistics, and it is kept (a generic plan) instead of made again on each
-- call: a SQL function with planner switches is planned on every call, and
-- with the job table's indexes that took about 150 us of an ack of 25
-- messages (2,000 calls in a DO loop on the 2-core development machine:
-- about 160 us a call for v1, 40 to 50 for this).
CREATE FUNCTION {schema}.delete_jobs_v2(p_ids bigint[], p_attempts integer[])
RETURNS TABLE (id bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_nestloop = off
SET enable_hashjoin = on
SET enable_mergejoin = off
AS $$
BEGIN
    RETURN QUERY
    DELETE FROM {schema}.job AS j
    USING unnest(p_ids, p_attempts) AS u(id, attempt)
    WHERE j.id = ANY(p_ids) AND j.id = u.id
      AND j.lease_expires_at IS NOT NULL AND j.attempt = u.attempt
    RETURNING j.id;
END;
$$;
