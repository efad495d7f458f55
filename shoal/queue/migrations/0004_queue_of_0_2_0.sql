-- The queue layer's part of shoal 0.2.0's schema change from 0.1.0: the
-- migrations written while 0.2.0 was developed (steps 4-36, in their order),
-- folded into one file per layer at the release. Only the database functions
-- 0.2.0's code calls are created; versions replaced before the release never
-- shipped and are left out. Each live function's definition and the reasons
-- for it are in shoal/queue/functions.sql; the comments below say why each
-- table, column and index change is made, step by step.

-- ---- step 6 of the development of 0.2.0 ----

-- complete_jobs_v1: its definition and the reasons for it are in shoal/queue/functions.sql.
CREATE FUNCTION {schema}.complete_jobs_v1(
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

-- singleton_held_v1: its definition and the reasons for it are in shoal/queue/functions.sql.
CREATE FUNCTION {schema}.singleton_held_v1(p_queue text, p_singleton_key text)
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

-- ---- step 9 of the development of 0.2.0 ----
-- The operations console: what it lists, controls and charts (see docs/console.md).

-- Schedules: a pause flag, the App that declared it (an App removes the
-- schedules it declared and no longer declares when it starts), and the job
-- its latest tick sent.
ALTER TABLE {schema}.schedule
    ADD COLUMN paused_at timestamptz,
    ADD COLUMN owner text,
    ADD COLUMN last_job_id bigint;

-- One row per live worker process, written by its heartbeat. A row whose
-- heartbeat is older than the timeout shows as gone, then is deleted.
CREATE TABLE {schema}.worker (
    id           text COLLATE "C" PRIMARY KEY,
    host         text NOT NULL,
    pid          integer NOT NULL,
    app          text NOT NULL,
    -- each queue served and its concurrency, as a JSON object
    queues       jsonb NOT NULL DEFAULT '{{}}' CHECK (jsonb_typeof(queues) = 'object'),
    started_at   timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL,
    running      integer NOT NULL DEFAULT 0,
    done         bigint NOT NULL DEFAULT 0
);

-- Samples for the console's charts. Every `resolution` seconds (10 and 300)
-- one process writes a row per queue, plus one for all queues ('*'): jobs
-- finished in the interval that ends at `at`, depths at `at`, and run-time
-- and queue-wait percentiles of the jobs finished in the interval.
CREATE TABLE {schema}.history (
    resolution  integer NOT NULL CHECK (resolution > 0),
    queue       text COLLATE "C" NOT NULL,
    at          timestamptz NOT NULL,
    completed   integer NOT NULL,
    failed      integer NOT NULL,
    waiting     integer NOT NULL,
    running     integer NOT NULL,
    retrying    integer NOT NULL,
    run_p50_s   real,
    run_p95_s   real,
    wait_p50_s  real,
    wait_p95_s  real,
    PRIMARY KEY (resolution, queue, at)
);
CREATE INDEX history_at ON {schema}.history (resolution, at);

-- ---- step 10 of the development of 0.2.0 ----
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

-- ---- step 11 of the development of 0.2.0 ----
-- Queue defaults and the SQL API (docs/queue.md, "Sending from SQL").
--
-- queue_default: a queue's default job options, written by a worker's start
-- for each `App.handler(..., retry_limit=...)` (or by set_queue_defaults),
-- read by every insert: an option a send does not name takes the queue's
-- default, so the defaults hold wherever a job is sent from (another
-- process, a synchronous client, SQL). NULL: no default for that option.
CREATE TABLE {schema}.queue_default (
    queue            text COLLATE "C" PRIMARY KEY CHECK (length(queue) BETWEEN 1 AND 128),
    priority         integer,
    retry_limit      integer CHECK (retry_limit >= 0),
    retry_delay      interval CHECK (retry_delay >= interval '0'),
    retry_backoff    boolean,
    retry_delay_max  interval CHECK (retry_delay_max >= interval '0'),
    expire_in        interval CHECK (expire_in > interval '0'),
    dead_letter      text COLLATE "C",
    updated_at       timestamptz NOT NULL
);

-- value_text_v1: its definition and the reasons for it are in shoal/queue/functions.sql.
CREATE FUNCTION {schema}.value_text_v1(p_value jsonb)
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

-- invalid_input_v1: its definition and the reasons for it are in shoal/queue/functions.sql.
CREATE FUNCTION {schema}.invalid_input_v1(p_field text, p_message text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION '%: %', p_field, p_message USING ERRCODE = '22023', COLUMN = p_field;
END;
$$;

-- check_queue_name_v1: its definition and the reasons for it are in shoal/queue/functions.sql.
CREATE FUNCTION {schema}.check_queue_name_v1(p_name text, p_field text)
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

-- option_integer_v1: its definition and the reasons for it are in shoal/queue/functions.sql.
CREATE FUNCTION {schema}.option_integer_v1(p_value jsonb, p_min bigint, p_max bigint)
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

-- ---- step 14 of the development of 0.2.0 ----

-- queue_depth_v1: its definition and the reasons for it are in shoal/queue/functions.sql.
CREATE FUNCTION {schema}.queue_depth_v1(p_queue text, p_now timestamptz)
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

-- ---- step 15 of the development of 0.2.0 ----

-- complete_jobs_v2: its definition and the reasons for it are in shoal/queue/functions.sql.
CREATE FUNCTION {schema}.complete_jobs_v2(
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

-- ---- step 19 of the development of 0.2.0 ----
-- The job table, built again with the columns a claim, a completion or a
-- failure writes at the end of the row: same columns, types, defaults,
-- constraints, indexes and rows; only their order on disk changes.
--
-- Why. A claim and a completion each write a new version of the job row,
-- and since step 15 that version stays on its page. PostgreSQL then
-- logs only the bytes between the first and the last that differ from the
-- old version (the unchanged prefix and suffix are left out). The row had
-- `state` third and `lease_expires_at` and `output` near the end, so nearly
-- the whole row (payload, retry policy, timestamps) lay between them and
-- went into the WAL twice per job. With the changing columns last the span
-- is those columns alone. Measured on this machine with the job table's
-- indexes, 3,000 jobs claimed and completed 100 at a time (the same rows in
-- both orders): 765 bytes of WAL per job in the old order, 566 in this one;
-- the raw psycopg loop of bench/queue_bench.py writes 593.
--
-- What it costs. The copy holds the table's exclusive lock: workers wait
-- for it (a million jobs take seconds) and go on; nothing is lost.
-- Code of every release names the job's columns, never their positions
-- (the archive is filled by name since step 10), so the previous
-- release's workers run unchanged on the rebuilt table.
--
-- The archive is built again in the same order (then archived_at): the
-- release whose schema ended at migration 3 archives by position
-- (`INSERT INTO job_archive SELECT moved.*, now()`), as 0010 says.
--
-- The unversioned claim_jobs and take_jobs of 0001_queue.sql return this
-- table's row type, which would keep the old table in place: they are
-- dropped, and created again at the end, unchanged, for the workers of that
-- release (docs/upgrading.md). The ingest layer does the same with
-- claim_messages (0018, 0021), and the batch layer builds its job_item_turn
-- index again (step 20).
DROP FUNCTION {schema}.claim_jobs(text, integer, timestamptz);
DROP FUNCTION {schema}.take_jobs(text, integer, timestamptz);

CREATE TABLE {schema}.job_rebuilt (
    id               bigint NOT NULL DEFAULT nextval('{schema}.job_id_seq'),
    queue            text COLLATE "C" NOT NULL,
    priority         integer NOT NULL DEFAULT 0,
    data             jsonb NOT NULL DEFAULT 'null',
    retry_limit      integer NOT NULL,
    retry_delay      interval NOT NULL,
    retry_backoff    boolean NOT NULL,
    retry_delay_max  interval NOT NULL,
    expire_in        interval NOT NULL,
    singleton_key    text COLLATE "C",
    dead_letter      text COLLATE "C",
    origin_queue     text COLLATE "C",
    origin_id        bigint,
    partition_key    text COLLATE "C",
    cost             integer NOT NULL DEFAULT 1,
    created_at       timestamptz NOT NULL,
    -- Written by a retry, a snooze or a hand-back, with state.
    start_after      timestamptz NOT NULL,
    -- Written by every transition.
    state            {schema}.job_state NOT NULL DEFAULT 'created',
    attempt          integer NOT NULL DEFAULT 0,
    started_at       timestamptz,
    lease_expires_at timestamptz,
    finished_at      timestamptz,
    output           jsonb,
    -- Appended to by a failure, with state.
    errors           jsonb NOT NULL DEFAULT '[]',
    CONSTRAINT job_queue_check CHECK (length(queue) >= 1 AND length(queue) <= 128),
    CONSTRAINT job_retry_limit_check CHECK (retry_limit >= 0),
    CONSTRAINT job_retry_delay_check CHECK (retry_delay >= interval '0'),
    CONSTRAINT job_retry_delay_max_check CHECK (retry_delay_max >= interval '0'),
    CONSTRAINT job_expire_in_check CHECK (expire_in > interval '0'),
    CONSTRAINT job_cost_positive CHECK (cost >= 1),
    CONSTRAINT job_attempt_check CHECK (attempt >= 0),
    CONSTRAINT job_errors_check CHECK (jsonb_typeof(errors) = 'array'),
    CONSTRAINT active_has_lease CHECK ((state = 'active') = (lease_expires_at IS NOT NULL)),
    CONSTRAINT finished_has_time CHECK (
        (state IN ('completed', 'cancelled', 'failed')) = (finished_at IS NOT NULL)),
    CONSTRAINT active_was_started CHECK (state <> 'active' OR started_at IS NOT NULL)
) WITH (fillfactor = 50);

INSERT INTO {schema}.job_rebuilt (
    id, queue, priority, data, retry_limit, retry_delay, retry_backoff, retry_delay_max,
    expire_in, singleton_key, dead_letter, origin_queue, origin_id, partition_key, cost,
    created_at, start_after, state, attempt, started_at, lease_expires_at, finished_at,
    output, errors)
SELECT id, queue, priority, data, retry_limit, retry_delay, retry_backoff, retry_delay_max,
       expire_in, singleton_key, dead_letter, origin_queue, origin_id, partition_key, cost,
       created_at, start_after, state, attempt, started_at, lease_expires_at, finished_at,
       output, errors
FROM {schema}.job
ORDER BY id;

DROP TABLE {schema}.job;
ALTER TABLE {schema}.job_rebuilt RENAME TO job;

-- The indexes of migrations 1, 9, 10 and 13, by the same names.
ALTER TABLE {schema}.job ADD CONSTRAINT job_pkey PRIMARY KEY (id);
CREATE INDEX job_claim ON {schema}.job (queue, priority DESC, id)
    WHERE state IN ('created', 'retry');
CREATE UNIQUE INDEX job_singleton ON {schema}.job (queue, singleton_key)
    WHERE singleton_key IS NOT NULL AND state IN ('created', 'retry', 'active');
CREATE INDEX job_lease ON {schema}.job (lease_expires_at) WHERE state = 'active';
CREATE INDEX job_finished ON {schema}.job (finished_at)
    WHERE state IN ('completed', 'cancelled', 'failed');
CREATE INDEX job_failed_queue ON {schema}.job (queue, id) WHERE state = 'failed';
CREATE INDEX job_singleton_finished ON {schema}.job (singleton_key)
    WHERE singleton_key IS NOT NULL AND state IN ('completed', 'cancelled', 'failed');
CREATE INDEX job_limit_active ON {schema}.job (queue, partition_key)
    WHERE state = 'active' AND partition_key IS NOT NULL;
CREATE INDEX job_limit_waiting ON {schema}.job (queue, partition_key, priority DESC, id)
    WHERE state IN ('created', 'retry') AND partition_key IS NOT NULL;
CREATE INDEX job_retry_queue ON {schema}.job (queue) WHERE state = 'retry';
CREATE STATISTICS {schema}.job_queue_state (mcv) ON queue, state FROM {schema}.job;

-- A new table has no statistics; the console's lists and counts plan by
-- them (the claim and the completion do not: their plans are fixed).
ANALYZE {schema}.job;

-- The archive, in the job's new order, then archived_at.
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

-- claim_jobs and take_jobs of 0001_queue.sql, as they were (see there).
CREATE FUNCTION {schema}.claim_jobs(p_queue text, p_limit integer, p_now timestamptz)
RETURNS SETOF {schema}.job
LANGUAGE sql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
    -- The claim need not wait for its WAL flush: a claim lost to a server
    -- crash only puts its jobs back to waiting; their workers' results then
    -- lose the attempt fence and the jobs run again (at-least-once, as for
    -- any crash). A completion is flushed, and with it every earlier claim.
    SELECT set_config('synchronous_commit', 'off', true);
    WITH next AS (
        SELECT id
        FROM {schema}.job
        WHERE queue = p_queue
          AND state IN ('created', 'retry')
          AND start_after <= coalesce(p_now, now())
          AND NOT EXISTS (SELECT 1 FROM {schema}.paused_queue p WHERE p.queue = p_queue)
        ORDER BY priority DESC, id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    )
    UPDATE {schema}.job j
    SET state = 'active',
        attempt = j.attempt + 1,
        started_at = coalesce(p_now, now()),
        lease_expires_at = coalesce(p_now, now()) + j.expire_in
    FROM next
    WHERE j.id = next.id
    RETURNING j.*;
$$;

-- Takes up to n waiting jobs of one queue, oldest first within a priority, and
-- completes them in the same step: a one-shot delivery, for a caller that keeps
-- its own record of each run and its own recovery (the batch layer's item rows,
-- heartbeats and reaper). No lease is taken, so nothing expires and no
-- completion is written later: one update per job instead of two. Like
-- claim_jobs, it need not wait for its WAL flush (a take lost to a server crash
-- puts its jobs back to waiting, to be delivered again) and the planner
-- switches fix the plan to the job_claim index scan.
CREATE FUNCTION {schema}.take_jobs(p_queue text, p_limit integer, p_now timestamptz)
RETURNS SETOF {schema}.job
LANGUAGE sql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
    SELECT set_config('synchronous_commit', 'off', true);
    WITH next AS (
        SELECT id
        FROM {schema}.job
        WHERE queue = p_queue
          AND state IN ('created', 'retry')
          AND start_after <= coalesce(p_now, now())
          AND NOT EXISTS (SELECT 1 FROM {schema}.paused_queue p WHERE p.queue = p_queue)
        ORDER BY priority DESC, id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    )
    UPDATE {schema}.job j
    SET state = 'completed',
        attempt = j.attempt + 1,
        started_at = coalesce(p_now, now()),
        finished_at = coalesce(p_now, now())
    FROM next
    WHERE j.id = next.id
    RETURNING j.*;
$$;

-- ---- step 22 of the development of 0.2.0 ----
-- The jobs each registered worker process runs now, per queue, as its
-- heartbeat reports them: a JSON object of queue -> jobs running.
--
-- Why. The history sampler counted a queue's running jobs through job_lease
-- every 10 s. That index keeps an entry for every job that was ever active
-- until vacuum removes it, and the count must check each entry of a job that
-- finished since the last sample against the table once: about 0.25 µs a
-- job, 48 ms of a 90 ms sample during a drain of 20,000 jobs/s, and as a share
-- of the server's work per job it does not shrink with a longer interval.
-- Read from here, running is what the worker processes say they run, as in
-- the Workers page, at the cost of one row per process.
ALTER TABLE {schema}.worker
    ADD COLUMN running_by_queue jsonb NOT NULL DEFAULT '{{}}'
        CHECK (jsonb_typeof(running_by_queue) = 'object');

-- ---- step 23 of the development of 0.2.0 ----

-- lock_item_jobs_v2: its definition and the reasons for it are in shoal/queue/functions.sql.
CREATE FUNCTION {schema}.lock_item_jobs_v2(
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

-- take_item_jobs_v2: its definition and the reasons for it are in shoal/queue/functions.sql.
CREATE FUNCTION {schema}.take_item_jobs_v2(p_ids bigint[], p_now timestamptz)
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

-- ---- step 26 of the development of 0.2.0 ----

-- queue_paused_v1: its definition and the reasons for it are in shoal/queue/functions.sql.
CREATE FUNCTION {schema}.queue_paused_v1(p_queue text)
RETURNS boolean
LANGUAGE sql
STABLE
AS $$
    SELECT EXISTS (SELECT 1 FROM {schema}.paused_queue p WHERE p.queue = p_queue);
$$;

-- lease_claimed_jobs_v1: its definition and the reasons for it are in shoal/queue/functions.sql.
CREATE FUNCTION {schema}.lease_claimed_jobs_v1(
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

-- claim_jobs_leased_v2: its definition and the reasons for it are in shoal/queue/functions.sql.
CREATE FUNCTION {schema}.claim_jobs_leased_v2(
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

-- ---- step 27 of the development of 0.2.0 ----

-- delete_jobs_v2: its definition and the reasons for it are in shoal/queue/functions.sql.
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

-- ---- step 29 of the development of 0.2.0 ----

-- option_seconds_v2: its definition and the reasons for it are in shoal/queue/functions.sql.
CREATE FUNCTION {schema}.option_seconds_v2(p_name text, p_value jsonb, p_allow_zero boolean)
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

-- option_start_after_v1: its definition and the reasons for it are in shoal/queue/functions.sql.
CREATE FUNCTION {schema}.option_start_after_v1(p_value jsonb)
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

-- send_v2: its definition and the reasons for it are in shoal/queue/functions.sql.
CREATE FUNCTION {schema}.send_v2(p_queue text, p_data jsonb, p_options jsonb)
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

-- send: its definition and the reasons for it are in shoal/queue/functions.sql.
CREATE OR REPLACE FUNCTION {schema}.send(queue text, data jsonb DEFAULT NULL, options jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE sql
AS $$
    SELECT {schema}.send_v2(queue, data, options);
$$;

-- readable_time_v1: its definition and the reasons for it are in shoal/queue/functions.sql.
CREATE FUNCTION {schema}.readable_time_v1(p_at timestamptz)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE
AS $$
    -- Not least(greatest(...)): those skip a NULL (a job with no lease).
    SELECT CASE WHEN p_at > '9999-12-31 00:00:00+00' THEN '9999-12-31 00:00:00+00'
                WHEN p_at < '0001-01-02 00:00:00+00' THEN '0001-01-02 00:00:00+00'
                ELSE p_at END;
$$;

-- ---- step 31 of the development of 0.2.0 ----
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

-- claim_jobs_v4: its definition and the reasons for it are in shoal/queue/functions.sql.
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

-- claim_limited_jobs_v2: its definition and the reasons for it are in shoal/queue/functions.sql.
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

-- ---- step 33 of the development of 0.2.0 ----

-- worker_named_v1: its definition and the reasons for it are in shoal/queue/functions.sql.
CREATE FUNCTION {schema}.worker_named_v1(p_no integer)
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

-- ---- step 35 of the development of 0.2.0 ----

-- insert_item_jobs_v3: its definition and the reasons for it are in shoal/queue/functions.sql.
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
