-- The ingest layer's part of shoal 0.2.0's schema change from 0.1.0: the
-- migrations written while 0.2.0 was developed (steps 4-36, in their order),
-- folded into one file per layer at the release. Only the database functions
-- 0.2.0's code calls are created; versions replaced before the release never
-- shipped and are left out. Each live function's definition and the reasons
-- for it are in shoal/ingest/functions.sql; the comments below say why each
-- table, column and index change is made, step by step.

-- ---- step 28 of the development of 0.2.0 ----

-- done_seen_v1: its definition and the reasons for it are in shoal/ingest/functions.sql.
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
