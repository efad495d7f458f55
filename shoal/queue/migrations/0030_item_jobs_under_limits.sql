-- insert_item_jobs_v2: insert_item_jobs_v1 (0006_queue_functions_v1.sql)
-- that gives the jobs of a limited queue their partition key, as the queue's
-- own insert does (docs/limits.md).
--
-- A batch kind can now declare limits (global_concurrency, rate_limit), held
-- on its item queue's queue_limit row and enforced by the limited claim,
-- which sees only jobs with a key and counts only keyed active jobs as
-- slots. v1 writes item jobs without a key: they would wait for
-- maintenance to stamp them (about a minute), and a concurrency-only claim,
-- which takes jobs as the plain claim does, could start one without counting
-- it. v2 reads the queue's queue_limit row once per statement (a primary-key
-- probe) and stamps every job with its key: '' for a queue that is not
-- partitioned, else the partition field of the job's data ('' when absent,
-- as for any job). A queue without limits gets NULL, as from v1, so its jobs
-- cost nothing more than before.
CREATE FUNCTION {schema}.insert_item_jobs_v2(
    p_items bigint[], p_keys text[], p_queue text, p_priority integer, p_retry_limit integer,
    p_retry_delay_s float8, p_retry_backoff boolean, p_retry_delay_max_s float8,
    p_expire_in_s float8, p_dead_letter text, p_start_at timestamptz, p_start_in_s float8,
    p_now timestamptz)
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
        -- One row: whether the queue has limits, and its partition field.
        SELECT EXISTS (SELECT 1 FROM {schema}.queue_limit l WHERE l.queue = p_queue) AS on_,
               (SELECT l.partition_field FROM {schema}.queue_limit l
                WHERE l.queue = p_queue) AS field
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
               CASE WHEN NOT limited.on_ THEN NULL
                    WHEN limited.field IS NULL THEN ''
                    ELSE coalesce(d.data ->> limited.field, '') END
        FROM unnest(p_items, p_keys) WITH ORDINALITY AS u(item, key, ord), turn, limited,
             LATERAL (SELECT jsonb_build_object('item', u.item, 'turn', turn.first + u.ord - 1)
                      AS data) d
        RETURNING 1
    )
    SELECT count(*) FROM jobs;
$$;
