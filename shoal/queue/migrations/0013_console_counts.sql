-- The console over a big job table (bench/console_bench.py: 1,000,000 jobs).
-- Retrying jobs per queue through an index of their own, as failed ones have
-- one (job_failed_queue, 0009_console.sql): with job_claim (created and retry)
-- and job_lease (active), every unfinished state is then counted from an
-- index, without reading the table, by the queues page and by each history
-- sample (both read the whole table before: 250 ms and 450 ms at 1,000,000
-- jobs). Partial, so only a job that failed and waits for its retry costs an
-- entry: inserts, claims and completions write nothing to it.
CREATE INDEX job_retry_queue ON {schema}.job (queue) WHERE state = 'retry';
