-- claim_messages (0004_ingest_lease.sql) returns the queue's job row type,
-- so it would hold the job table in place while the next migration
-- (0019_job_columns_that_change_last.sql) builds that table again. Dropped
-- here and created again, unchanged, by 0021, for the workers of the release
-- whose schema ended at migration 3.
DROP FUNCTION {schema}.claim_messages(text, integer, timestamptz, interval);
