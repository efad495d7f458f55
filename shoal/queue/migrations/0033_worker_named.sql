-- worker_named_v1: a registered worker process by the number its jobs and
-- items record (worker.no, 0031_rescue_jobs_of_silent_workers.sql), as the
-- notes of work handed back name it: "host pid N (app A), worker ID". NULL
-- for no number or a row already dropped. The batch layer's reaper calls it
-- to name the process an item was reaped from: it reaches the registry only
-- through this function, as it reaches jobs only through the queue's.
CREATE FUNCTION {schema}.worker_named_v1(p_no integer)
RETURNS text
LANGUAGE sql
STABLE
AS $$
    SELECT w.host || ' pid ' || w.pid
           || CASE WHEN w.app <> '' THEN ' (app ' || w.app || ')' ELSE '' END
           || ', worker ' || w.id
    FROM {schema}.worker w
    WHERE w.no = p_no;
$$;
