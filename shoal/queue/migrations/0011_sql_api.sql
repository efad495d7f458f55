-- Queue defaults and the SQL API (docs/queue.md, "Sending from SQL").
--
-- queue_default: a queue's default job options, written by a worker's start
-- for each `App.handler(..., retry_limit=...)` (or by set_queue_defaults),
-- read by every insert: an option a send does not name takes the queue's
-- default, so the defaults hold wherever a job is sent from (another
-- process, a synchronous client, SQL). NULL: no default for that option.
CREATE TABLE {schema}.queue_default (
    queue            text COLLATE "C" PRIMARY KEY CHECK (length(queue) BETWEEN 1 AND 128),
    priority         integer,
    retry_limit      integer CHECK (retry_limit >= 0),
    retry_delay      interval CHECK (retry_delay >= interval '0'),
    retry_backoff    boolean,
    retry_delay_max  interval CHECK (retry_delay_max >= interval '0'),
    expire_in        interval CHECK (expire_in > interval '0'),
    dead_letter      text COLLATE "C",
    updated_at       timestamptz NOT NULL
);

-- A JSON value as Python's repr() shows the same value, so the SQL API's
-- errors read exactly as the Python API's ("got -1", "got 'x'", "got True").
CREATE FUNCTION {schema}.value_text_v1(p_value jsonb)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE jsonb_typeof(p_value)
        WHEN 'string' THEN '''' || (p_value #>> '{{}}') || ''''
        WHEN 'boolean' THEN CASE WHEN p_value::text = 'true' THEN 'True' ELSE 'False' END
        WHEN 'null' THEN 'None'
        ELSE coalesce(p_value::text, 'None')
    END;
$$;

-- Raises the error of shoal's InvalidInput: "<field>: <message>", SQLSTATE
-- 22023 (invalid_parameter_value), the field also in the error's column.
CREATE FUNCTION {schema}.invalid_input_v1(p_field text, p_message text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION '%: %', p_field, p_message USING ERRCODE = '22023', COLUMN = p_field;
END;
$$;

-- A queue name as shoal.queue.options.check_queue_name accepts it.
CREATE FUNCTION {schema}.check_queue_name_v1(p_name text, p_field text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_name IS NULL OR p_name !~ '^[A-Za-z0-9][A-Za-z0-9_./-]{{0,127}}$' THEN
        PERFORM {schema}.invalid_input_v1(p_field, format(
            '%s is not a valid queue name: 1-128 letters, digits, ''_'', ''.'', ''-'' or ''/'', '
            'starting with a letter or digit',
            CASE WHEN p_name IS NULL THEN 'None' ELSE '''' || p_name || '''' END));
    END IF;
    RETURN p_name;
END;
$$;

-- A duration option in seconds, as shoal.queue.options._duration checks it.
CREATE FUNCTION {schema}.option_seconds_v1(p_name text, p_value jsonb, p_allow_zero boolean)
RETURNS float8
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_seconds float8;
BEGIN
    IF jsonb_typeof(p_value) IS DISTINCT FROM 'number' THEN
        PERFORM {schema}.invalid_input_v1(p_name, 'expected a timedelta or seconds, got '
            || {schema}.value_text_v1(p_value));
    END IF;
    v_seconds := p_value::text::float8;
    IF v_seconds < 0 OR (NOT p_allow_zero AND v_seconds = 0) THEN
        PERFORM {schema}.invalid_input_v1(p_name, format('must be %s, got %s',
            CASE WHEN p_allow_zero THEN '>= 0' ELSE '> 0' END, {schema}.value_text_v1(p_value)));
    END IF;
    RETURN v_seconds;
END;
$$;

-- An integer option: a JSON number written without fraction or exponent
-- (Python's parse_options refuses 3.0 and true as integers too).
CREATE FUNCTION {schema}.option_integer_v1(p_value jsonb, p_min bigint, p_max bigint)
RETURNS integer
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    -- Separate statements: each cast runs only once the test before it passed.
    IF jsonb_typeof(p_value) IS DISTINCT FROM 'number'
       OR p_value::text !~ '^-?[0-9]{{1,18}}$' THEN
        RETURN NULL;
    END IF;
    IF p_value::text::bigint NOT BETWEEN p_min AND p_max THEN
        RETURN NULL;
    END IF;
    RETURN p_value::text::integer;
END;
$$;

-- Sends one job from SQL, in the caller's transaction: what Shoal.send does
-- (same checks, same messages, same defaults: the send's options, then the
-- queue's stored defaults, then shoal's), except that the payload cap is
-- the default 8 KiB measured on jsonb's text. Returns the job id, or NULL
-- when an unfinished job of the queue holds its singleton key. Workers are
-- woken when the caller commits.
CREATE FUNCTION {schema}.send_v1(p_queue text, p_data jsonb, p_options jsonb)
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
                PERFORM {schema}.invalid_input_v1(v_key, 'must be an integer >= 0, got '
                    || {schema}.value_text_v1(v_value));
            END IF;
        ELSIF v_key = 'retry_delay' THEN
            v_retry_delay_s := {schema}.option_seconds_v1(v_key, v_value, true);
        ELSIF v_key = 'retry_delay_max' THEN
            v_retry_delay_max_s := {schema}.option_seconds_v1(v_key, v_value, true);
        ELSIF v_key = 'expire_in' THEN
            v_expire_in_s := {schema}.option_seconds_v1(v_key, v_value, false);
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
            -- Seconds from now, or (JSON having no datetime) an ISO timestamp
            -- with its offset, as Python takes a timezone-aware datetime.
            IF jsonb_typeof(v_value) = 'string' THEN
                IF (v_value #>> '{{}}') !~ '(Z|z|[+-][0-9]{{2}}(:?[0-9]{{2}})?)$' THEN
                    PERFORM {schema}.invalid_input_v1(v_key, 'a datetime must be timezone-aware');
                END IF;
                BEGIN
                    v_start_after := (v_value #>> '{{}}')::timestamptz;
                EXCEPTION WHEN data_exception THEN
                    PERFORM {schema}.invalid_input_v1(v_key, 'expected a timestamp with its '
                        || 'time zone or seconds, got ' || {schema}.value_text_v1(v_value));
                END;
            ELSIF jsonb_typeof(v_value) <> 'null' THEN
                v_start_after := now()
                    + {schema}.option_seconds_v1(v_key, v_value, true) * interval '1 second';
            END IF;
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

-- The SQL API's stable name: `SELECT shoal.send('queue', '{{"id": 1}}'::jsonb,
-- '{{"retry_limit": 3}}'::jsonb)`. Unlike the versioned functions shoal's code
-- calls, it keeps its name across releases; a release that changes what a
-- send does adds send_v2 and points this at it.
CREATE FUNCTION {schema}.send(queue text, data jsonb DEFAULT NULL, options jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE sql
AS $$
    SELECT {schema}.send_v1(queue, data, options);
$$;
