-- The operations console: what it lists, controls and charts (see docs/console.md).

-- Schedules: a pause flag, the App that declared it (an App removes the
-- schedules it declared and no longer declares when it starts), and the job
-- its latest tick sent.
ALTER TABLE {schema}.schedule
    ADD COLUMN paused_at timestamptz,
    ADD COLUMN owner text,
    ADD COLUMN last_job_id bigint;

-- Failed jobs by queue, newest first: the console's first list. Partial, so
-- the jobs that never fail cost no index write at all (a full index on
-- (queue, state) would take one on every insert and state change).
CREATE INDEX job_failed_queue ON {schema}.job (queue, id) WHERE state = 'failed';
-- Jobs per (queue, state) are far from independent (one queue fails a lot,
-- another never): without this the planner guessed a queue's failed jobs from
-- the averages and walked the whole primary key to list a queue with none.
CREATE STATISTICS {schema}.job_queue_state (mcv) ON queue, state FROM {schema}.job;

-- Search by singleton key among finished jobs (unfinished ones are in
-- job_singleton). Finished only, so the singleton checks of inserts and the
-- batch layer's sweeps keep their (queue, singleton_key) index.
CREATE INDEX job_singleton_finished ON {schema}.job (singleton_key)
    WHERE singleton_key IS NOT NULL AND state IN ('completed', 'cancelled', 'failed');

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
