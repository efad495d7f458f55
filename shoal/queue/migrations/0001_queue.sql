-- Level 1: durable jobs. See docs/queue.md for the state diagram.

-- created: waiting to run (maybe not before start_after). retry: waiting after a
-- failed attempt. active: claimed by a worker, under a lease. completed,
-- cancelled, failed: finished; never change again except by an explicit
-- resume (cancelled) or retry (failed).
CREATE TYPE {schema}.job_state AS ENUM
    ('created', 'retry', 'active', 'completed', 'cancelled', 'failed');

CREATE SEQUENCE {schema}.job_id_seq AS bigint;

CREATE TABLE {schema}.job (
    id               bigint PRIMARY KEY DEFAULT nextval('{schema}.job_id_seq'),
    -- Identifiers compare bytewise (COLLATE "C"): the claim and singleton
    -- indexes are walked on every claim and insert, and locale-aware
    -- comparison made them measurably slower.
    -- The name's full syntax is checked before any write; a regex CHECK here
    -- cost a measurable share of every insert.
    queue            text COLLATE "C" NOT NULL CHECK (length(queue) BETWEEN 1 AND 128),
    state            {schema}.job_state NOT NULL DEFAULT 'created',
    priority         integer NOT NULL DEFAULT 0,
    data             jsonb NOT NULL DEFAULT 'null',
    -- attempts started so far; doubles as the fencing token of the current
    -- claim: a worker's final write names the attempt it was handed.
    attempt          integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    retry_limit      integer NOT NULL CHECK (retry_limit >= 0),
    retry_delay      interval NOT NULL CHECK (retry_delay >= interval '0'),
    retry_backoff    boolean NOT NULL,
    retry_delay_max  interval NOT NULL CHECK (retry_delay_max >= interval '0'),
    -- execution timeout: counted from the moment the job becomes active (and
    -- from each heartbeat), never from when it was queued.
    expire_in        interval NOT NULL CHECK (expire_in > interval '0'),
    singleton_key    text COLLATE "C",
    dead_letter      text COLLATE "C",
    -- set on jobs a dead-letter queue received: where the original lived.
    origin_queue     text COLLATE "C",
    origin_id        bigint,
    start_after      timestamptz NOT NULL,
    created_at       timestamptz NOT NULL,
    started_at       timestamptz,
    lease_expires_at timestamptz,
    finished_at      timestamptz,
    output           jsonb,
    -- one entry per failed attempt, appended, never overwritten.
    errors           jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(errors) = 'array'),
    CONSTRAINT active_has_lease CHECK ((state = 'active') = (lease_expires_at IS NOT NULL)),
    CONSTRAINT finished_has_time CHECK (
        (state IN ('completed', 'cancelled', 'failed')) = (finished_at IS NOT NULL)),
    CONSTRAINT active_was_started CHECK (state <> 'active' OR started_at IS NOT NULL)
);

-- The claim walks this index in its own order, so its plan never needs
-- statistics: a queue that bursts from empty is claimed as fast as a full one.
CREATE INDEX job_claim ON {schema}.job (queue, priority DESC, id)
    WHERE state IN ('created', 'retry');

-- singleton_key de-duplicates among unfinished jobs of a queue only.
CREATE UNIQUE INDEX job_singleton ON {schema}.job (queue, singleton_key)
    WHERE singleton_key IS NOT NULL AND state IN ('created', 'retry', 'active');

CREATE INDEX job_lease ON {schema}.job (lease_expires_at) WHERE state = 'active';

CREATE INDEX job_finished ON {schema}.job (finished_at)
    WHERE state IN ('completed', 'cancelled', 'failed');


-- Finished jobs past their retention, kept for inspection until pruned.
CREATE TABLE {schema}.job_archive (
    LIKE {schema}.job,
    archived_at timestamptz NOT NULL
);
CREATE INDEX job_archive_archived_at ON {schema}.job_archive (archived_at);
CREATE INDEX job_archive_id ON {schema}.job_archive (id);

-- A row per paused queue; workers in every process stop claiming from it.
CREATE TABLE {schema}.paused_queue (
    queue     text COLLATE "C" PRIMARY KEY,
    paused_at timestamptz NOT NULL
);

-- Cron schedules. last_tick is advanced by a conditional update; the process
-- whose update wins a tick inserts its job in the same transaction, so each
-- tick runs once however many processes run the scheduler.
CREATE TABLE {schema}.schedule (
    name       text COLLATE "C" PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.\-/]{{0,127}}$'),
    queue      text COLLATE "C" NOT NULL,
    cron       text NOT NULL,
    timezone   text NOT NULL DEFAULT 'UTC',
    data       jsonb NOT NULL DEFAULT 'null',
    options    jsonb NOT NULL DEFAULT '{{}}',
    last_tick  timestamptz NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);

-- Claims up to n waiting jobs of one queue, oldest first within a priority.
-- The planner switches are the point of this function: with them off, the
-- plan is the job_claim index scan whatever the table's statistics say
-- (statistics gathered while the queue was empty made pg-boss's fetch scan
-- every queued row). SET clauses apply to this function's statements only.
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

-- Completes active jobs, each fenced by the attempt its worker was handed;
-- returns the ids completed. Like claim_jobs, the planner switches fix the
-- plan: one primary-key probe per job. Left free, the planner combined the key
-- with a bitmap scan of job_lease, which reads every entry it ever had (no
-- vacuum removes dead ones) and slowed each completion as a queue grew.
-- A shorter p_outputs (or an empty one) leaves the rest NULL.
CREATE FUNCTION {schema}.complete_jobs(
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
