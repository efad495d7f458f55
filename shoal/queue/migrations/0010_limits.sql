-- Limits across every worker process (docs/limits.md): a queue's jobs may be
-- held to at most N active at once and to a rate of starts, per partition of
-- the queue (a key taken from each job when it is sent), enforced inside the
-- claim by claim_limited_jobs_v1. Unlimited queues keep claim_jobs_v1.

-- The partition a job of a limited queue belongs to (its limits are counted
-- per key), and what starting it costs against the queue's rate. The insert
-- stamps every job of a limited queue with a key ('' for every job of a
-- queue that is not partitioned);
-- jobs of other queues keep NULL, so the two indexes below, partial on a key,
-- cost unlimited queues nothing.
-- The CHECK is NOT VALID: every row there is has the default, and a valid
-- one would read the whole table while holding its exclusive lock (adding
-- the columns themselves changes only the catalog). New rows are checked.
ALTER TABLE {schema}.job
    ADD COLUMN partition_key text COLLATE "C",
    ADD COLUMN cost integer NOT NULL DEFAULT 1,
    ADD CONSTRAINT job_cost_positive CHECK (cost >= 1) NOT VALID;
-- The archive keeps the same facts, in the same column order: the job's
-- columns, then archived_at. The previous release's maintenance archives by
-- position (`INSERT INTO job_archive SELECT moved.*, now()`), so the archive
-- is built again with the two new columns before archived_at (ALTER TABLE
-- could only add them after it), and keeps working while it runs beside
-- this release. This copies the archive: a large one makes the migration
-- slower, not unsafe (one transaction).
ALTER TABLE {schema}.job_archive RENAME TO job_archive_before_limits;
CREATE TABLE {schema}.job_archive (
    LIKE {schema}.job,
    archived_at timestamptz NOT NULL
);
INSERT INTO {schema}.job_archive
SELECT id, queue, state, priority, data, attempt, retry_limit, retry_delay, retry_backoff,
       retry_delay_max, expire_in, singleton_key, dead_letter, origin_queue, origin_id,
       start_after, created_at, started_at, lease_expires_at, finished_at, output, errors,
       NULL, 1, archived_at
FROM {schema}.job_archive_before_limits;
DROP TABLE {schema}.job_archive_before_limits;
CREATE INDEX job_archive_archived_at ON {schema}.job_archive (archived_at);
CREATE INDEX job_archive_id ON {schema}.job_archive (id);

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

-- Claims up to p_limit waiting jobs of a limited queue, within its limits
-- (the claim row of claim_jobs_v1). A queue without a queue_limit row is
-- claimed by claim_jobs_v1.
--
-- Claims of one queue are serialized by the lock on its queue_limit row,
-- held to commit: under READ COMMITTED two claimers could otherwise both
-- count the same active jobs and together pass the limit. The statements
-- after the lock take fresh snapshots, so they see every claim committed
-- before it was granted; a completion or an expired lease committed since
-- only frees a slot this claim does not see yet (never one too many).
--
-- Partitions take turns: the walk starts after the key the previous claim
-- served last (queue_limit.cursor_key) and steps through the keys that have
-- waiting jobs in key order, one probe of job_limit_waiting per key (a loose
-- index scan); a second lap goes from the first key through the cursor. It
-- stops once p_limit jobs are found, or after a bounded number of keys,
-- leaving the cursor where it stopped. Each partition gives what its free
-- slots (p_limit's share left) and its tokens allow. One statement per lap:
-- the walk is read lazily, so a claim that fills early walks no further.
CREATE FUNCTION {schema}.claim_limited_jobs_v1(p_queue text, p_limit integer, p_now timestamptz)
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
        RETURN QUERY SELECT * FROM {schema}.claim_jobs_v1(p_queue, p_limit, p_now);
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
            RETURN QUERY SELECT * FROM {schema}.claim_jobs_v1(p_queue, v_left, p_now);
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
                lease_expires_at = v_now + j.expire_in
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
