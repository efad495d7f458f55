-- Times and durations of the SQL API in a sane range (docs/queue.md,
-- "Ranges"), as shoal.queue.options checks them in Python: durations from 0
-- (expire_in from 1 ms) to 100 years (3155760000 s, 365.25-day years), a
-- start_after time a real timestamp with an explicit offset from 1970-01-01
-- UTC to 100 years from now. Before, 1e308 seconds failed with 22008
-- "interval out of range" naming no option, expire_in 1e-9 with a CHECK
-- violation, and 'infinity', 'tomorrow' or a date alone ('2027-03-01', its
-- "-01" read as an offset) were stored as a start_after: a job that never
-- runs, or one Python could not load.
--
-- send_v2 is send_v1 of 0011_sql_api.sql with those checks; send() points at
-- it (its stable name; send_v1 stays, unchanged, for the previous release).
-- Valid options give the same job as before: the checks only refuse.

-- A duration option in seconds, as shoal.queue.options._duration checks it.
-- Compared as numeric: 1e400 is valid JSON but no float8 (22003 before the
-- option was named). Returns the same float8 as option_seconds_v1.
CREATE FUNCTION {schema}.option_seconds_v2(p_name text, p_value jsonb, p_allow_zero boolean)
RETURNS float8
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_seconds numeric;
BEGIN
    IF jsonb_typeof(p_value) IS DISTINCT FROM 'number' THEN
        PERFORM {schema}.invalid_input_v1(p_name, 'expected a timedelta or seconds, got '
            || {schema}.value_text_v1(p_value));
    END IF;
    v_seconds := p_value::text::numeric;
    IF v_seconds < 0 OR (NOT p_allow_zero AND v_seconds = 0) THEN
        PERFORM {schema}.invalid_input_v1(p_name, format('must be %s, got %s',
            CASE WHEN p_allow_zero THEN '>= 0' ELSE '> 0' END, {schema}.value_text_v1(p_value)));
    END IF;
    -- The shortest execution timeout (MIN_EXPIRE_IN): an interval counts
    -- microseconds, so a shorter one could round to none (a CHECK violation).
    IF NOT p_allow_zero AND v_seconds < 0.001 THEN
        PERFORM {schema}.invalid_input_v1(p_name, 'must be at least 0.001 seconds, got '
            || {schema}.value_text_v1(p_value));
    END IF;
    IF v_seconds > 3155760000 THEN
        PERFORM {schema}.invalid_input_v1(p_name, 'must be at most 3155760000 seconds '
            || '(100 years), got ' || {schema}.value_text_v1(p_value));
    END IF;
    RETURN v_seconds::float8;
END;
$$;

-- The time a send's start_after option names: seconds from now, or (JSON
-- having no datetime) an ISO 8601 timestamp with a date, a time and its
-- offset, as Python takes a timezone-aware datetime; now() for null.
-- The text is matched whole before it is cast: the cast alone takes
-- 'infinity', 'now', 'tomorrow', a date without a time, and a time with no
-- offset (in the session's time zone). Years have four digits, and the time
-- must lie from 1970-01-01 UTC to 100 years from now, as in Python.
CREATE FUNCTION {schema}.option_start_after_v1(p_value jsonb)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_text text;
    v_at timestamptz;
BEGIN
    IF jsonb_typeof(p_value) = 'null' THEN
        RETURN now();
    ELSIF jsonb_typeof(p_value) <> 'string' THEN
        RETURN now() + {schema}.option_seconds_v2('start_after', p_value, true)
            * interval '1 second';
    END IF;
    v_text := p_value #>> '{{}}';
    IF v_text !~ ('^[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}[T ][0-9]{{2}}:[0-9]{{2}}'
                  '(:[0-9]{{2}}([.][0-9]{{1,9}})?)?(Z|z|[+-][0-9]{{2}}(:?[0-9]{{2}})?)?$') THEN
        PERFORM {schema}.invalid_input_v1('start_after', 'expected an ISO 8601 timestamp with '
            || 'a date, a time and an offset (2027-03-01T09:00:00+00:00) or seconds, got '
            || {schema}.value_text_v1(p_value));
    END IF;
    IF v_text !~ '(Z|z|[+-][0-9]{{2}}(:?[0-9]{{2}})?)$' THEN
        PERFORM {schema}.invalid_input_v1('start_after', 'a datetime must be timezone-aware');
    END IF;
    BEGIN
        v_at := v_text::timestamptz;
    EXCEPTION WHEN data_exception THEN  -- 2027-02-30, 25:00, an offset of +99
        PERFORM {schema}.invalid_input_v1('start_after', 'expected a timestamp with its '
            || 'time zone or seconds, got ' || {schema}.value_text_v1(p_value));
    END;
    IF v_at < '1970-01-01 00:00:00+00' OR v_at > now() + interval '3155760000 seconds' THEN
        PERFORM {schema}.invalid_input_v1('start_after', 'must be from '
            || '1970-01-01T00:00:00+00:00 to 100 years from now, got '
            || {schema}.value_text_v1(p_value));
    END IF;
    RETURN v_at;
END;
$$;

-- Sends one job from SQL: send_v1 (0011_sql_api.sql) with the ranges above.
CREATE FUNCTION {schema}.send_v2(p_queue text, p_data jsonb, p_options jsonb)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_known text[] := ARRAY['cost', 'dead_letter', 'expire_in', 'partition_key', 'priority',
                            'retry_backoff', 'retry_delay', 'retry_delay_max', 'retry_limit',
                            'singleton_key', 'start_after'];
    v_options jsonb := coalesce(p_options, '{{}}'::jsonb);
    v_data jsonb := coalesce(p_data, 'null'::jsonb);
    v_key text;
    v_value jsonb;
    v_hint text;
    v_default {schema}.queue_default;
    v_limit {schema}.queue_limit;
    v_partition_key text;
    v_cost integer;
    v_priority integer;
    v_retry_limit integer;
    v_retry_delay_s float8;
    v_retry_backoff boolean;
    v_retry_delay_max_s float8;
    v_expire_in_s float8;
    v_dead_letter text;
    v_singleton_key text;
    v_start_after timestamptz := now();
    v_size integer;
    v_id bigint;
BEGIN
    PERFORM {schema}.check_queue_name_v1(p_queue, 'queue');
    IF jsonb_typeof(v_options) <> 'object' THEN
        PERFORM {schema}.invalid_input_v1('options', 'must be a JSON object of job options, got '
            || {schema}.value_text_v1(v_options));
    END IF;
    FOR v_key, v_value IN SELECT key, value FROM jsonb_each(v_options) LOOP
        IF NOT v_key = ANY(v_known) THEN
            v_hint := CASE v_key
                WHEN 'retryLimit' THEN 'retry_limit' WHEN 'retryDelay' THEN 'retry_delay'
                WHEN 'retryBackoff' THEN 'retry_backoff' WHEN 'expireInSeconds' THEN 'expire_in'
                WHEN 'expireInMinutes' THEN 'expire_in' WHEN 'singletonKey' THEN 'singleton_key'
                WHEN 'startAfter' THEN 'start_after' WHEN 'deadLetter' THEN 'dead_letter'
            END;
            PERFORM {schema}.invalid_input_v1(v_key, 'unknown job option' || CASE
                WHEN v_hint IS NOT NULL THEN format('; did you mean ''%s''?', v_hint)
                ELSE '; known: ' || array_to_string(v_known, ', ') END);
        ELSIF v_key = 'retry_limit' THEN
            v_retry_limit := {schema}.option_integer_v1(v_value, 0, 2147483647);
            IF v_retry_limit IS NULL THEN
                -- Too big for the column: the range, as Python says it.
                PERFORM {schema}.invalid_input_v1(v_key, CASE
                    WHEN jsonb_typeof(v_value) = 'number' AND v_value::text ~ '^[0-9]+$'
                    THEN 'must be an integer from 0 to 2147483647, got '
                    ELSE 'must be an integer >= 0, got ' END
                    || {schema}.value_text_v1(v_value));
            END IF;
        ELSIF v_key = 'retry_delay' THEN
            v_retry_delay_s := {schema}.option_seconds_v2(v_key, v_value, true);
        ELSIF v_key = 'retry_delay_max' THEN
            v_retry_delay_max_s := {schema}.option_seconds_v2(v_key, v_value, true);
        ELSIF v_key = 'expire_in' THEN
            v_expire_in_s := {schema}.option_seconds_v2(v_key, v_value, false);
        ELSIF v_key = 'retry_backoff' THEN
            IF jsonb_typeof(v_value) <> 'boolean' THEN
                PERFORM {schema}.invalid_input_v1(v_key, 'must be true or false, got '
                    || {schema}.value_text_v1(v_value));
            END IF;
            v_retry_backoff := v_value::text::boolean;
        ELSIF v_key = 'singleton_key' THEN
            IF jsonb_typeof(v_value) <> 'null' THEN
                v_singleton_key := v_value #>> '{{}}';
                IF jsonb_typeof(v_value) <> 'string' OR v_singleton_key = ''
                   OR length(v_singleton_key) > 512 THEN
                    PERFORM {schema}.invalid_input_v1(v_key,
                        'must be a non-empty string of at most 512 characters');
                END IF;
            END IF;
        ELSIF v_key = 'start_after' THEN
            v_start_after := {schema}.option_start_after_v1(v_value);
        ELSIF v_key = 'priority' THEN
            v_priority := {schema}.option_integer_v1(v_value, -1000000, 1000000);
            IF v_priority IS NULL THEN
                PERFORM {schema}.invalid_input_v1(v_key, 'must be an integer within ±1000000, got '
                    || {schema}.value_text_v1(v_value));
            END IF;
        ELSIF v_key = 'cost' THEN
            v_cost := {schema}.option_integer_v1(v_value, 1, 2147483647);
            IF v_cost IS NULL THEN
                PERFORM {schema}.invalid_input_v1(v_key, 'must be an integer from 1 to '
                    || '2147483647, got ' || {schema}.value_text_v1(v_value));
            END IF;
        ELSIF v_key = 'partition_key' THEN
            -- A string or an integer, as shoal.queue.limits.partition_key_of
            -- takes it (the type named as Python names the decoded value).
            IF jsonb_typeof(v_value) = 'string'
               OR (jsonb_typeof(v_value) = 'number' AND v_value::text ~ '^-?[0-9]+$') THEN
                v_partition_key := v_value #>> '{{}}';
                IF length(v_partition_key) > 512 THEN
                    PERFORM {schema}.invalid_input_v1(v_key,
                        'must be at most 512 characters, without NUL');
                END IF;
            ELSIF jsonb_typeof(v_value) <> 'null' THEN
                PERFORM {schema}.invalid_input_v1(v_key,
                    'a partition key must be a string or an integer, got '
                    || CASE jsonb_typeof(v_value) WHEN 'boolean' THEN 'bool'
                            WHEN 'number' THEN 'float' WHEN 'array' THEN 'list'
                            ELSE 'dict' END);
            END IF;
        ELSIF v_key = 'dead_letter' THEN
            IF jsonb_typeof(v_value) <> 'null' THEN
                IF jsonb_typeof(v_value) <> 'string' THEN
                    PERFORM {schema}.invalid_input_v1(v_key, {schema}.value_text_v1(v_value)
                        || ' is not a valid queue name: 1-128 letters, digits, ''_'', ''.'', '
                        || '''-'' or ''/'', starting with a letter or digit');
                END IF;
                v_dead_letter := {schema}.check_queue_name_v1(v_value #>> '{{}}', v_key);
            END IF;
        END IF;
    END LOOP;
    v_size := octet_length(v_data::text);
    IF v_size > 8192 THEN
        PERFORM {schema}.invalid_input_v1('data', format('payload is %s bytes, over the '
            '8192-byte cap; send ids and load the documents in the handler', v_size));
    END IF;

    SELECT * INTO v_default FROM {schema}.queue_default d WHERE d.queue = p_queue;
    -- A limited queue's job gets its partition key as insert_jobs gives it:
    -- '' when the queue is not partitioned, else the one sent, else its
    -- data's partition field, else ''.
    SELECT * INTO v_limit FROM {schema}.queue_limit l WHERE l.queue = p_queue;
    IF v_limit.queue IS NOT NULL THEN
        v_partition_key := CASE WHEN v_limit.partition_by IS NULL THEN ''
            ELSE coalesce(v_partition_key, v_data ->> v_limit.partition_field, '') END;
    END IF;
    INSERT INTO {schema}.job (
        queue, data, priority, retry_limit, retry_delay, retry_backoff, retry_delay_max,
        expire_in, singleton_key, dead_letter, start_after, created_at, partition_key, cost)
    VALUES (
        p_queue, v_data,
        CASE WHEN v_options ? 'priority' THEN v_priority
             ELSE coalesce(v_default.priority, 0) END,
        CASE WHEN v_options ? 'retry_limit' THEN v_retry_limit
             ELSE coalesce(v_default.retry_limit, 2) END,
        CASE WHEN v_options ? 'retry_delay' THEN v_retry_delay_s * interval '1 second'
             ELSE coalesce(v_default.retry_delay, interval '0') END,
        CASE WHEN v_options ? 'retry_backoff' THEN v_retry_backoff
             ELSE coalesce(v_default.retry_backoff, false) END,
        CASE WHEN v_options ? 'retry_delay_max' THEN v_retry_delay_max_s * interval '1 second'
             ELSE coalesce(v_default.retry_delay_max, interval '1 hour') END,
        CASE WHEN v_options ? 'expire_in' THEN v_expire_in_s * interval '1 second'
             ELSE coalesce(v_default.expire_in, interval '15 minutes') END,
        v_singleton_key,
        CASE WHEN v_options ? 'dead_letter' THEN v_dead_letter ELSE v_default.dead_letter END,
        v_start_after, now(), v_partition_key, coalesce(v_cost, 1))
    ON CONFLICT DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NOT NULL AND v_start_after <= now() THEN
        -- The schema's channel, as the Python clients name it ("<schema>_jobs").
        PERFORM pg_notify(n.nspname || '_jobs', p_queue)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.oid = '{schema}.job'::regclass;
    END IF;
    RETURN v_id;
END;
$$;

-- The SQL API's stable name, now sending through send_v2.
CREATE OR REPLACE FUNCTION {schema}.send(queue text, data jsonb DEFAULT NULL, options jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE sql
AS $$
    SELECT {schema}.send_v2(queue, data, options);
$$;

-- A stored time as the readers load it (list_jobs, get_job, ...; NULL
-- stays NULL): within
-- what Python's datetime holds in any session time zone. A row written
-- before 0029 may hold 'infinity', '-infinity' or a year past 9999, which
-- psycopg cannot load (DataError: every job list and `shoal jobs` failed);
-- such a time reads as 9999-12-31T00:00:00+00:00 (or 0001-01-02, for the
-- past), a day inside Python's limits, so a session offset of up to a day
-- cannot carry it past them. Valid times (before 100 years from now) are
-- never changed.
CREATE FUNCTION {schema}.readable_time_v1(p_at timestamptz)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE
AS $$
    -- Not least(greatest(...)): those skip a NULL (a job with no lease).
    SELECT CASE WHEN p_at > '9999-12-31 00:00:00+00' THEN '9999-12-31 00:00:00+00'
                WHEN p_at < '0001-01-02 00:00:00+00' THEN '0001-01-02 00:00:00+00'
                ELSE p_at END;
$$;
