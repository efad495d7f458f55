-- The queue layer's database functions: the live definition of every one
-- that shoal's code calls, in one place, each with the reasons it is written
-- the way it is.
--
-- This file is read, not run. The functions are created by the migrations in
-- shoal/queue/migrations; tests/test_functions_sql.py runs this file against a
-- migrated database and fails when any definition here differs from the one
-- the migrations built (or when a function the code calls is missing here).
-- A change to a function is made in both: a new migration creates the new
-- version, and this file's text is replaced by it (docs/upgrading.md, "A
-- change to a hot path").
--
-- Names are versioned (claim_jobs_v4). A versioned function is never changed
-- in place: a change creates the next version beside it, the code calls the
-- new one, and the old one stays for the workers of the previous release until
-- a later release drops it. The unversioned claim_jobs, take_jobs and
-- complete_jobs of 0001_queue.sql are kept, unchanged, for the workers of
-- release 0.1.0 and are not called by this code.
--
-- Four habits run through the claims below; they are explained here once.
--
-- - Planner switches. Each claim and completion turns off the plans it must
--   never get (SET enable_seqscan = off, ...). With them off the plan is the
--   index walk whatever the table's statistics say: statistics gathered while
--   a queue was empty made pg-boss's fetch scan every queued row, and made an
--   early shoal completion join every active job with its batch. A SET clause
--   applies to the function's own statements only.
-- - Asynchronous commit. A claim does not wait for its WAL flush
--   (synchronous_commit off, for its transaction only): a claim lost to a
--   server crash only puts its jobs back to waiting, to be claimed again.
--   Completions do wait: a completion lost after the handler's side effects
--   would run the job again.
-- - PL/pgSQL for the hot paths. Its statements are planned once per session
--   and the plan kept, where a SQL function with SET clauses is planned on
--   every call (100-140 us a statement with the job table's indexes).
-- - Claims from a position. A claimed job leaves its waiting version's entry
--   in the claim index until the version is dead to every transaction; while
--   any transaction is older than the claim (a long report, a session idle in
--   a transaction), each claim from the head of the queue steps over every
--   entry claimed since it began, reading the table for each (the ten-minute
--   run of bench/long_tx_bench.py: 21,000 buffers and 340 ms a claim after
--   270 s, the drain at 46% of its rate). So a worker passes the position
--   (priority, id) of the last job it claimed, and the claim starts just after
--   it in the index's order (priority descending, then id): jobs of a higher
--   priority from the head, the rest of that priority after the id, then the
--   lower priorities from their heads. What a claim from a position cannot see
--   (a job behind it: an insert that committed late, a retry whose time came,
--   a job another claim held locked) the claim from the head finds: the worker
--   makes one (p_after_id NULL) after a claim came back short and at least
--   once a second, and spends at most a twentieth of its time doing so
--   (shoal/queue/cursor.py).
--
-- Every claim of jobs returns the same columns, by these names (the claim
-- row): the job's settings with the durations in seconds as float8 (read by
-- date_part, which returns float8; extract returns numeric since PostgreSQL
-- 14, about 1.4 us more a claimed job), and the payload as text, parsed only if
-- a handler reads it.

-- ---- Claiming and completing jobs (shoal/queue/queries.sql: claim, complete)

-- Claims up to p_limit waiting jobs of one queue that has no limits, in
-- priority order then oldest first, from the head or after the position
-- (p_after_priority, p_after_id), as said above: the job_claim index walked
-- with SKIP LOCKED, then one UPDATE of the rows found, which leases each for
-- its own expire_in and records the claiming process in holder.
--
-- holder is the number of the claiming client's worker registry row
-- (worker.no; NULL for a client with no registry row). Maintenance hands back
-- the active jobs of a process whose heartbeat is older than its rescue_after,
-- fenced by the attempt, instead of waiting out the lease (15 minutes by
-- default). A 4-byte number, not the row's 32-character id: as text it made
-- every claimed and completed row 33 bytes wider, 62 more bytes of WAL a
-- drained job (576 -> 638 in bench/queue_bench.py). It is one more column of
-- an UPDATE that writes the row anyway; it is not indexed (the rescue reads the
-- few silent registry rows first, and only then the active jobs, through
-- job_lease).
--
-- A paused queue (a paused_queue row) gives nothing.
CREATE OR REPLACE FUNCTION {schema}.claim_jobs_v4(
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

-- claim_jobs_v4's claim, with two changes for a worker's cost per job.
--
-- It returns the lean claim row: what a worker reads for every job it runs,
-- and nothing it knows without the database. The queue is the one claimed
-- (p_queue); the lease ends expire_in after the claim's start, one time for
-- every row of a claim; and the times come as seconds since the epoch (a
-- binary float8 is read in a few nanoseconds, where psycopg converts each
-- timestamptz into the session's time zone, a zoneinfo conversion, three a
-- job). A float8 of seconds keeps a timestamp's microseconds: at today's
-- 1.8e9 s its step is 2.4e-7 s, so rounding to the nearest microsecond reads
-- back the stored value. The retry policy stays: a handler reads it
-- (Job.retry_limit) without a round trip.
--
-- And its plans are kept for the session (plan_cache_mode =
-- force_generic_plan), where claim_jobs_v4 plans each of its statements on
-- every call: with the job table's eleven indexes to consider, about 0.4 ms
-- a claim. A generic plan is safe here because the planner switches leave
-- every statement one ordered path, whatever the parameters: job_claim for
-- the selects, the primary key for the update. The branch of the position's
-- own priority says priority >= p AND priority <= p, not priority = p: with
-- an equality the planner takes priority as a constant, the primary key then
-- gives the order by id too, and a generic plan may walk it from the
-- position through every later job of every queue (86 ms a call, measured
-- on the ingest claim). tests/test_claim_plan.py checks the plans.
--
-- claim_jobs_v4 stays: claim_limited_jobs_v2 calls it, and the workers of
-- 0.2.0 claim with it.
CREATE OR REPLACE FUNCTION {schema}.claim_jobs_v5(
    p_queue text, p_limit integer, p_now timestamptz,
    p_after_priority integer, p_after_id bigint, p_holder integer)
RETURNS TABLE (
    id bigint, data text, priority integer, attempt integer,
    retry_limit integer, retry_delay_s float8, retry_backoff boolean, retry_delay_max_s float8,
    expire_in_s float8, singleton_key text, dead_letter text, created_at_s float8,
    started_at_s float8)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan
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
                  AND j.start_after <= v_now
                  AND j.priority >= p_after_priority AND j.priority <= p_after_priority
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
    RETURNING j.id, j.data::text, j.priority, j.attempt, j.retry_limit,
              date_part('epoch', j.retry_delay), j.retry_backoff,
              date_part('epoch', j.retry_delay_max),
              date_part('epoch', j.expire_in), j.singleton_key, j.dead_letter,
              date_part('epoch', j.created_at), date_part('epoch', v_now);
END;
$$;

-- Claims up to p_limit waiting jobs of a queue with limits (a queue_limit
-- row: a global concurrency, a rate limit with costs, partitions;
-- docs/limits.md), returning the claim row in claim order (priority, then
-- id). A queue without a queue_limit row is claimed by claim_jobs_v4 from the
-- head; one with only a concurrency and no partitions, by claim_jobs_v4 for as
-- many jobs as its free slots allow (none while a RetryAfter pauses it).
--
-- Claims of one queue are serialized by the lock on its queue_limit row, held
-- to commit: under READ COMMITTED two claimers could otherwise both count the
-- same active jobs and together pass the limit. The statements after the lock
-- take fresh snapshots, so they see every claim committed before it was
-- granted; a completion or an expired lease committed since only frees a slot
-- this claim does not see yet (never one too many).
--
-- Partitions take turns: the walk starts after the key the previous claim
-- served last (queue_limit.cursor_key) and steps through the keys that have
-- waiting jobs in key order, one probe of job_limit_waiting per key (a loose
-- index scan); a second lap goes from the first key through the cursor. It
-- stops once p_limit jobs are found, or after a bounded number of keys,
-- leaving the cursor where it stopped. Each partition gives what its free
-- slots (p_limit's share left) and its tokens allow. One statement per lap:
-- the walk is read lazily, so a claim that fills early walks no further.
--
-- jit is off: the window over a partition's locked jobs sorts them (a
-- handful, already in order), and with enable_sort off that sort's estimated
-- cost passed jit_above_cost, so the JIT compiled the statement on every call
-- (0.4 s, measured). The claiming process is recorded in holder, as by
-- claim_jobs_v4.
CREATE OR REPLACE FUNCTION {schema}.claim_limited_jobs_v2(
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

-- Completes active jobs, each fenced by the attempt its worker was handed (a
-- job claimed again since is not the caller's); returns the ids completed. A
-- shorter p_outputs (or an empty one) leaves the rest NULL.
--
-- One primary-key probe per job, whatever the statistics say. A fence on
-- state = 'active' is the predicate of the partial index job_lease: with
-- statistics taken while no job was active (a queue analyzed between bursts),
-- the planner estimated one active row, scanned job_lease as the outer side of
-- a nested loop and re-read the unnested ids for every active job, so a
-- completion cost (active jobs) x (jobs in the batch): 300 completions with
-- 300 jobs active took 88 ms of server time instead of about 3. Here the jobs
-- are found by id = ANY(p_ids) and matched to their attempts and outputs by a
-- hash join (nested loops off), and the fence reads lease_expires_at IS NOT
-- NULL, the same as state = 'active' by the table's CHECK active_has_lease but
-- the predicate of no partial index, so job_lease is no way in.
CREATE OR REPLACE FUNCTION {schema}.complete_jobs_v2(
    p_ids bigint[], p_attempts integer[], p_outputs jsonb[], p_now timestamptz)
RETURNS TABLE (id bigint)
LANGUAGE sql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_nestloop = off
SET enable_hashjoin = on
SET enable_mergejoin = off
AS $$
    UPDATE {schema}.job j
    SET state = 'completed',
        finished_at = coalesce(p_now, now()),
        lease_expires_at = NULL,
        output = u.output
    FROM unnest(p_ids, p_attempts, p_outputs) AS u(id, attempt, output)
    WHERE j.id = ANY(p_ids) AND j.id = u.id
      AND j.lease_expires_at IS NOT NULL AND j.attempt = u.attempt
    RETURNING j.id;
$$;

-- complete_jobs_v2's completion in PL/pgSQL, its plan kept for the session
-- (plan_cache_mode = force_generic_plan). As a SQL function with SET clauses
-- complete_jobs_v2 is parsed and planned on every call; the generic plan is
-- the same one (the planner switches leave it no other): the hash join of the
-- unnested ids and attempts with the primary-key probes of id = ANY(p_ids).
-- complete_jobs_v2 stays for the workers of 0.2.0.
CREATE OR REPLACE FUNCTION {schema}.complete_jobs_v3(
    p_ids bigint[], p_attempts integer[], p_outputs jsonb[], p_now timestamptz)
RETURNS TABLE (id bigint)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_nestloop = off
SET enable_hashjoin = on
SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    UPDATE {schema}.job j
    SET state = 'completed',
        finished_at = coalesce(p_now, now()),
        lease_expires_at = NULL,
        output = u.output
    FROM unnest(p_ids, p_attempts, p_outputs) AS u(id, attempt, output)
    WHERE j.id = ANY(p_ids) AND j.id = u.id
      AND j.lease_expires_at IS NOT NULL AND j.attempt = u.attempt
    RETURNING j.id;
END;
$$;

-- The batch layer's completion of the item jobs it claimed with a lease
-- (complete_items_v2 calls it): active -> completed, fenced by the attempt,
-- the ids completed. The plan of complete_jobs_v2 (above) is the better one;
-- this version stays because complete_items_v2 names it, and the two return
-- the same rows.
CREATE OR REPLACE FUNCTION {schema}.complete_jobs_v1(
    p_ids bigint[], p_attempts integer[], p_outputs jsonb[], p_now timestamptz)
RETURNS TABLE (id bigint)
LANGUAGE sql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
    UPDATE {schema}.job j
    SET state = 'completed',
        finished_at = coalesce(p_now, now()),
        lease_expires_at = NULL,
        output = u.output
    FROM unnest(p_ids, p_attempts, p_outputs) AS u(id, attempt, output)
    WHERE j.id = u.id AND j.state = 'active' AND j.attempt = u.attempt
    RETURNING j.id;
$$;

-- ---- The ingest layer's jobs, in 0.2.0
--
-- Until migration 0012 a topic of the postgres transport kept its messages as
-- the jobs of one queue, reached only through these functions. Since then its
-- messages have a table of their own (shoal/ingest/functions.sql) and no code
-- of this release calls them: they stay for the workers of 0.2.0, and a
-- migration of the next release drops them.

-- The ingest layer's claim: like claim_jobs_v4, from the head or a position,
-- but the lease is the caller's (a consumer leases what it takes for its own
-- ack wait, whatever the job was inserted with), and it returns only what a
-- delivery needs: the id, the priority (the position), the attempt (the
-- delivery's fence) and the payload. The lease is written into expire_in as
-- well, so a touch (extend_leases) extends by the same amount and maintenance
-- expires it as any job's lease.
--
-- The claim itself cannot keep a plan: the generic plan of the branch after
-- the position walks the primary key from the position through every later
-- job of every queue. The pause check and the update of the claimed rows by
-- primary key can, so they live in the two helpers below (queue_paused_v1,
-- lease_claimed_jobs_v1), whose plans are kept for the session. With the job
-- table's eleven indexes, 2,000 claims of an empty topic in a DO loop on the
-- 2-core development machine took 610 us a call with four statements planned
-- each time, 370 with two; in bench/ingest_bench.py at 100,000 observations
-- the claims' execution time fell from 92 to 62 us an observation.
CREATE OR REPLACE FUNCTION {schema}.claim_jobs_leased_v2(
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

-- Whether the queue is paused: a STABLE SQL function, so a PL/pgSQL caller
-- evaluates it as an expression whose plan it keeps.
CREATE OR REPLACE FUNCTION {schema}.queue_paused_v1(p_queue text)
RETURNS boolean
LANGUAGE sql
STABLE
AS $$
    SELECT EXISTS (SELECT 1 FROM {schema}.paused_queue p WHERE p.queue = p_queue);
$$;

-- Leases the claimed jobs p_ids (locked by the caller's claim) for p_lease
-- from p_now, returning what a delivery needs. By primary key, the only index
-- the statement can use: its generic plan is the custom one, and it is kept
-- for the session.
CREATE OR REPLACE FUNCTION {schema}.lease_claimed_jobs_v1(
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

-- The ingest layer's acknowledgement: deletes active jobs, each fenced by the
-- attempt its taker was handed, keeping no finished row (the topic's
-- done-marker is the record). A delete writes no new row version and no index
-- entries. Returns the ids deleted.
--
-- Found by primary key and matched to the attempts by a hash join, with the
-- fence lease_expires_at IS NOT NULL, for complete_jobs_v2's reason: a fence on
-- state = 'active' let stale statistics make every ack cost (active jobs of
-- every queue) x (ids acked). With one plan shape whatever the parameters, the
-- plan is kept (plan_cache_mode = force_generic_plan): about 40-50 us a call
-- against 160 us planned each time (an ack of 25 messages, 2,000 calls in a DO
-- loop on the 2-core development machine).
CREATE OR REPLACE FUNCTION {schema}.delete_jobs_v2(p_ids bigint[], p_attempts integer[])
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

-- The backlog of one queue: jobs ready to claim, active, and delayed (waiting
-- for their start_after), and the age in seconds of the oldest unfinished one
-- (NULL when there is none). STABLE and a single SELECT without planner
-- switches, so the planner inlines it into the caller's statement.
CREATE OR REPLACE FUNCTION {schema}.queue_depth_v1(p_queue text, p_now timestamptz)
RETURNS TABLE (ready bigint, in_flight bigint, delayed bigint, oldest_age_s float8)
LANGUAGE sql
STABLE
AS $$
    SELECT count(*) FILTER (WHERE j.state IN ('created', 'retry')
                            AND j.start_after <= coalesce(p_now, now())),
           count(*) FILTER (WHERE j.state = 'active'),
           count(*) FILTER (WHERE j.state IN ('created', 'retry')
                            AND j.start_after > coalesce(p_now, now())),
           extract(epoch FROM coalesce(p_now, now()) - min(j.created_at))::float8
    FROM {schema}.job j
    WHERE j.queue = p_queue AND j.state IN ('created', 'retry', 'active');
$$;

-- ---- The batch layer's jobs (shoal/batch/queries.sql)
--
-- A batch item is delivered by a job whose payload is {{"item": <item id>,
-- "turn": <turn>}}. The batch layer keeps its own record of each run (the item
-- row: its fence, heartbeat and outcome), so an item job is a one-shot
-- delivery: taken and deleted in one step, never leased. The batch layer
-- writes and reads the job table only through these functions.
--
-- Turns make the tasks that share a queue fair: each job of a new task carries
-- its position in the task counted from the queue's current turn, and item
-- jobs are taken in turn order (the index job_item_turn: priority descending,
-- then the turn with jobs without one first, then id). Jobs without a turn
-- (retries, a reap's or a hand-back's new jobs) come first, so a retry starts
-- within its backoff plus one claim whatever the queue holds.

-- One job per item of p_items, all with one set of options, each with the
-- singleton key and the partition key at the same place in p_keys and
-- p_partition_keys (an empty array: none); the turns continue from the
-- queue's current turn (that of its first due item job with a turn, 0 with
-- none) in p_items' order. Returns how many were inserted. A key an unfinished
-- job of the queue holds fails the statement: the keys are new.
--
-- A batch kind may declare limits (global_concurrency, rate_limit, partitions),
-- held on its item queue's queue_limit row and enforced by the limited claim,
-- which sees only jobs with a partition key and counts only keyed active jobs
-- as slots. An item job's data is only its item's id and turn: the field a
-- kind is partitioned by is in the item's data, which this layer never reads,
-- and a key from a partition_by function can only be computed by the process
-- that has the function. So the batch layer keys each item when its task is
-- created and passes the keys here. The queue_limit row is read once per
-- statement (a primary-key probe), and each job gets the key a job sent with
-- that key would get: the key passed when the queue has no limits yet (a task
-- created before its kind's workers first declared them keeps its keys); ''
-- when it has limits but no partitions (one partition, whatever key was
-- passed); else the key passed, '' for none. An unkeyed kind passes no keys,
-- and its jobs cost nothing more.
CREATE OR REPLACE FUNCTION {schema}.insert_item_jobs_v3(
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

-- Locks up to p_limit due item jobs of one queue in turn order, skipping jobs
-- another transaction holds: the first half of a take. The caller then locks
-- the items without waiting, and takes the jobs whose items it holds with
-- take_item_jobs_v2 in the same transaction; the others are released when it
-- ends, still waiting.
--
-- From the head of job_item_turn, or after the position (priority, turn, id)
-- of the last job with a turn the worker claimed, as the job claims do and for
-- the same reason: a taken item job leaves its waiting version's entry at the
-- head of the index until vacuum removes it, and a walk from the head stepped
-- over 1,109 index pages (12 ms) before the first live entry once 150,000 jobs
-- of a task had been taken (bench/million_bench.py), and far more behind a
-- long transaction. From a position it locks, in this order:
--   1. jobs of a higher priority, from their head;
--   2. jobs of the position's priority without a turn, from their head (the
--      index puts them before every turn);
--   3. jobs of that priority after (turn, id);
--   4. jobs of lower priorities, from their head.
-- What it cannot see (jobs with a turn behind the position) the claim from the
-- head finds (p_after_id NULL), made after a short claim and at least once a
-- second (shoal/queue/cursor.py).
CREATE OR REPLACE FUNCTION {schema}.lock_item_jobs_v2(
    p_queue text, p_limit integer, p_now timestamptz,
    p_after_priority integer, p_after_turn bigint, p_after_id bigint)
RETURNS TABLE (id bigint, item_id bigint)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, now());
    v_after jsonb := to_jsonb(p_after_turn);
    v_left integer := p_limit;
    v_got integer;
BEGIN
    IF EXISTS (SELECT 1 FROM {schema}.paused_queue p WHERE p.queue = p_queue) THEN
        RETURN;
    END IF;
    IF p_after_id IS NULL OR p_after_turn IS NULL THEN
        RETURN QUERY
        SELECT j.id, (j.data->>'item')::bigint
        FROM {schema}.job j
        WHERE j.queue = p_queue AND j.state IN ('created', 'retry') AND j.data ? 'item'
          AND j.start_after <= v_now
        ORDER BY j.priority DESC, (j.data->'turn') NULLS FIRST, j.id
        LIMIT p_limit
        FOR UPDATE OF j SKIP LOCKED;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT j.id, (j.data->>'item')::bigint
    FROM {schema}.job j
    WHERE j.queue = p_queue AND j.state IN ('created', 'retry') AND j.data ? 'item'
      AND j.start_after <= v_now AND j.priority > p_after_priority
    ORDER BY j.priority DESC, (j.data->'turn') NULLS FIRST, j.id
    LIMIT v_left
    FOR UPDATE OF j SKIP LOCKED;
    GET DIAGNOSTICS v_got = ROW_COUNT;
    v_left := v_left - v_got;
    IF v_left > 0 THEN
        RETURN QUERY
        SELECT j.id, (j.data->>'item')::bigint
        FROM {schema}.job j
        WHERE j.queue = p_queue AND j.state IN ('created', 'retry') AND j.data ? 'item'
          AND j.start_after <= v_now AND j.priority = p_after_priority
          AND (j.data->'turn') IS NULL
        ORDER BY j.priority DESC, (j.data->'turn') NULLS FIRST, j.id
        LIMIT v_left
        FOR UPDATE OF j SKIP LOCKED;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_left := v_left - v_got;
    END IF;
    IF v_left > 0 THEN
        RETURN QUERY
        SELECT j.id, (j.data->>'item')::bigint
        FROM {schema}.job j
        WHERE j.queue = p_queue AND j.state IN ('created', 'retry') AND j.data ? 'item'
          AND j.start_after <= v_now AND j.priority = p_after_priority
          AND ((j.data->'turn'), j.id) > (v_after, p_after_id)
        ORDER BY j.priority DESC, (j.data->'turn') NULLS FIRST, j.id
        LIMIT v_left
        FOR UPDATE OF j SKIP LOCKED;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_left := v_left - v_got;
    END IF;
    IF v_left > 0 THEN
        RETURN QUERY
        SELECT j.id, (j.data->>'item')::bigint
        FROM {schema}.job j
        WHERE j.queue = p_queue AND j.state IN ('created', 'retry') AND j.data ? 'item'
          AND j.start_after <= v_now AND j.priority < p_after_priority
        ORDER BY j.priority DESC, (j.data->'turn') NULLS FIRST, j.id
        LIMIT v_left
        FOR UPDATE OF j SKIP LOCKED;
    END IF;
END;
$$;

-- Takes the waiting jobs this transaction locked (lock_item_jobs_v2) by
-- deleting them: a one-shot delivery, no lease, no completion written later.
-- Nothing reads a taken item job again (the item row is the record of the run);
-- keeping each as a completed row for the queue's retention made the job table
-- of a busy kind hold every item of the last 12 hours (26 million rows and
-- 18 GiB in the hour's soak). A delete leaves one dead version for vacuum,
-- writes less WAL, and leaves nothing for the archive.
--
-- Found by primary key whatever the statistics say: the fence compares the
-- state as text, which implies no partial index's predicate (with state IN
-- ('created', 'retry'), the predicate of job_claim and job_item_turn, stale
-- statistics made a claim of 500 item jobs scan every waiting entry: 37 s with
-- 290,000 jobs waiting). Returns the claim row (started_at the take's time,
-- lease_expires_at NULL), the item of each job taken and its turn (NULL for a
-- job without one), in id order.
CREATE OR REPLACE FUNCTION {schema}.take_item_jobs_v2(p_ids bigint[], p_now timestamptz)
RETURNS TABLE (
    id bigint, queue text, data text, priority integer, attempt integer,
    retry_limit integer, retry_delay_s float8, retry_backoff boolean, retry_delay_max_s float8,
    expire_in_s float8, singleton_key text, dead_letter text, created_at timestamptz,
    started_at timestamptz, lease_expires_at timestamptz, item_id bigint, turn bigint)
LANGUAGE sql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
    DELETE FROM {schema}.job j
    WHERE j.id = ANY(p_ids) AND j.state::text IN ('created', 'retry')
    RETURNING j.id, j.queue, j.data::text, j.priority, j.attempt + 1, j.retry_limit,
              extract(epoch FROM j.retry_delay)::float8, j.retry_backoff,
              extract(epoch FROM j.retry_delay_max)::float8,
              extract(epoch FROM j.expire_in)::float8, j.singleton_key, j.dead_letter,
              j.created_at, coalesce(p_now, now()), NULL::timestamptz,
              (j.data->>'item')::bigint, (j.data->>'turn')::bigint;
$$;

-- Whether an unfinished job (created, retry, active) of the queue holds the
-- singleton key: one probe of job_singleton. A function with planner switches
-- is never inlined, so a caller that asks for many keys gets one index probe
-- for each, never a join of every job of the queue with them.
CREATE OR REPLACE FUNCTION {schema}.singleton_held_v1(p_queue text, p_singleton_key text)
RETURNS boolean
LANGUAGE sql
STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
    SELECT EXISTS (
        SELECT 1 FROM {schema}.job j
        WHERE j.queue = p_queue AND j.singleton_key = p_singleton_key
          AND j.state IN ('created', 'retry', 'active'));
$$;

-- A registered worker process by the number its jobs and items record
-- (worker.no), as the notes of work handed back name it: "host pid N (app A),
-- worker ID". NULL for no number or a row already dropped. The batch layer's
-- reaper calls it to name the process an item was reaped from: it reaches the
-- registry only through this function, as it reaches jobs only through the
-- queue's.
CREATE OR REPLACE FUNCTION {schema}.worker_named_v1(p_no integer)
RETURNS text
LANGUAGE sql
STABLE
AS $$
    SELECT w.host || ' pid ' || w.pid
           || CASE WHEN w.app <> '' THEN ' (app ' || w.app || ')' ELSE '' END
           || ', worker ' || w.id
    FROM {schema}.worker w
    WHERE w.no = p_no;
$$;

-- ---- The workflow layer's jobs (shoal/workflow: queries.sql start_runs, functions.sql signal_v1)

-- Sends one job whose settings the caller has already checked (a workflow's
-- job options are checked when the workflow is declared), in the statement
-- that needs it: a workflow's start creates its run and the run's first job
-- in one round trip (shoal/workflow/queries.sql, start_runs). send_v2, the SQL
-- API, would do too, but it checks and defaults every option in PL/pgSQL:
-- a start's statement took 756 us with it and 450 with this
-- (bench/runs/2026-12-07-workflow-*.md, the statements by kind).
-- No singleton key, priority 0, the queue's stored defaults not read; a
-- dead-letter queue when p_dead_letter names one (a workflow's job that fails
-- for good leaves a copy there, and the run is marked failed from it). A
-- queue with limits gets '' as partition key (one partition), as an unkeyed
-- job of a limited queue would, so the limited claim sees it. The queue's
-- workers are told when the job is due now (delivered on commit).
CREATE OR REPLACE FUNCTION {schema}.send_job_v2(
    p_queue text, p_data jsonb, p_retry_limit integer, p_retry_delay_s float8,
    p_retry_backoff boolean, p_retry_delay_max_s float8, p_expire_in_s float8,
    p_dead_letter text, p_start_at timestamptz, p_now timestamptz)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_id bigint;
    v_start timestamptz := coalesce(p_start_at, p_now, now());
BEGIN
    INSERT INTO {schema}.job (
        queue, data, retry_limit, retry_delay, retry_backoff, retry_delay_max, expire_in,
        dead_letter, start_after, created_at, partition_key)
    VALUES (
        p_queue, p_data, p_retry_limit, p_retry_delay_s * interval '1 second', p_retry_backoff,
        p_retry_delay_max_s * interval '1 second', p_expire_in_s * interval '1 second',
        p_dead_letter, v_start, coalesce(p_now, now()),
        CASE WHEN EXISTS (SELECT 1 FROM {schema}.queue_limit l WHERE l.queue = p_queue)
             THEN '' END)
    RETURNING id INTO v_id;
    IF v_start <= coalesce(p_now, now()) THEN
        PERFORM pg_notify(n.nspname || '_jobs', p_queue)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.oid = '{schema}.job'::regclass;
    END IF;
    RETURN v_id;
END;
$$;


-- Makes waiting jobs due now: a workflow run waiting for an event keeps a
-- job that resumes it at the wait's timeout, and the event's arrival moves
-- that job to now (signal_v1). Only jobs that wait (created or retry, due
-- later) move; an active, finished or already-due job is left as it is, so a
-- signal sent twice or late changes nothing. The queues of the jobs named are
-- told on the schema's channel, as send_v2 does, so an idle worker claims at
-- once rather than at its next poll (delivered on commit). The ids go through
-- the primary key: a few jobs a call.
CREATE OR REPLACE FUNCTION {schema}.wake_jobs_v1(p_ids bigint[], p_now timestamptz)
RETURNS SETOF bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_queue text;
BEGIN
    RETURN QUERY
    UPDATE {schema}.job j
    SET start_after = coalesce(p_now, now())
    WHERE j.id = ANY(p_ids) AND j.state IN ('created', 'retry')
      AND j.start_after > coalesce(p_now, now())
    RETURNING j.id;
    FOR v_queue IN
        SELECT DISTINCT j.queue FROM {schema}.job j
        WHERE j.id = ANY(p_ids) AND j.state IN ('created', 'retry')
    LOOP
        PERFORM pg_notify(n.nspname || '_jobs', v_queue)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.oid = '{schema}.job'::regclass;
    END LOOP;
END;
$$;

-- ---- Reading jobs (shoal/queue/queries.sql: list_jobs, get_job, ...)

-- A stored time as the readers load it (NULL stays NULL): within what Python's
-- datetime holds in any session time zone. A row written before the SQL API
-- checked its ranges may hold 'infinity', '-infinity' or a year past 9999,
-- which psycopg cannot load (every job list and `shoal jobs` failed with
-- DataError); such a time reads as 9999-12-31T00:00:00+00:00 (or 0001-01-02,
-- for the past), a day inside Python's limits, so a session offset of up to a
-- day cannot carry it past them. Valid times (before 100 years from now) are
-- never changed.
CREATE OR REPLACE FUNCTION {schema}.readable_time_v1(p_at timestamptz)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE
AS $$
    -- Not least(greatest(...)): those skip a NULL (a job with no lease).
    SELECT CASE WHEN p_at > '9999-12-31 00:00:00+00' THEN '9999-12-31 00:00:00+00'
                WHEN p_at < '0001-01-02 00:00:00+00' THEN '0001-01-02 00:00:00+00'
                ELSE p_at END;
$$;

-- ---- The SQL API: send a job from SQL (docs/queue.md, "From SQL")

-- The SQL API's stable name: `SELECT shoal.send('queue', '{{"a": 1}}')`. It
-- calls the current version, so callers never name a version.
CREATE OR REPLACE FUNCTION {schema}.send(queue text, data jsonb DEFAULT NULL, options jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE sql
AS $$
    SELECT {schema}.send_v2(queue, data, options);
$$;

-- Sends one job from SQL, in the caller's transaction: what Shoal.send does
-- (the same checks, messages and defaults: the send's options, then the
-- queue's stored defaults, then shoal's), except that the payload cap is the
-- default 8 KiB measured on jsonb's text. Returns the job id, or NULL when an
-- unfinished job of the queue holds its singleton key. Workers are woken when
-- the caller commits.
--
-- Times and durations are checked to the ranges Python checks (docs/queue.md,
-- "Ranges"): durations from 0 (expire_in from 1 ms) to 100 years, a
-- start_after time with an explicit offset from 1970-01-01 UTC to 100 years
-- from now. Without the checks 1e308 seconds failed with "interval out of
-- range" naming no option, and 'infinity', 'tomorrow' or a date alone were
-- stored as a start_after: a job that never runs, or one Python cannot load.
CREATE OR REPLACE FUNCTION {schema}.send_v2(p_queue text, p_data jsonb, p_options jsonb)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_known text[] := ARRAY['cost', 'dead_letter', 'expire_in', 'partition_key', 'priority',
                            'retry_backoff', 'retry_delay', 'retry_delay_max', 'retry_limit',
                            'singleton_key', 'start_after'];
    v_options jsonb := coalesce(p_options, '{{}}'::jsonb);
    v_data jsonb := coalesce(p_data, 'null'::jsonb);
    v_key text;
    v_value jsonb;
    v_hint text;
    v_default {schema}.queue_default;
    v_limit {schema}.queue_limit;
    v_partition_key text;
    v_cost integer;
    v_priority integer;
    v_retry_limit integer;
    v_retry_delay_s float8;
    v_retry_backoff boolean;
    v_retry_delay_max_s float8;
    v_expire_in_s float8;
    v_dead_letter text;
    v_singleton_key text;
    v_start_after timestamptz := now();
    v_size integer;
    v_id bigint;
BEGIN
    PERFORM {schema}.check_queue_name_v1(p_queue, 'queue');
    IF jsonb_typeof(v_options) <> 'object' THEN
        PERFORM {schema}.invalid_input_v1('options', 'must be a JSON object of job options, got '
            || {schema}.value_text_v1(v_options));
    END IF;
    FOR v_key, v_value IN SELECT key, value FROM jsonb_each(v_options) LOOP
        IF NOT v_key = ANY(v_known) THEN
            v_hint := CASE v_key
                WHEN 'retryLimit' THEN 'retry_limit' WHEN 'retryDelay' THEN 'retry_delay'
                WHEN 'retryBackoff' THEN 'retry_backoff' WHEN 'expireInSeconds' THEN 'expire_in'
                WHEN 'expireInMinutes' THEN 'expire_in' WHEN 'singletonKey' THEN 'singleton_key'
                WHEN 'startAfter' THEN 'start_after' WHEN 'deadLetter' THEN 'dead_letter'
            END;
            PERFORM {schema}.invalid_input_v1(v_key, 'unknown job option' || CASE
                WHEN v_hint IS NOT NULL THEN format('; did you mean ''%s''?', v_hint)
                ELSE '; known: ' || array_to_string(v_known, ', ') END);
        ELSIF v_key = 'retry_limit' THEN
            v_retry_limit := {schema}.option_integer_v1(v_value, 0, 2147483647);
            IF v_retry_limit IS NULL THEN
                -- Too big for the column: the range, as Python says it.
                PERFORM {schema}.invalid_input_v1(v_key, CASE
                    WHEN jsonb_typeof(v_value) = 'number' AND v_value::text ~ '^[0-9]+$'
                    THEN 'must be an integer from 0 to 2147483647, got '
                    ELSE 'must be an integer >= 0, got ' END
                    || {schema}.value_text_v1(v_value));
            END IF;
        ELSIF v_key = 'retry_delay' THEN
            v_retry_delay_s := {schema}.option_seconds_v2(v_key, v_value, true);
        ELSIF v_key = 'retry_delay_max' THEN
            v_retry_delay_max_s := {schema}.option_seconds_v2(v_key, v_value, true);
        ELSIF v_key = 'expire_in' THEN
            v_expire_in_s := {schema}.option_seconds_v2(v_key, v_value, false);
        ELSIF v_key = 'retry_backoff' THEN
            IF jsonb_typeof(v_value) <> 'boolean' THEN
                PERFORM {schema}.invalid_input_v1(v_key, 'must be true or false, got '
                    || {schema}.value_text_v1(v_value));
            END IF;
            v_retry_backoff := v_value::text::boolean;
        ELSIF v_key = 'singleton_key' THEN
            IF jsonb_typeof(v_value) <> 'null' THEN
                v_singleton_key := v_value #>> '{{}}';
                IF jsonb_typeof(v_value) <> 'string' OR v_singleton_key = ''
                   OR length(v_singleton_key) > 512 THEN
                    PERFORM {schema}.invalid_input_v1(v_key,
                        'must be a non-empty string of at most 512 characters');
                END IF;
            END IF;
        ELSIF v_key = 'start_after' THEN
            v_start_after := {schema}.option_start_after_v1(v_value);
        ELSIF v_key = 'priority' THEN
            v_priority := {schema}.option_integer_v1(v_value, -1000000, 1000000);
            IF v_priority IS NULL THEN
                PERFORM {schema}.invalid_input_v1(v_key, 'must be an integer within ±1000000, got '
                    || {schema}.value_text_v1(v_value));
            END IF;
        ELSIF v_key = 'cost' THEN
            v_cost := {schema}.option_integer_v1(v_value, 1, 2147483647);
            IF v_cost IS NULL THEN
                PERFORM {schema}.invalid_input_v1(v_key, 'must be an integer from 1 to '
                    || '2147483647, got ' || {schema}.value_text_v1(v_value));
            END IF;
        ELSIF v_key = 'partition_key' THEN
            -- A string or an integer, as shoal.queue.limits.partition_key_of
            -- takes it (the type named as Python names the decoded value).
            IF jsonb_typeof(v_value) = 'string'
               OR (jsonb_typeof(v_value) = 'number' AND v_value::text ~ '^-?[0-9]+$') THEN
                v_partition_key := v_value #>> '{{}}';
                IF length(v_partition_key) > 512 THEN
                    PERFORM {schema}.invalid_input_v1(v_key,
                        'must be at most 512 characters, without NUL');
                END IF;
            ELSIF jsonb_typeof(v_value) <> 'null' THEN
                PERFORM {schema}.invalid_input_v1(v_key,
                    'a partition key must be a string or an integer, got '
                    || CASE jsonb_typeof(v_value) WHEN 'boolean' THEN 'bool'
                            WHEN 'number' THEN 'float' WHEN 'array' THEN 'list'
                            ELSE 'dict' END);
            END IF;
        ELSIF v_key = 'dead_letter' THEN
            IF jsonb_typeof(v_value) <> 'null' THEN
                IF jsonb_typeof(v_value) <> 'string' THEN
                    PERFORM {schema}.invalid_input_v1(v_key, {schema}.value_text_v1(v_value)
                        || ' is not a valid queue name: 1-128 letters, digits, ''_'', ''.'', '
                        || '''-'' or ''/'', starting with a letter or digit');
                END IF;
                v_dead_letter := {schema}.check_queue_name_v1(v_value #>> '{{}}', v_key);
            END IF;
        END IF;
    END LOOP;
    v_size := octet_length(v_data::text);
    IF v_size > 8192 THEN
        PERFORM {schema}.invalid_input_v1('data', format('payload is %s bytes, over the '
            '8192-byte cap; send ids and load the documents in the handler', v_size));
    END IF;

    SELECT * INTO v_default FROM {schema}.queue_default d WHERE d.queue = p_queue;
    -- A limited queue's job gets its partition key as insert_jobs gives it:
    -- '' when the queue is not partitioned, else the one sent, else its
    -- data's partition field, else ''.
    SELECT * INTO v_limit FROM {schema}.queue_limit l WHERE l.queue = p_queue;
    IF v_limit.queue IS NOT NULL THEN
        v_partition_key := CASE WHEN v_limit.partition_by IS NULL THEN ''
            ELSE coalesce(v_partition_key, v_data ->> v_limit.partition_field, '') END;
    END IF;
    INSERT INTO {schema}.job (
        queue, data, priority, retry_limit, retry_delay, retry_backoff, retry_delay_max,
        expire_in, singleton_key, dead_letter, start_after, created_at, partition_key, cost)
    VALUES (
        p_queue, v_data,
        CASE WHEN v_options ? 'priority' THEN v_priority
             ELSE coalesce(v_default.priority, 0) END,
        CASE WHEN v_options ? 'retry_limit' THEN v_retry_limit
             ELSE coalesce(v_default.retry_limit, 2) END,
        CASE WHEN v_options ? 'retry_delay' THEN v_retry_delay_s * interval '1 second'
             ELSE coalesce(v_default.retry_delay, interval '0') END,
        CASE WHEN v_options ? 'retry_backoff' THEN v_retry_backoff
             ELSE coalesce(v_default.retry_backoff, false) END,
        CASE WHEN v_options ? 'retry_delay_max' THEN v_retry_delay_max_s * interval '1 second'
             ELSE coalesce(v_default.retry_delay_max, interval '1 hour') END,
        CASE WHEN v_options ? 'expire_in' THEN v_expire_in_s * interval '1 second'
             ELSE coalesce(v_default.expire_in, interval '15 minutes') END,
        v_singleton_key,
        CASE WHEN v_options ? 'dead_letter' THEN v_dead_letter ELSE v_default.dead_letter END,
        v_start_after, now(), v_partition_key, coalesce(v_cost, 1))
    ON CONFLICT DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NOT NULL AND v_start_after <= now() THEN
        -- The schema's channel, as the Python clients name it ("<schema>_jobs").
        PERFORM pg_notify(n.nspname || '_jobs', p_queue)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.oid = '{schema}.job'::regclass;
    END IF;
    RETURN v_id;
END;
$$;

-- A duration option in seconds, as shoal.queue.options checks it: a JSON
-- number from 0 (or above 0, when p_allow_zero is false) to 100 years
-- (3155760000 s, 365.25-day years). Compared as numeric: 1e400 is valid JSON
-- but no float8.
CREATE OR REPLACE FUNCTION {schema}.option_seconds_v2(p_name text, p_value jsonb, p_allow_zero boolean)
RETURNS float8
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_seconds numeric;
BEGIN
    IF jsonb_typeof(p_value) IS DISTINCT FROM 'number' THEN
        PERFORM {schema}.invalid_input_v1(p_name, 'expected a timedelta or seconds, got '
            || {schema}.value_text_v1(p_value));
    END IF;
    v_seconds := p_value::text::numeric;
    IF v_seconds < 0 OR (NOT p_allow_zero AND v_seconds = 0) THEN
        PERFORM {schema}.invalid_input_v1(p_name, format('must be %s, got %s',
            CASE WHEN p_allow_zero THEN '>= 0' ELSE '> 0' END, {schema}.value_text_v1(p_value)));
    END IF;
    -- The shortest execution timeout (MIN_EXPIRE_IN): an interval counts
    -- microseconds, so a shorter one could round to none (a CHECK violation).
    IF NOT p_allow_zero AND v_seconds < 0.001 THEN
        PERFORM {schema}.invalid_input_v1(p_name, 'must be at least 0.001 seconds, got '
            || {schema}.value_text_v1(p_value));
    END IF;
    IF v_seconds > 3155760000 THEN
        PERFORM {schema}.invalid_input_v1(p_name, 'must be at most 3155760000 seconds '
            || '(100 years), got ' || {schema}.value_text_v1(p_value));
    END IF;
    RETURN v_seconds::float8;
END;
$$;

-- The time a send's start_after option names: seconds from now, or (JSON
-- having no datetime) an ISO 8601 timestamp with a date, a time and its offset,
-- as Python takes a timezone-aware datetime; now() for null. The text is
-- matched whole before it is cast: the cast alone takes 'infinity', 'now',
-- 'tomorrow', a date without a time, and a time with no offset (in the
-- session's time zone). Years have four digits, and the time must lie from
-- 1970-01-01 UTC to 100 years from now, as in Python.
CREATE OR REPLACE FUNCTION {schema}.option_start_after_v1(p_value jsonb)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_text text;
    v_at timestamptz;
BEGIN
    IF jsonb_typeof(p_value) = 'null' THEN
        RETURN now();
    ELSIF jsonb_typeof(p_value) <> 'string' THEN
        RETURN now() + {schema}.option_seconds_v2('start_after', p_value, true)
            * interval '1 second';
    END IF;
    v_text := p_value #>> '{{}}';
    IF v_text !~ ('^[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}[T ][0-9]{{2}}:[0-9]{{2}}'
                  '(:[0-9]{{2}}([.][0-9]{{1,9}})?)?(Z|z|[+-][0-9]{{2}}(:?[0-9]{{2}})?)?$') THEN
        PERFORM {schema}.invalid_input_v1('start_after', 'expected an ISO 8601 timestamp with '
            || 'a date, a time and an offset (2027-03-01T09:00:00+00:00) or seconds, got '
            || {schema}.value_text_v1(p_value));
    END IF;
    IF v_text !~ '(Z|z|[+-][0-9]{{2}}(:?[0-9]{{2}})?)$' THEN
        PERFORM {schema}.invalid_input_v1('start_after', 'a datetime must be timezone-aware');
    END IF;
    BEGIN
        v_at := v_text::timestamptz;
    EXCEPTION WHEN data_exception THEN  -- 2027-02-30, 25:00, an offset of +99
        PERFORM {schema}.invalid_input_v1('start_after', 'expected a timestamp with its '
            || 'time zone or seconds, got ' || {schema}.value_text_v1(p_value));
    END;
    IF v_at < '1970-01-01 00:00:00+00' OR v_at > now() + interval '3155760000 seconds' THEN
        PERFORM {schema}.invalid_input_v1('start_after', 'must be from '
            || '1970-01-01T00:00:00+00:00 to 100 years from now, got '
            || {schema}.value_text_v1(p_value));
    END IF;
    RETURN v_at;
END;
$$;

-- An integer option: a JSON number written without fraction or exponent
-- (Python's parse_options refuses 3.0 and true as integers too), from p_min to
-- p_max.
CREATE OR REPLACE FUNCTION {schema}.option_integer_v1(p_value jsonb, p_min bigint, p_max bigint)
RETURNS integer
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    -- Separate statements: each cast runs only once the test before it passed.
    IF jsonb_typeof(p_value) IS DISTINCT FROM 'number'
       OR p_value::text !~ '^-?[0-9]{{1,18}}$' THEN
        RETURN NULL;
    END IF;
    IF p_value::text::bigint NOT BETWEEN p_min AND p_max THEN
        RETURN NULL;
    END IF;
    RETURN p_value::text::integer;
END;
$$;

-- A queue name as shoal.queue.options.check_queue_name accepts it.
CREATE OR REPLACE FUNCTION {schema}.check_queue_name_v1(p_name text, p_field text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_name IS NULL OR p_name !~ '^[A-Za-z0-9][A-Za-z0-9_./-]{{0,127}}$' THEN
        PERFORM {schema}.invalid_input_v1(p_field, format(
            '%s is not a valid queue name: 1-128 letters, digits, ''_'', ''.'', ''-'' or ''/'', '
            'starting with a letter or digit',
            CASE WHEN p_name IS NULL THEN 'None' ELSE '''' || p_name || '''' END));
    END IF;
    RETURN p_name;
END;
$$;

-- Raises the error of shoal's InvalidInput: "<field>: <message>", SQLSTATE
-- 22023 (invalid_parameter_value), the field also in the error's column.
CREATE OR REPLACE FUNCTION {schema}.invalid_input_v1(p_field text, p_message text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION '%: %', p_field, p_message USING ERRCODE = '22023', COLUMN = p_field;
END;
$$;

-- A JSON value as Python's repr() shows the same value, so the SQL API's
-- errors read exactly as the Python API's ("got -1", "got 'x'", "got True").
CREATE OR REPLACE FUNCTION {schema}.value_text_v1(p_value jsonb)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE jsonb_typeof(p_value)
        WHEN 'string' THEN '''' || (p_value #>> '{{}}') || ''''
        WHEN 'boolean' THEN CASE WHEN p_value::text = 'true' THEN 'True' ELSE 'False' END
        WHEN 'null' THEN 'None'
        ELSE coalesce(p_value::text, 'None')
    END;
$$;
