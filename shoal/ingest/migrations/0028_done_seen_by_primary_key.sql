-- done_seen_v1: the live done-markers among a fetch's message ids, found by
-- primary key whatever the statistics, with the plan kept for the session.
--
-- The check ran as one statement with the TTL test beside the ids. With
-- statistics taken while ingest_done was small (a new database; a bench
-- with autovacuum off), PostgreSQL 15 scanned ingest_done_expires for every
-- marker still within its TTL, which is nearly all of them, and filtered
-- those by id; with the TTL test kept apart, it read the whole table for a
-- fetch of 500 ids. Either is work of (markers alive) per fetch: 3 to 7 ms
-- beside 20,000 markers, about 20 us of server time a message in
-- bench/ingest_bench.py, and growing with every message applied for the
-- TTL's 48 hours. Here the TTL test cannot reach the scan (OFFSET 0 keeps it
-- outside the subquery) and sequential scans are off, so the primary key is
-- the only way to the rows: one probe per id.
CREATE FUNCTION {schema}.done_seen_v1(p_ids text[], p_now timestamptz)
RETURNS TABLE (seen_id text)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
BEGIN
    RETURN QUERY
    SELECT d.message_id FROM (
        SELECT i.message_id, i.expires_at FROM {schema}.ingest_done AS i
        WHERE i.message_id = ANY(p_ids)
        OFFSET 0
    ) AS d
    WHERE d.expires_at > coalesce(p_now, now());
END;
$$;
