-- Limits across every worker process (docs/limits.md): a queue's jobs may be
-- held to at most N active at once and to a rate of starts, per partition of
-- the queue (a key taken from each job when it is sent), enforced inside the
-- claim by claim_limited_jobs_v1. Unlimited queues keep claim_jobs_v1.

-- The partition a job of a limited queue belongs to (its limits are counted
-- per key), and what starting it costs against the queue's rate. The insert
-- stamps every job of a limited queue with a key ('' when unpartitioned);
-- jobs of other queues keep NULL, so the two indexes below, partial on a key,
-- cost unlimited queues nothing.
ALTER TABLE {schema}.job
    ADD COLUMN partition_key text COLLATE "C",
    ADD COLUMN cost integer NOT NULL DEFAULT 1 CHECK (cost >= 1);
-- The archive keeps the same facts. Its columns now end with archived_at and
-- then these two: the archiving statement names its columns.
ALTER TABLE {schema}.job_archive
    ADD COLUMN partition_key text COLLATE "C",
    ADD COLUMN cost integer NOT NULL DEFAULT 1;

-- A slot is an active job: the claim counts a partition's active rows here
-- (no slot table that a killed worker could leak: its jobs leave 'active'
-- when maintenance expires their leases, and its slots come back with them).
CREATE INDEX job_limit_active ON {schema}.job (queue, partition_key)
    WHERE state = 'active' AND partition_key IS NOT NULL;
-- Waiting jobs of limited queues by partition: the claim steps from one
-- partition key to the next in this index, and takes each one's jobs in the
-- order the unlimited claim would.
CREATE INDEX job_limit_waiting ON {schema}.job (queue, partition_key, priority DESC, id)
    WHERE state IN ('created', 'retry') AND partition_key IS NOT NULL;

-- One row per limited queue, upserted by every worker that declares the
-- queue's limits when it starts, so every process claims under the same
-- ones. A NULL limit is no limit. Limits apply to each partition of the queue
-- (one, '', when it is not partitioned).
CREATE TABLE {schema}.queue_limit (
    queue           text COLLATE "C" PRIMARY KEY,
    -- at most this many active jobs per partition, across all processes
    concurrency     integer CHECK (concurrency >= 1),
    -- token bucket: rate_count tokens per rate_period, holding at most
    -- rate_burst; a job's start takes its cost in tokens
    rate_count      integer CHECK (rate_count >= 1),
    rate_period     interval CHECK (rate_period > interval '0'),
    rate_burst      integer CHECK (rate_burst >= 1),
    -- the field of the job data that is its partition key, when the queue is
    -- partitioned by one; the insert reads it (a key computed by a function
    -- is computed by the sender and sent with the job)
    partition_field text CHECK (partition_field <> ''),
    -- how the queue is partitioned, for people: the field, or a function's name
    partition_by    text,
    -- the partition the latest claim served last: the next claim starts after
    -- it, so partitions take turns
    cursor_key      text COLLATE "C",
    declared_at     timestamptz NOT NULL,
    CONSTRAINT rate_is_whole CHECK (
        (rate_count IS NULL) = (rate_period IS NULL)
        AND (rate_count IS NULL) = (rate_burst IS NULL))
);

-- The state of one partition of a limited queue, created on demand: a
-- partition without a row has a full bucket and is not paused, so thousands
-- of keys need no row of configuration, and a full, unpaused row may be
-- deleted at any time. Tokens are refilled lazily, by the claim, from the
-- time since refilled_at.
CREATE TABLE {schema}.limit_bucket (
    queue         text COLLATE "C" NOT NULL,
    partition_key text COLLATE "C" NOT NULL,
    -- tokens held at refilled_at; below zero after a job whose cost exceeded
    -- what was left (a debt the refill pays back first)
    tokens        float8 NOT NULL,
    refilled_at   timestamptz NOT NULL,
    -- set by a handler's RetryAfter: no job of the partition starts before it
    paused_until  timestamptz,
    PRIMARY KEY (queue, partition_key)
);

-- Claims up to p_limit waiting jobs of a limited queue, within its limits,
-- in one statement (the claim row of claim_jobs_v1). A queue without a
-- queue_limit row is claimed by claim_jobs_v1.
--
-- Claims of one queue are serialized by the lock on its queue_limit row,
-- held to commit: under READ COMMITTED two claimers could otherwise both
-- count the same active jobs and together pass the limit. Each statement
-- below takes a fresh snapshot, so it sees every claim committed before the
-- lock was granted; a completion or an expired lease committed since only
-- frees a slot this claim does not see yet (never one too many).
--
-- Partitions take turns: the walk starts after the key the previous claim
-- served last (queue_limit.cursor_key), steps through the keys that have
-- waiting jobs in key order (one probe of job_limit_waiting per key), wraps
-- around once, and stops after a bounded number of keys, leaving the cursor
-- where it stopped. From each partition it takes what its free slots, its
-- tokens and p_limit allow.
CREATE FUNCTION {schema}.claim_limited_jobs_v1(p_queue text, p_limit integer, p_now timestamptz)
RETURNS TABLE (
    id bigint, queue text, data text, priority integer, attempt integer,
    retry_limit integer, retry_delay_s float8, retry_backoff boolean, retry_delay_max_s float8,
    expire_in_s float8, singleton_key text, dead_letter text, created_at timestamptz,
    started_at timestamptz, lease_expires_at timestamptz)
LANGUAGE plpgsql
-- The window over a partition's locked jobs sorts them (a handful, already in
-- order); with enable_sort off that sort's cost passes jit_above_cost, and the
-- JIT compiled the statement anew for each partition (0.4 s each, measured).
SET jit = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := coalesce(p_now, now());
    v_limit   {schema}.queue_limit;
    v_bucket  {schema}.limit_bucket;
    v_left    integer := p_limit;
    v_start   text;             -- the cursor this claim started after
    v_key     text;             -- the partition being looked at
    v_next    text;
    v_wrapped boolean := false;
    v_served  text;             -- the last partition that gave jobs
    v_visited integer := 0;
    v_room    integer;
    v_tokens  float8;
    v_taken   integer;
BEGIN
    -- As claim_jobs_v1: a claim lost to a server crash only puts its jobs
    -- back to waiting.
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT * INTO v_limit FROM {schema}.queue_limit l WHERE l.queue = p_queue
        FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT * FROM {schema}.claim_jobs_v1(p_queue, p_limit, p_now);
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM {schema}.paused_queue p WHERE p.queue = p_queue) THEN
        RETURN;
    END IF;
    v_start := v_limit.cursor_key;
    v_key := v_start;
    -- Bounded: with every partition full, a claim would otherwise visit
    -- every key of the queue.
    WHILE v_left > 0 AND v_visited < p_limit * 4 + 100 LOOP
        IF v_key IS NULL THEN
            SELECT j.partition_key INTO v_next FROM {schema}.job j
            WHERE j.queue = p_queue AND j.state IN ('created', 'retry')
              AND j.partition_key IS NOT NULL
            ORDER BY j.partition_key LIMIT 1;
        ELSE
            SELECT j.partition_key INTO v_next FROM {schema}.job j
            WHERE j.queue = p_queue AND j.state IN ('created', 'retry')
              AND j.partition_key IS NOT NULL AND j.partition_key > v_key
            ORDER BY j.partition_key LIMIT 1;
        END IF;
        IF NOT FOUND OR (v_wrapped AND v_next > v_start) THEN
            EXIT WHEN v_wrapped OR v_start IS NULL;
            v_wrapped := true;   -- once more from the first key, up to the cursor
            v_key := NULL;
            CONTINUE;
        END IF;
        v_key := v_next;
        v_visited := v_visited + 1;

        v_room := v_left;
        IF v_limit.concurrency IS NOT NULL THEN
            v_room := least(v_room, v_limit.concurrency - (
                SELECT count(*) FROM (
                    SELECT 1 FROM {schema}.job a
                    WHERE a.queue = p_queue AND a.partition_key = v_key AND a.state = 'active'
                      AND a.partition_key IS NOT NULL
                    LIMIT v_limit.concurrency) held)::integer);
            CONTINUE WHEN v_room <= 0;
        END IF;

        v_bucket := NULL;
        SELECT * INTO v_bucket FROM {schema}.limit_bucket b
        WHERE b.queue = p_queue AND b.partition_key = v_key;
        CONTINUE WHEN v_bucket.paused_until > v_now;
        v_tokens := NULL;
        IF v_limit.rate_count IS NOT NULL THEN
            IF v_bucket.queue IS NULL THEN
                v_tokens := v_limit.rate_burst;
            ELSE
                -- A clock behind refilled_at (another process's) adds nothing.
                v_tokens := least(v_limit.rate_burst::float8,
                    v_bucket.tokens + v_limit.rate_count
                        * greatest(0, extract(epoch FROM v_now - v_bucket.refilled_at))
                        / extract(epoch FROM v_limit.rate_period));
            END IF;
            CONTINUE WHEN v_tokens < 1;
        END IF;

        -- A job starts while the tokens left before it cover its cost (or the
        -- whole bucket, for a job that costs more than the bucket holds: it
        -- starts when the bucket is full and leaves a debt). The bucket takes
        -- what the started jobs cost, in the same statement.
        RETURN QUERY
        WITH locked AS (
            SELECT j.id, j.cost, j.priority FROM {schema}.job j
            -- The key as a range of one value, and first in the order: the
            -- plan must walk job_limit_waiting. With `partition_key = v_key`
            -- the planner drops the key from the order, and the generic plan
            -- walked job_claim instead, through every waiting job of the
            -- queue, for each partition.
            WHERE j.queue = p_queue AND j.partition_key >= v_key AND j.partition_key <= v_key
              AND j.state IN ('created', 'retry') AND j.partition_key IS NOT NULL
              AND j.start_after <= v_now
            ORDER BY j.partition_key, j.priority DESC, j.id
            LIMIT v_room
            FOR UPDATE SKIP LOCKED
        ), priced AS (
            SELECT l.id, l.cost,
                   sum(l.cost) OVER (ORDER BY l.priority DESC, l.id) - l.cost AS before
            FROM locked l
        ), picked AS (
            SELECT p.id FROM priced p
            WHERE v_tokens IS NULL OR v_tokens - p.before >= least(p.cost, v_limit.rate_burst)
        ), claimed AS (
            UPDATE {schema}.job j
            SET state = 'active',
                attempt = j.attempt + 1,
                started_at = v_now,
                lease_expires_at = v_now + j.expire_in
            FROM picked
            WHERE j.id = picked.id
            RETURNING j.*
        ), debit AS (
            INSERT INTO {schema}.limit_bucket AS b (queue, partition_key, tokens, refilled_at)
            SELECT p_queue, v_key, v_tokens - sum(c.cost), v_now FROM claimed c
            HAVING v_tokens IS NOT NULL AND count(*) > 0
            ON CONFLICT (queue, partition_key) DO UPDATE
            SET tokens = excluded.tokens, refilled_at = excluded.refilled_at
        )
        SELECT c.id, c.queue::text, c.data::text, c.priority, c.attempt, c.retry_limit,
               extract(epoch FROM c.retry_delay)::float8, c.retry_backoff,
               extract(epoch FROM c.retry_delay_max)::float8,
               extract(epoch FROM c.expire_in)::float8, c.singleton_key::text,
               c.dead_letter::text, c.created_at, c.started_at, c.lease_expires_at
        FROM claimed c;
        GET DIAGNOSTICS v_taken = ROW_COUNT;
        IF v_taken > 0 THEN
            v_served := v_key;
            v_left := v_left - v_taken;
        END IF;
    END LOOP;
    -- Where the next claim starts: after the last partition served, or after
    -- the last one looked at when the walk stopped at its bound.
    IF v_visited >= p_limit * 4 + 100 THEN
        v_served := v_key;
    END IF;
    IF v_served IS DISTINCT FROM v_start AND v_served IS NOT NULL THEN
        UPDATE {schema}.queue_limit l SET cursor_key = v_served WHERE l.queue = p_queue;
    END IF;
END;
$$;
