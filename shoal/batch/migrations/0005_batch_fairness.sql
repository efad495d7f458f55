-- Level 2, revised claim: item jobs are taken without ever waiting for a lock.
--
-- Lock order, for every statement that touches items and jobs: job rows
-- first, then item rows, and only the claim holds a job row while it locks an
-- item. The claim (claim_items below) locks waiting jobs with SKIP LOCKED and
-- then their items with SKIP LOCKED: it never waits, so it cannot be part of
-- a cycle of waits. Every other writer locks item rows (the worker's
-- fail_item and hand_back_items, the aggregator's reap_zombies and
-- sweep_orphans, cancel, retry-failed) and then at most inserts NEW jobs for
-- those items; an insert waits on a job row only when an uncommitted job
-- holds the same singleton key, and only a claim taking that very job can be
-- uncommitted with it, and a claim never waits. (0002's claim_items waited for
-- item rows while holding the jobs it had taken: with the old sweep, which
-- re-sent jobs for items whose job was still waiting, that was a deadlock.)

-- True while a worker's handler runs the item's current run: set by the
-- worker a moment after the handler starts (marks of many items share one
-- statement; a handler done sooner is never marked), cleared when it ends.
-- The guard (claim) leaves it false: a running item without it is claimed
-- and waiting in its worker's buffer, or finished with its result not yet
-- recorded. Progress counts only marked items as running, so a kind's
-- concurrency bounds what users see running in one worker; the others are
-- shown as pending (waiting for a handler).
ALTER TABLE {schema}.item ADD COLUMN in_handler boolean NOT NULL DEFAULT false;

-- The phantom guard of 0002_batch.sql, for jobs a worker did not claim
-- through claim_items; it also leaves the new run unmarked.
CREATE OR REPLACE FUNCTION {schema}.guard_items(p_ids bigint[], p_now timestamptz)
RETURNS TABLE (
    id bigint, attempt integer, run integer, ref text, data jsonb, task_id uuid, kind text,
    params jsonb, max_attempts integer)
LANGUAGE sql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
    UPDATE {schema}.item i
    SET status = 'running',
        attempt = i.attempt + 1,
        in_handler = false,
        started_at = coalesce(p_now, now()),
        updated_at = coalesce(p_now, now())
    FROM {schema}.task t
    WHERE i.id = ANY(p_ids) AND i.status = 'pending' AND t.id = i.task_id
    RETURNING i.id, i.attempt, i.attempt - i.attempt_base, i.ref, i.data, i.task_id, t.kind,
              t.params, t.max_attempts;
$$;

-- Fairness between the tasks of a kind: item jobs are claimed in turns, not
-- in the order they were sent. Each job of a new task carries a turn, its
-- position in the task counted from the queue's current turn (item_turn), so
-- tasks that share a kind are served round-robin, one item of each per turn:
-- a 10-item task created while a 100,000-item task runs is claimed within the
-- next claim, not after the big task's queued items. Jobs without a turn
-- (a retry, a re-dispatch after a reap, a sweep or a hand-back, and jobs sent
-- before this migration) come first, so a retry starts within its backoff
-- plus one claim whatever the queue holds. Delayed jobs at the head (retries
-- in backoff) are passed over by each claim, one index entry each.
CREATE INDEX job_item_turn ON {schema}.job
    (queue, priority DESC, (data->'turn') NULLS FIRST, id)
    WHERE state IN ('created', 'retry') AND data ? 'item';

-- The queue's current turn: that of the first due item job with a turn (0
-- when there is none). A new task's items take the turns after it.
CREATE FUNCTION {schema}.item_turn(p_queue text, p_now timestamptz)
RETURNS bigint
LANGUAGE sql
STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
    SELECT coalesce((
        SELECT (j.data->>'turn')::bigint
        FROM {schema}.job j
        WHERE j.queue = p_queue
          AND j.state IN ('created', 'retry')
          AND j.data ? 'item'
          AND j.data ? 'turn'
          AND j.start_after <= coalesce(p_now, now())
        ORDER BY j.priority DESC, (j.data->'turn') NULLS FIRST, j.id
        LIMIT 1), 0);
$$;

-- A worker's claim of item jobs, with the guard of their items, in one
-- statement (see 0002_batch.sql for the row shapes, unchanged). Unlike 0002's,
-- it walks job_item_turn (jobs without a turn, then by turn: see above), and
-- it locks the items of the jobs it picked with SKIP LOCKED and takes only
-- the jobs whose items it holds: a job whose item another transaction holds
-- for a moment stays waiting for the next claim instead of making this one
-- wait. (So does a job naming no item, which shoal never sends: items are
-- never deleted.)
CREATE OR REPLACE FUNCTION {schema}.claim_items(p_queue text, p_limit integer, p_now timestamptz)
RETURNS TABLE (
    job_id bigint, queue text, job_data text, priority integer, job_attempt integer,
    retry_limit integer, retry_delay_s float8, retry_backoff boolean, retry_delay_max_s float8,
    expire_in_s float8, singleton_key text, dead_letter text, created_at timestamptz,
    started_at timestamptz, lease_expires_at timestamptz,
    item_id bigint, fence integer, run integer, ref text, data text, task_id text, kind text,
    params text, max_attempts integer)
LANGUAGE sql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
    -- As take_jobs: the claim need not wait for its WAL flush (lost to a
    -- server crash, the take and the guard are both undone).
    SELECT set_config('synchronous_commit', 'off', true);
    WITH next AS (
        SELECT j.id, (j.data->>'item')::bigint AS item_id
        FROM {schema}.job j
        WHERE j.queue = p_queue
          AND j.state IN ('created', 'retry')
          AND j.data ? 'item'
          AND j.start_after <= coalesce(p_now, now())
          AND NOT EXISTS (SELECT 1 FROM {schema}.paused_queue p WHERE p.queue = p_queue)
        ORDER BY j.priority DESC, (j.data->'turn') NULLS FIRST, j.id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), held AS (
        -- The lock the guard's update takes, taken here without waiting: a
        -- job whose item is locked drops out of the join. Each item is
        -- reached by one primary-key probe per job (no comparison of every
        -- job with every item: the planner switches rule out hashing).
        SELECT n.id, n.item_id
        FROM next n
        JOIN {schema}.item i ON i.id = n.item_id
        FOR NO KEY UPDATE OF i SKIP LOCKED
    ), taken AS (
        UPDATE {schema}.job j
        SET state = 'completed',
            attempt = j.attempt + 1,
            started_at = coalesce(p_now, now()),
            finished_at = coalesce(p_now, now())
        FROM held n
        WHERE j.id = n.id
        RETURNING j.id, j.queue, j.data, j.priority, j.attempt, j.retry_limit, j.retry_delay,
                  j.retry_backoff, j.retry_delay_max, j.expire_in, j.singleton_key,
                  j.dead_letter, j.created_at, j.started_at, n.item_id
    ), guarded AS (
        UPDATE {schema}.item i
        SET status = 'running',
            attempt = i.attempt + 1,
            in_handler = false,
            started_at = coalesce(p_now, now()),
            updated_at = coalesce(p_now, now())
        FROM {schema}.task t
        WHERE i.id = ANY(ARRAY(SELECT c.item_id FROM taken c)) AND i.status = 'pending'
          AND t.id = i.task_id
        RETURNING i.id, i.attempt, i.attempt - i.attempt_base AS run, i.ref, i.data, i.task_id,
                  t.kind, t.params, t.max_attempts
    )
    SELECT c.id, c.queue, c.data::text, c.priority, c.attempt, c.retry_limit,
           extract(epoch FROM c.retry_delay)::float8, c.retry_backoff,
           extract(epoch FROM c.retry_delay_max)::float8, extract(epoch FROM c.expire_in)::float8,
           c.singleton_key, c.dead_letter, c.created_at, c.started_at, NULL::timestamptz,
           c.item_id, NULL::integer, NULL::integer, NULL::text, NULL::text, NULL::text,
           NULL::text, NULL::text, NULL::integer
    FROM taken c
    UNION ALL
    SELECT NULL::bigint, NULL::text, NULL::text, NULL::integer, NULL::integer, NULL::integer,
           NULL::float8, NULL::boolean, NULL::float8, NULL::float8, NULL::text, NULL::text,
           NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
           g.id, g.attempt, g.run, g.ref, g.data::text, g.task_id::text, g.kind, g.params::text,
           g.max_attempts
    FROM guarded g;
$$;
