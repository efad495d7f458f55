-- job_item_turn (0005_batch_fairness.sql) on the job table that
-- 0019_job_columns_that_change_last.sql built again: the same index, by the
-- same name, so the item claim (lock_item_jobs_v1) walks it as before.
CREATE INDEX job_item_turn ON {schema}.job
    (queue, priority DESC, (data -> 'turn') NULLS FIRST, id)
    WHERE state IN ('created', 'retry') AND data ? 'item';
