-- Rescue of the jobs of a worker process whose heartbeat stopped.
--
-- Why. A SIGKILLed or frozen process's jobs stayed active until their lease
-- (expire_in, 15 minutes by default) ran out, while the worker registry
-- showed the process gone 30 s after its last heartbeat. Now each claim
-- records which process took the job (job.holder: the number of the
-- claiming client's registry row), and maintenance hands back the active jobs of a
-- process whose registry heartbeat is older than that process's own
-- rescue_after (worker.rescue_after_s, which it reports when it registers).
--
-- The holder is one more column assigned by the claim's UPDATE, which writes
-- the row anyway: no statement, index or lock is added to the claim. It is a
-- 4-byte number the registry row gets when it is written (worker.no), not the
-- row's 32-character id: as text it made every claimed and completed row
-- version 33 bytes wider, 62 more bytes of WAL a drained job (576 -> 638 in
-- bench/queue_bench.py on the 2-core machine); as a number it costs a few. It is
-- not indexed: the rescue first reads the few registry rows that went
-- silent, and only when there are some looks at the active jobs (through
-- job_lease) for theirs.
--
-- A row a process of the previous release claims has no holder, and a
-- registry row of the previous release no rescue_after_s: such jobs wait for
-- their lease as before. claim_jobs_v3 and claim_limited_jobs_v1 stay, for
-- those processes.
ALTER TABLE {schema}.job ADD COLUMN holder integer;
-- The archive in the job's new order, then archived_at: the previous
-- release's maintenance archives by position (`INSERT INTO job_archive SELECT
-- moved.*, now()`, as 0010 says), and ALTER TABLE could only add holder after
-- archived_at. This copies the archive, as 0010 and 0019 did: a large one
-- makes the migration slower, not unsafe (one transaction).
CREATE TABLE {schema}.job_archive_rebuilt (
    LIKE {schema}.job,
    archived_at timestamptz NOT NULL
);
INSERT INTO {schema}.job_archive_rebuilt (
    id, queue, priority, data, retry_limit, retry_delay, retry_backoff, retry_delay_max,
    expire_in, singleton_key, dead_letter, origin_queue, origin_id, partition_key, cost,
    created_at, start_after, state, attempt, started_at, lease_expires_at, finished_at,
    output, errors, archived_at)
SELECT id, queue, priority, data, retry_limit, retry_delay, retry_backoff, retry_delay_max,
       expire_in, singleton_key, dead_letter, origin_queue, origin_id, partition_key, cost,
       created_at, start_after, state, attempt, started_at, lease_expires_at, finished_at,
       output, errors, archived_at
FROM {schema}.job_archive;
DROP TABLE {schema}.job_archive;
ALTER TABLE {schema}.job_archive_rebuilt RENAME TO job_archive;
CREATE INDEX job_archive_archived_at ON {schema}.job_archive (archived_at);
CREATE INDEX job_archive_id ON {schema}.job_archive (id);

ALTER TABLE {schema}.worker
    -- The number its jobs' holder names: given when the row is written, never
    -- given again (a process that registers anew gets a new one).
    ADD COLUMN no integer GENERATED ALWAYS AS IDENTITY UNIQUE,
    -- The process's rescue_after: its jobs are handed back once its heartbeat
    -- is older than this. NULL (a process of the previous release): never.
    ADD COLUMN rescue_after_s float8 CHECK (rescue_after_s > 0),
    -- Jobs maintenance handed back because this process went silent, and when
    -- it last did (the Workers page shows them on the gone process's row).
    ADD COLUMN rescued integer NOT NULL DEFAULT 0,
    ADD COLUMN rescued_at timestamptz;

-- claim_jobs_v4: claim_jobs_v3 (0025_claim_durations_as_float.sql) that also
-- records the claiming process in holder (p_holder; NULL for a client with no
-- registry row, whose jobs only their lease rescues).
CREATE FUNCTION {schema}.claim_jobs_v4(
    p_queue text, p_limit integer, p_now timestamptz,
    p_after_priority integer, p_after_id bigint, p_holder integer)
RETURNS TABLE (
    id bigint, queue text, data text, priority integer, attempt integer,
    retry_limit integer, retry_delay_s float8, retry_backoff boolean, retry_delay_max_s float8,
    expire_in_s float8, singleton_key text, dead_letter text, created_at timestamptz,
    started_at timestamptz, lease_expires_at timestamptz)
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
    IF EXISTS (SELECT 1 FROM {schema}.paused_queue p WHERE p.queue = p_queue) THEN
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
    RETURN QUERY
    UPDATE {schema}.job j
    SET state = 'active',
        attempt = j.attempt + 1,
        started_at = v_now,
        lease_expires_at = v_now + j.expire_in,
        holder = p_holder
    WHERE j.id = ANY(v_ids)
    RETURNING j.id, j.queue, j.data::text, j.priority, j.attempt, j.retry_limit,
              date_part('epoch', j.retry_delay), j.retry_backoff,
              date_part('epoch', j.retry_delay_max),
              date_part('epoch', j.expire_in), j.singleton_key, j.dead_letter,
              j.created_at, j.started_at, j.lease_expires_at;
END;
$$;

-- claim_limited_jobs_v2: claim_limited_jobs_v1 (0010_limits.sql) that also
-- records the claiming process in holder, as claim_jobs_v4 does. Where v1
-- handed a queue without limits (or with only a concurrency) to claim_jobs_v1,
-- this hands it to claim_jobs_v4 from the head of the queue, which records
-- the holder too (and reads the durations as claim_jobs_v3 does: the same
-- seconds). Its rows are sorted into claim order, as claim_jobs_v1 happened
-- to return them (fetch hands them out in that order): claim_jobs_v4
-- returns them in the order the UPDATE met them.
CREATE FUNCTION {schema}.claim_limited_jobs_v2(
    p_queue text, p_limit integer, p_now timestamptz, p_holder integer)
RETURNS TABLE (
    id bigint, queue text, data text, priority integer, attempt integer,
    retry_limit integer, retry_delay_s float8, retry_backoff boolean, retry_delay_max_s float8,
    expire_in_s float8, singleton_key text, dead_letter text, created_at timestamptz,
    started_at timestamptz, lease_expires_at timestamptz)
LANGUAGE plpgsql
-- The window over a partition's locked jobs sorts them (a handful, already in
-- order); with enable_sort off that sort's cost passes jit_above_cost, and the
-- JIT compiled the statement for each call (0.4 s, measured).
SET jit = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := coalesce(p_now, now());
    v_limit {schema}.queue_limit;
    v_left  integer := p_limit;
    -- Keys visited per lap at most: with every partition full, a claim would
    -- otherwise visit every key of the queue.
    v_keys  integer := p_limit * 4 + 100;
    v_from  text;               -- the lap starts at this key ...
    v_incl  boolean;            -- ... or just after it
    v_upto  text;               -- and ends at this one (NULL: the last key)
    v_taken integer;
BEGIN
    -- As claim_jobs_v1: a claim lost to a server crash only puts its jobs
    -- back to waiting.
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT * INTO v_limit FROM {schema}.queue_limit l WHERE l.queue = p_queue
        FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT * FROM {schema}.claim_jobs_v4(
            p_queue, p_limit, p_now, NULL, NULL, p_holder) c
            ORDER BY c.priority DESC, c.id;
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM {schema}.paused_queue p WHERE p.queue = p_queue) THEN
        RETURN;
    END IF;
    IF v_limit.partition_by IS NULL AND v_limit.rate_count IS NULL THEN
        -- One partition ('': the insert gives every job of an unpartitioned
        -- queue that key) and only a concurrency: the plain claim of as
        -- many jobs as the free slots allow, unless a RetryAfter paused it.
        IF EXISTS (SELECT 1 FROM {schema}.limit_bucket b
                   WHERE b.queue = p_queue AND b.partition_key = ''
                     AND b.paused_until > v_now) THEN
            RETURN;
        END IF;
        -- Every active job of the queue counts, whatever its key (one sent
        -- while the queue was partitioned, or with a key of its own).
        v_left := least(p_limit, v_limit.concurrency - (
            SELECT count(*) FROM (
                SELECT 1 FROM {schema}.job a
                WHERE a.queue = p_queue AND a.state = 'active' AND a.partition_key IS NOT NULL
                LIMIT v_limit.concurrency) held)::integer);
        IF v_left > 0 THEN
            RETURN QUERY SELECT * FROM {schema}.claim_jobs_v4(
                p_queue, v_left, p_now, NULL, NULL, p_holder) c
                ORDER BY c.priority DESC, c.id;
        END IF;
        RETURN;
    END IF;
    FOR lap IN 1..2 LOOP
        IF lap = 1 THEN
            -- '' is the least key there is: from it, inclusive, is every key.
            -- An unpartitioned queue (one key, '') takes no turns: one lap.
            v_from := coalesce(v_limit.cursor_key, '');
            v_incl := v_limit.cursor_key IS NULL OR v_limit.partition_by IS NULL;
            IF v_limit.partition_by IS NULL THEN
                v_from := '';
            END IF;
            v_upto := NULL;
        ELSE
            EXIT WHEN v_limit.cursor_key IS NULL OR v_limit.partition_by IS NULL
                OR v_left <= 0;
            v_from := '';
            v_incl := true;
            v_upto := v_limit.cursor_key;
        END IF;
        RETURN QUERY
        WITH RECURSIVE walk (key, n) AS (
            SELECT (SELECT j.partition_key FROM {schema}.job j
                    WHERE j.queue = p_queue AND j.state IN ('created', 'retry')
                      AND j.partition_key IS NOT NULL AND j.partition_key >= v_from
                      AND (v_incl OR j.partition_key > v_from)
                    ORDER BY j.partition_key LIMIT 1), 1
            UNION ALL
            SELECT (SELECT j.partition_key FROM {schema}.job j
                    WHERE j.queue = p_queue AND j.state IN ('created', 'retry')
                      AND j.partition_key IS NOT NULL AND j.partition_key > w.key
                    ORDER BY j.partition_key LIMIT 1), w.n + 1
            FROM walk w
            WHERE w.key IS NOT NULL AND w.n < v_keys AND (v_upto IS NULL OR w.key < v_upto)
        ), room AS (
            -- Each partition's free slots (a slot is an active job) and the
            -- tokens its bucket holds now (refilled lazily; no row: full).
            SELECT w.key, w.n,
                   CASE WHEN v_limit.concurrency IS NULL THEN v_left
                        ELSE least(v_left, v_limit.concurrency - (
                            SELECT count(*) FROM (
                                SELECT 1 FROM {schema}.job a
                                WHERE a.queue = p_queue AND a.partition_key = w.key
                                  AND a.state = 'active' AND a.partition_key IS NOT NULL
                                LIMIT v_limit.concurrency) held)::integer) END AS slots,
                   CASE WHEN v_limit.rate_count IS NULL THEN NULL
                        WHEN b.queue IS NULL THEN v_limit.rate_burst::float8
                        -- A clock behind refilled_at (another process's) adds nothing.
                        ELSE least(v_limit.rate_burst::float8, b.tokens + v_limit.rate_count
                             * greatest(0, extract(epoch FROM v_now - b.refilled_at))
                             / extract(epoch FROM v_limit.rate_period)) END AS tokens
            FROM walk w
            LEFT JOIN {schema}.limit_bucket b ON b.queue = p_queue AND b.partition_key = w.key
            WHERE w.key IS NOT NULL AND (v_upto IS NULL OR w.key <= v_upto)
              AND (b.paused_until IS NULL OR b.paused_until <= v_now)
        ), picked AS (
            -- A job starts while the tokens left before it cover its cost (or
            -- the whole bucket, for a job that costs more than the bucket
            -- holds: it starts when the bucket is full and leaves a debt).
            SELECT r.n, r.tokens, c.id
            FROM room r
            CROSS JOIN LATERAL (
                SELECT l.id, l.cost,
                       sum(l.cost) OVER (ORDER BY l.priority DESC, l.id) - l.cost AS before
                FROM (
                    -- The key as a range of one value, and first in the order:
                    -- the plan must walk job_limit_waiting. With
                    -- `partition_key = r.key` the planner drops the key from
                    -- the order and walked job_claim, through every waiting
                    -- job of the queue, for each partition.
                    SELECT j.id, j.cost, j.priority FROM {schema}.job j
                    WHERE j.queue = p_queue AND j.partition_key >= r.key
                      AND j.partition_key <= r.key AND j.partition_key IS NOT NULL
                      AND j.state IN ('created', 'retry') AND j.start_after <= v_now
                    ORDER BY j.partition_key, j.priority DESC, j.id
                    LIMIT greatest(r.slots, 0)
                    FOR UPDATE SKIP LOCKED) l
            ) c
            WHERE r.tokens IS NULL OR r.tokens - c.before >= least(c.cost, v_limit.rate_burst)
            LIMIT v_left
        ), claimed AS (
            UPDATE {schema}.job j
            SET state = 'active',
                attempt = j.attempt + 1,
                started_at = v_now,
                lease_expires_at = v_now + j.expire_in,
                holder = p_holder
            FROM picked p
            WHERE j.id = p.id
            RETURNING j.*, p.n AS walk_n, p.tokens AS walk_tokens
        ), debit AS (
            -- Each bucket gives what its started jobs cost.
            INSERT INTO {schema}.limit_bucket AS b (queue, partition_key, tokens, refilled_at)
            SELECT p_queue, c.partition_key, max(c.walk_tokens) - sum(c.cost), v_now
            FROM claimed c
            WHERE c.walk_tokens IS NOT NULL
            GROUP BY c.partition_key
            -- In key order, as every statement that writes several buckets
            -- does: two of them never wait for each other in a cycle.
            ORDER BY c.partition_key
            ON CONFLICT (queue, partition_key) DO UPDATE
            SET tokens = excluded.tokens, refilled_at = excluded.refilled_at
        ), turn AS (
            -- The next claim starts after the last partition served, or after
            -- the last one visited when the walk stopped at its bound with
            -- none served (else the keys past the bound would never be seen).
            -- Written only when it moves: most claims of an unpartitioned
            -- queue would write the same key again.
            UPDATE {schema}.queue_limit l
            SET cursor_key = t.key
            FROM (SELECT coalesce(
                    (SELECT c.partition_key FROM claimed c ORDER BY c.walk_n DESC LIMIT 1),
                    (SELECT w.key FROM walk w WHERE w.n = v_keys)) AS key) t
            WHERE l.queue = p_queue AND t.key IS NOT NULL
              AND t.key IS DISTINCT FROM l.cursor_key
        )
        SELECT c.id, c.queue::text, c.data::text, c.priority, c.attempt, c.retry_limit,
               extract(epoch FROM c.retry_delay)::float8, c.retry_backoff,
               extract(epoch FROM c.retry_delay_max)::float8,
               extract(epoch FROM c.expire_in)::float8, c.singleton_key::text,
               c.dead_letter::text, c.created_at, c.started_at, c.lease_expires_at
        FROM claimed c;
        GET DIAGNOSTICS v_taken = ROW_COUNT;
        v_left := v_left - v_taken;
    END LOOP;
END;
$$;
