-- The ingest layer's database functions: the live definition of every one
-- that shoal's code calls, in one place, each with the reasons it is written
-- the way it is.
--
-- This file is read, not run. The functions are created by the migrations in
-- shoal/ingest/migrations; tests/test_functions_sql.py runs this file against
-- a migrated database and fails when any definition here differs from the one
-- the migrations built. Names are versioned as the queue's are (the rules are
-- at the top of shoal/queue/functions.sql).
--
-- The postgres transport claims, acknowledges and measures its messages
-- through the queue layer's functions (claim_jobs_leased_v2, delete_jobs_v2,
-- queue_depth_v1 in shoal/queue/functions.sql); this layer owns only its
-- done-markers.

-- The live done-markers among a fetch's message ids: the ids of messages
-- already applied whose marker has not expired, so a redelivered message is
-- acknowledged without being applied again.
--
-- Found by primary key whatever the statistics, with the plan kept for the
-- session. Written as one statement with the TTL test beside the ids, and with
-- statistics taken while ingest_done was small (a new database; a bench with
-- autovacuum off), PostgreSQL 15 scanned ingest_done_expires for every marker
-- still within its TTL (nearly all of them) and filtered those by id, or read
-- the whole table: work of (markers alive) per fetch, 3 to 7 ms beside 20,000
-- markers, about 20 us of server time a message in bench/ingest_bench.py, and
-- growing with every message applied for the TTL's 48 hours. Here the TTL test
-- cannot reach the scan (OFFSET 0 keeps it outside the subquery) and
-- sequential scans are off, so the primary key is the only way to the rows:
-- one probe per id.
CREATE OR REPLACE FUNCTION {schema}.done_seen_v1(p_ids text[], p_now timestamptz)
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
