-- Durable workflows (docs/workflows.md): runs of a workflow function, the
-- checkpoint of each step a run finished, and events sent to runs.

-- One row per run. The id is the caller's (starting twice with one id starts
-- one run) or a generated one. `epoch` fences the run's checkpoints: each job
-- that resumes the run takes the next epoch, and a checkpoint is written only
-- by the job holding the current one, so a runner that lost its lease and was
-- replaced writes nothing more. While a run sleeps or waits, `wake_job` is
-- the queue job that will resume it, `wait_seq` the step it waits at, and
-- `wait_key` the event it waits for (signal_v1 wakes the job early; a wait
-- for a batch task or a child run has no wake job: the task's completion job,
-- or the child's event, resumes it). A child run's `done_key` is the event
-- its end sends to its parent.
CREATE TABLE {schema}.workflow_run (
    id          text COLLATE "C" PRIMARY KEY,
    name        text COLLATE "C" NOT NULL,
    input       jsonb,
    status      text NOT NULL DEFAULT 'pending' CHECK (status IN (
                    'pending', 'running', 'sleeping', 'waiting',
                    'completed', 'failed', 'cancelled')),
    epoch       integer NOT NULL DEFAULT 0,
    job         bigint,
    wake_job    bigint,
    wait_seq    integer,
    wait_key    text COLLATE "C",
    done_key    text COLLATE "C",
    result      jsonb,
    error       text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE INDEX workflow_run_waiting ON {schema}.workflow_run (wait_key) WHERE wait_key IS NOT NULL;
-- Listing, newest first (list_runs).
CREATE INDEX workflow_run_created ON {schema}.workflow_run (created_at DESC, id DESC);
-- The runs /metrics counts (count_open_runs): those not finished, and the
-- failed ones an operator has to act on. Completed and cancelled runs, which
-- only grow, are left out, so a scrape reads no more than the open runs.
CREATE INDEX workflow_run_open ON {schema}.workflow_run (name, status)
    WHERE status IN ('pending', 'running', 'sleeping', 'waiting', 'failed');

-- One row per step a run reached, by its place in the run (seq, from 1).
-- `kind`: a step the code ran, a sleep, a wait for an event, a batch task it
-- created and waited for, or a child run it started. A completed
-- row is the checkpoint a replay returns instead of running the step again;
-- `retrying` holds the attempts a failing step has made, `waiting` a sleep or
-- a wait not over yet, `failed` a step whose attempts are spent.
CREATE TABLE {schema}.workflow_step (
    run_id      text COLLATE "C" NOT NULL REFERENCES {schema}.workflow_run ON DELETE CASCADE,
    seq         integer NOT NULL CHECK (seq >= 1),
    name        text NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('step', 'sleep', 'wait', 'batch')),
    status      text NOT NULL CHECK (status IN ('completed', 'retrying', 'waiting', 'failed')),
    attempts    integer NOT NULL DEFAULT 0,
    result      jsonb,
    error       text,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    PRIMARY KEY (run_id, seq)
);

-- Events sent with signal(key, payload). Each is delivered to one wait for its
-- key, once: `taken_by` names the run that took it. An event sent before
-- anyone waits is kept until a wait takes it.
CREATE TABLE {schema}.workflow_event (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key        text COLLATE "C" NOT NULL,
    payload    jsonb,
    sent_at    timestamptz NOT NULL DEFAULT now(),
    taken_by   text COLLATE "C",
    taken_seq  integer,
    taken_at   timestamptz
);
CREATE INDEX workflow_event_untaken ON {schema}.workflow_event (key, id) WHERE taken_by IS NULL;

-- signal_v1: its definition and the reasons for it are in shoal/workflow/functions.sql.
CREATE FUNCTION {schema}.signal_v1(p_key text, p_payload jsonb, p_now timestamptz)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_id bigint;
BEGIN
    IF p_key IS NULL OR length(p_key) = 0 OR length(p_key) > 512 THEN
        PERFORM {schema}.invalid_input_v1('key', 'an event key is 1 to 512 characters');
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('shoal.workflow.event:{schema}:' || p_key, 0));
    INSERT INTO {schema}.workflow_event (key, payload, sent_at)
    VALUES (p_key, p_payload, coalesce(p_now, now()))
    RETURNING id INTO v_id;
    PERFORM {schema}.wake_jobs_v1(array_agg(r.wake_job), p_now)
    FROM {schema}.workflow_run r
    WHERE r.wait_key = p_key AND r.status = 'waiting' AND r.wake_job IS NOT NULL;
    RETURN v_id;
END;
$$;

-- signal: its definition and the reasons for it are in shoal/workflow/functions.sql.
CREATE FUNCTION {schema}.signal(key text, payload jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE sql
AS $$
    SELECT {schema}.signal_v1(key, payload, NULL);
$$;
