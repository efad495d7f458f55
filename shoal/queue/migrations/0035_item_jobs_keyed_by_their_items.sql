-- insert_item_jobs_v3: insert_item_jobs_v2 (0030_item_jobs_under_limits.sql)
-- that takes each job's partition key from its caller.
--
-- A batch kind can now be partitioned (docs/limits.md, "Batch kinds"). An
-- item job's data is its item's id and turn: the field a kind is
-- partitioned by is in the item's data, which this layer never reads, and a
-- key from a partition_by function can only be computed by the process that
-- has the function. So the batch layer keys each item when its task is
-- created and passes the keys here (p_partition_keys, in the order of
-- p_items; an empty array is all NULL, as unnest pads it).
--
-- The key a job gets is the one insert_jobs gives a job sent with a key:
-- the key passed when the queue has no limits (yet: a task created before its
-- kind's workers first declared them keeps its keys, which the declaration's
-- stamp of keyless jobs would not know; an unkeyed kind passes none, and its
-- jobs cost nothing more than v1's); '' when it has limits but no partitions
-- (one partition, whatever key was passed); else the key passed, '' for
-- none. v2 read the partition field from the job's own data, which an item
-- job never has: every job of a partitioned kind would have been keyed ''.
CREATE FUNCTION {schema}.insert_item_jobs_v3(
    p_items bigint[], p_keys text[], p_partition_keys text[], p_queue text, p_priority integer,
    p_retry_limit integer, p_retry_delay_s float8, p_retry_backoff boolean,
    p_retry_delay_max_s float8, p_expire_in_s float8, p_dead_letter text,
    p_start_at timestamptz, p_start_in_s float8, p_now timestamptz)
RETURNS bigint
LANGUAGE sql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
    WITH turn AS (
        SELECT coalesce((
            SELECT (j.data->>'turn')::bigint
            FROM {schema}.job j
            WHERE j.queue = p_queue
              AND j.state IN ('created', 'retry')
              AND j.data ? 'item'
              AND j.data ? 'turn'
              AND j.start_after <= coalesce(p_now, now())
            ORDER BY j.priority DESC, (j.data->'turn') NULLS FIRST, j.id
            LIMIT 1), 0) AS first
    ), limited AS (
        -- One row: whether the queue has limits, and whether it is partitioned.
        SELECT EXISTS (SELECT 1 FROM {schema}.queue_limit l WHERE l.queue = p_queue) AS on_,
               EXISTS (SELECT 1 FROM {schema}.queue_limit l
                       WHERE l.queue = p_queue AND l.partition_by IS NOT NULL) AS partitioned
    ), jobs AS (
        INSERT INTO {schema}.job (
            queue, data, priority, retry_limit, retry_delay, retry_backoff, retry_delay_max,
            expire_in, singleton_key, dead_letter, start_after, created_at, partition_key)
        SELECT p_queue, d.data,
               p_priority, p_retry_limit, p_retry_delay_s * interval '1 second', p_retry_backoff,
               p_retry_delay_max_s * interval '1 second', p_expire_in_s * interval '1 second',
               u.key, p_dead_letter,
               coalesce(p_start_at,
                        coalesce(p_now, now()) + coalesce(p_start_in_s, 0) * interval '1 second'),
               coalesce(p_now, now()),
               CASE WHEN NOT limited.on_ THEN u.partition_key
                    WHEN NOT limited.partitioned THEN ''
                    ELSE coalesce(u.partition_key, '') END
        FROM unnest(p_items, p_keys, p_partition_keys)
                 WITH ORDINALITY AS u(item, key, partition_key, ord),
             turn, limited,
             LATERAL (SELECT jsonb_build_object('item', u.item, 'turn', turn.first + u.ord - 1)
                      AS data) d
        RETURNING 1
    )
    SELECT count(*) FROM jobs;
$$;
