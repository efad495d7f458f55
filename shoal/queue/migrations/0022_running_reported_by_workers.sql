-- The jobs each registered worker process runs now, per queue, as its
-- heartbeat reports them: a JSON object of queue -> jobs running.
--
-- Why. The history sampler counted a queue's running jobs through job_lease
-- every 10 s. That index keeps an entry for every job that was ever active
-- until vacuum removes it, and the count must check each entry of a job that
-- finished since the last sample against the table once: about 0.25 µs a
-- job, 48 ms of a 90 ms sample during a drain of 20,000 jobs/s, and as a share
-- of the server's work per job it does not shrink with a longer interval.
-- Read from here, running is what the worker processes say they run, as in
-- the Workers page, at the cost of one row per process.
ALTER TABLE {schema}.worker
    ADD COLUMN running_by_queue jsonb NOT NULL DEFAULT '{{}}'
        CHECK (jsonb_typeof(running_by_queue) = 'object');
