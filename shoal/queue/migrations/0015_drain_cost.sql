-- complete_jobs_v1 with a plan that stays one primary-key probe per job.
--
-- v1's fence says `j.state = 'active'`, which is job_lease's predicate: with
-- statistics taken while no job was active (a queue analyzed between bursts,
-- or when it filled up), the planner estimated one active row and made a scan
-- of job_lease the outer side of a nested loop, with the unnested ids as the
-- inner side re-read for every active job and matched by a join filter. A
-- completion then cost (active jobs) x (jobs in the batch): 300 completions
-- with 300 jobs active took 88 ms of server time instead of about 3, and a
-- fast drain spent most of its time there (bench/queue_bench.py,
-- docs/benchmarks.md).
--
-- v2 leaves the planner one way to do it, whatever the statistics say: the
-- jobs are found by the primary key (`j.id = ANY(p_ids)`, one probe per id)
-- and matched to their attempts and outputs by a hash join, so a completion
-- costs what its own batch holds, never (active jobs) x (batch). The fence
-- reads `lease_expires_at IS NOT NULL`, which the table's CHECK
-- active_has_lease makes the same as state = 'active' (an active job has a
-- lease and no other job has one) but which implies no partial index's
-- predicate, so job_lease is no way in. Nested loops are switched off: with
-- an underestimated side, a loop re-reads the other side for each row.
-- Same arguments, same result, same write as v1.
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

-- Room on each page for a job's next version. A claim and a completion each
-- write a new row version (state is in the partial indexes' predicates, so
-- neither can be a HOT update). On a full page the new version goes to
-- another page, and the update then logs the old row locked, references two
-- pages and the whole new row: at fillfactor 100 a drained job cost 912
-- bytes of WAL, the raw loop's 591 (pg_waldump, 300 jobs claimed and
-- completed). With half of each page left free at insert, the new version
-- stays on its page (the dead one before it is pruned when the page is next
-- read) and logs only the bytes that changed: 749 bytes. The price is space
-- for waiting jobs: twice the pages a backlog would take full. Only rows
-- written from now on are placed this way; the lock is SHARE UPDATE
-- EXCLUSIVE, which workers' reads and writes do not wait for.
ALTER TABLE {schema}.job SET (fillfactor = 50);
