-- Level 2: batch tasks. One task row, N item rows, N queue jobs, created in one
-- transaction. Workers write only their own item row; the aggregator alone
-- closes a task. See docs/batch.md for the state diagrams.

CREATE TYPE {schema}.task_status AS ENUM ('processing', 'completed', 'cancelled');
CREATE TYPE {schema}.task_outcome AS ENUM
    ('completed', 'completed_with_errors', 'cancelled', 'timed_out');
-- pending: waiting for its job. running: a worker passed the phantom guard.
-- completed, error, cancelled: finished (retry-failed moves error back to pending).
CREATE TYPE {schema}.item_status AS ENUM ('pending', 'running', 'completed', 'error', 'cancelled');

CREATE TABLE {schema}.task (
    id                  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    kind                text COLLATE "C" NOT NULL,
    status              {schema}.task_status NOT NULL DEFAULT 'processing',
    outcome             {schema}.task_outcome,
    -- Idempotency is this unique key plus a conflict catch, never read-then-write.
    idempotency_key     text COLLATE "C" UNIQUE,
    -- A digest of the request, so a reused key with a different request is told apart.
    request_hash        text NOT NULL,
    params              jsonb NOT NULL DEFAULT 'null',
    total               integer NOT NULL CHECK (total > 0),
    max_attempts        integer NOT NULL CHECK (max_attempts > 0),
    zombie_timeout      interval NOT NULL CHECK (zombie_timeout > interval '0'),
    deadline_at         timestamptz,
    -- Set by cancel() or a passed deadline: pending items never start, and the
    -- task closes as cancelled | timed_out once nothing runs.
    cancel_reason       {schema}.task_outcome CHECK (cancel_reason IN ('cancelled', 'timed_out')),
    cancel_requested_at timestamptz,
    -- Where and how the items' jobs are sent: the aggregator re-dispatches
    -- reaped items with these, whatever kinds its own process knows.
    item_queue          text COLLATE "C" NOT NULL,
    job_options         jsonb NOT NULL DEFAULT '{{}}',
    -- Queue that receives the on_complete hook job when the task closes.
    on_complete_queue   text COLLATE "C",
    created_at          timestamptz NOT NULL,
    completed_at        timestamptz,
    -- When the last item finished, as seen by the closing aggregator: the
    -- difference to completed_at is the completion-detection latency.
    last_item_at        timestamptz,
    CONSTRAINT closed_has_time CHECK ((status = 'processing') = (completed_at IS NULL)),
    CONSTRAINT closed_has_outcome CHECK ((status = 'processing') = (outcome IS NULL)),
    CONSTRAINT cancelled_outcome CHECK (status <> 'cancelled' OR outcome IN ('cancelled', 'timed_out')),
    CONSTRAINT cancel_has_time CHECK ((cancel_reason IS NULL) = (cancel_requested_at IS NULL))
);
CREATE INDEX task_processing ON {schema}.task (created_at) WHERE status = 'processing';
CREATE INDEX task_created ON {schema}.task (created_at DESC, id);

CREATE TABLE {schema}.item (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id     uuid NOT NULL REFERENCES {schema}.task (id) ON DELETE CASCADE,
    ref         text COLLATE "C" NOT NULL,
    data        jsonb NOT NULL DEFAULT 'null',
    status      {schema}.item_status NOT NULL DEFAULT 'pending',
    -- Guard passes so far; the fencing token of the current run. A worker's
    -- final write names it, so a worker presumed dead cannot overwrite the
    -- result of the run that replaced it.
    attempt     integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    -- attempt when retry-failed last reopened the item: runs since then are
    -- attempt - attempt_base, bounded by the task's max_attempts.
    attempt_base integer NOT NULL DEFAULT 0 CHECK (attempt_base <= attempt),
    result      jsonb,
    error       text,
    errors      jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(errors) = 'array'),
    started_at  timestamptz,
    -- Last sign of life: set by the guard, each heartbeat and the final write.
    -- The reaper judges zombies by it, never by started_at.
    updated_at  timestamptz NOT NULL,
    finished_at timestamptz,
    CONSTRAINT item_ref_unique UNIQUE (task_id, ref),
    CONSTRAINT finished_has_time CHECK (
        (status IN ('completed', 'error', 'cancelled')) = (finished_at IS NOT NULL))
);
-- Progress is one GROUP BY status over this index; paging by status walks it by id.
CREATE INDEX item_task_status ON {schema}.item (task_id, status, id);
CREATE INDEX item_running ON {schema}.item (updated_at) WHERE status = 'running';

-- Rare events counted cluster-wide (phantom skips, zombies reaped), written in
-- the transaction of the event, read by /metrics.
CREATE TABLE {schema}.counter (
    name  text PRIMARY KEY,
    value bigint NOT NULL DEFAULT 0
);
