-- The job table, built again with the columns a claim, a completion or a
-- failure writes at the end of the row: same columns, types, defaults,
-- constraints, indexes and rows; only their order on disk changes.
--
-- Why. A claim and a completion each write a new version of the job row,
-- and since migration 15 that version stays on its page. PostgreSQL then
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
-- (the archive is filled by name since migration 10), so the previous
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
-- index again (0020).
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
