-- create_task_v2: create_task_v1 (0012_batch_sql_api.sql) whose item jobs
-- are written by insert_item_jobs_v2 (0030_item_jobs_under_limits.sql), and
-- create_task() pointed at it.
--
-- Why. A batch kind may now declare limits (global_concurrency, rate_limit),
-- which its queue's limited claim enforces, and that claim sees only jobs
-- with a partition key (docs/limits.md). Batches.create writes its item jobs
-- through v2, which gives them their key; create_task_v1, through v1, left
-- them without one, so a task created from SQL could have items start
-- uncounted by a concurrency limit until maintenance stamped their keys
-- (about a minute). Everything else is v1's, word for word; v1 stays for the
-- previous release's callers.
CREATE FUNCTION {schema}.create_task_v2(p_kind text, p_items jsonb, p_options jsonb)
RETURNS uuid
LANGUAGE plpgsql
-- A concurrent create with the same key holds the unique index entry until
-- it commits: wait for it this long, then answer "still being created".
-- The setting is the function's alone, restored when it returns.
SET lock_timeout = '5s'
AS $$
DECLARE
    v_known text[] := ARRAY['deadline', 'idempotency_key', 'params'];
    v_options jsonb := coalesce(p_options, '{{}}'::jsonb);
    v_kind {schema}.batch_kind;
    v_key text;
    v_value jsonb;
    v_idempotency_key text;
    v_deadline_s float8;
    v_params jsonb;
    v_total integer;
    v_dup bigint;
    v_entry jsonb;
    v_ord bigint;
    v_ref jsonb;
    v_data jsonb;
    v_unknown text;
    v_size integer;
    v_hash text;
    v_task uuid;
    v_existing record;
BEGIN
    SELECT * INTO v_kind FROM {schema}.batch_kind k WHERE k.kind = p_kind;
    IF NOT FOUND THEN
        PERFORM {schema}.invalid_input_v1('kind', format('unknown batch kind %s; known: %s',
            {schema}.value_text_v1(to_jsonb(p_kind)),
            coalesce((SELECT string_agg(k.kind, ', ' ORDER BY k.kind)
                      FROM {schema}.batch_kind k), 'none registered')));
    END IF;
    IF jsonb_typeof(v_options) <> 'object' THEN
        PERFORM {schema}.invalid_input_v1('options', 'must be a JSON object of task options, got '
            || {schema}.value_text_v1(v_options));
    END IF;
    FOR v_key IN SELECT key FROM jsonb_each(v_options) ORDER BY key LOOP
        IF NOT v_key = ANY(v_known) THEN
            PERFORM {schema}.invalid_input_v1(v_key, 'unknown task option; known: '
                || array_to_string(v_known, ', '));
        END IF;
    END LOOP;

    -- In the order of Batches.create: idempotency key, deadline, items, params.
    v_value := v_options -> 'idempotency_key';
    IF jsonb_typeof(v_value) IS DISTINCT FROM 'null' AND v_value IS NOT NULL THEN
        v_idempotency_key := v_value #>> '{{}}';
        IF jsonb_typeof(v_value) <> 'string' OR v_idempotency_key = ''
           OR length(v_idempotency_key) > 255 THEN
            PERFORM {schema}.invalid_input_v1('idempotency_key',
                'must be a non-empty string of at most 255 characters');
        END IF;
    END IF;
    v_value := v_options -> 'deadline';
    IF jsonb_typeof(v_value) IS DISTINCT FROM 'null' AND v_value IS NOT NULL THEN
        IF jsonb_typeof(v_value) <> 'number' THEN
            PERFORM {schema}.invalid_input_v1('deadline_s', 'must be a number of seconds, got '
                || {schema}.value_text_v1(v_value));
        END IF;
        -- Compared as numeric first: 1e400 is valid JSON but no float8.
        IF v_value::text::numeric <= 0 OR v_value::text::numeric > 10 * 365 * 86400 THEN
            PERFORM {schema}.invalid_input_v1('deadline_s',
                'must be a positive number of seconds, got ' || {schema}.value_text_v1(v_value));
        END IF;
        v_deadline_s := v_value::text::float8;
    END IF;

    IF jsonb_typeof(p_items) IS DISTINCT FROM 'array' THEN
        PERFORM {schema}.invalid_input_v1('items',
            'must be a list of refs or {{ref, data}} objects');
    END IF;
    v_total := jsonb_array_length(p_items);
    IF v_total = 0 THEN
        PERFORM {schema}.invalid_input_v1('items', 'is empty: a task needs at least one item');
    END IF;
    IF v_total > 100000 THEN
        PERFORM {schema}.invalid_input_v1('items',
            format('has %s entries, over the cap of 100000', v_total));
    END IF;
    -- The first entry whose ref an earlier entry has: Python finds it in its
    -- loop with a set. Found here in one pass, it is reported only when the
    -- loop below reaches it, so an invalid entry before it is reported first,
    -- as Python does (an entry whose ref is no string is invalid where it
    -- stands, so it can only end the loop before it could be a duplicate).
    SELECT min(d.ord) INTO v_dup
    FROM (
        SELECT r.ord, row_number() OVER (PARTITION BY r.ref ORDER BY r.ord) AS n
        FROM (
            SELECT u.ord - 1 AS ord,
                   CASE jsonb_typeof(u.e) WHEN 'string' THEN u.e #>> '{{}}'
                                          WHEN 'object' THEN u.e ->> 'ref' END AS ref
            FROM jsonb_array_elements(p_items) WITH ORDINALITY AS u(e, ord)
        ) r
        WHERE r.ref IS NOT NULL
    ) d
    WHERE d.n = 2;
    FOR v_entry, v_ord IN
        SELECT u.e, u.ord - 1 FROM jsonb_array_elements(p_items) WITH ORDINALITY AS u(e, ord)
    LOOP
        IF jsonb_typeof(v_entry) = 'object' THEN
            SELECT '[' || string_agg({schema}.value_text_v1(to_jsonb(k)), ', '
                                     ORDER BY k COLLATE "C") || ']'
            INTO v_unknown
            FROM jsonb_object_keys(v_entry) AS k
            WHERE k NOT IN ('ref', 'data');
            IF v_unknown IS NOT NULL THEN
                PERFORM {schema}.invalid_input_v1(format('items[%s]', v_ord),
                    'unknown field(s) ' || v_unknown);
            END IF;
            v_data := v_entry -> 'data';
            IF jsonb_typeof(v_data) <> 'null' THEN
                v_size := octet_length(v_data::text);
                IF v_size > 8192 THEN
                    PERFORM {schema}.invalid_input_v1(format('items[%s].data', v_ord), format(
                        'payload is %s bytes, over the 8192-byte cap; send ids and load the '
                        'documents in the handler', v_size));
                END IF;
            END IF;
            v_ref := coalesce(v_entry -> 'ref', 'null'::jsonb);
        ELSE
            v_ref := v_entry;
        END IF;
        IF jsonb_typeof(v_ref) <> 'string' OR (v_ref #>> '{{}}') = ''
           OR length(v_ref #>> '{{}}') > 512 THEN
            PERFORM {schema}.invalid_input_v1(format('items[%s].ref', v_ord),
                'must be a non-empty string of at most 512 characters without NUL, got '
                || left({schema}.value_text_v1(v_ref), 80));
        END IF;
        IF v_ord = v_dup THEN
            PERFORM {schema}.invalid_input_v1(format('items[%s].ref', v_ord),
                'duplicate ref ' || {schema}.value_text_v1(v_ref));
        END IF;
    END LOOP;

    v_params := coalesce(v_options -> 'params', 'null'::jsonb);
    v_size := octet_length(v_params::text);
    IF v_size > 8192 THEN
        PERFORM {schema}.invalid_input_v1('params', format('payload is %s bytes, over the '
            '8192-byte cap; send ids and load the documents in the handler', v_size));
    END IF;

    -- The request's fingerprint: "a" and {{"ref": "a", "data": null}} are the
    -- same item, as in Python.
    SELECT 'sql1:' || encode(sha256(convert_to(jsonb_build_array(
               p_kind, v_params, v_deadline_s,
               jsonb_agg(jsonb_build_array(
                   CASE jsonb_typeof(u.e) WHEN 'string' THEN u.e #>> '{{}}' ELSE u.e ->> 'ref' END,
                   CASE jsonb_typeof(u.e) WHEN 'object' THEN coalesce(u.e -> 'data', 'null')
                                          ELSE 'null' END)
                   ORDER BY u.ord))::text, 'UTF8')), 'hex')
    INTO v_hash
    FROM jsonb_array_elements(p_items) WITH ORDINALITY AS u(e, ord);

    BEGIN
        INSERT INTO {schema}.task (
            kind, idempotency_key, request_hash, params, total, max_attempts, zombie_timeout,
            deadline_at, item_queue, job_options, on_complete_queue, created_at)
        VALUES (
            p_kind, v_idempotency_key, v_hash, v_params, v_total, v_kind.max_attempts,
            v_kind.zombie_timeout, now() + v_deadline_s * interval '1 second',
            v_kind.item_queue, v_kind.job_options, v_kind.on_complete_queue, now())
        ON CONFLICT (idempotency_key) DO NOTHING
        RETURNING id INTO v_task;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'idempotency_key %: an identical request is still being created; '
            'retry shortly', {schema}.value_text_v1(to_jsonb(v_idempotency_key))
            USING ERRCODE = '55P03', COLUMN = 'idempotency_key';
    END;
    IF v_task IS NULL THEN
        SELECT t.id, t.request_hash INTO v_existing
        FROM {schema}.task t WHERE t.idempotency_key = v_idempotency_key;
        IF v_existing.request_hash IS DISTINCT FROM v_hash THEN
            RAISE EXCEPTION 'idempotency_key % was used for a different request (task %)',
                {schema}.value_text_v1(to_jsonb(v_idempotency_key)), v_existing.id
                USING ERRCODE = '23505', COLUMN = 'idempotency_key';
        END IF;
        RETURN v_existing.id;
    END IF;

    -- The items in input order and one job each, as the insert_items query
    -- of shoal/batch/queries.sql writes them.
    WITH items AS (
        INSERT INTO {schema}.item (task_id, ref, data, updated_at)
        SELECT v_task,
               CASE jsonb_typeof(u.e) WHEN 'string' THEN u.e #>> '{{}}' ELSE u.e ->> 'ref' END,
               CASE jsonb_typeof(u.e) WHEN 'object' THEN coalesce(u.e -> 'data', 'null')
                                      ELSE 'null' END,
               now()
        FROM jsonb_array_elements(p_items) WITH ORDINALITY AS u(e, ord)
        ORDER BY u.ord
        RETURNING id
    )
    SELECT {schema}.insert_item_jobs_v2(
        ARRAY(SELECT id FROM items ORDER BY id),
        ARRAY(SELECT 'item-' || id || ':0' FROM items ORDER BY id),
        v_kind.item_queue,
        coalesce((v_kind.job_options ->> 'priority')::integer, 0),
        coalesce((v_kind.job_options ->> 'retry_limit')::integer, 2),
        coalesce((v_kind.job_options ->> 'retry_delay')::float8, 0),
        coalesce((v_kind.job_options ->> 'retry_backoff')::boolean, false),
        coalesce((v_kind.job_options ->> 'retry_delay_max')::float8, 3600),
        coalesce((v_kind.job_options ->> 'expire_in')::float8, 900),
        v_kind.job_options ->> 'dead_letter', NULL, NULL, NULL)
    INTO v_size;
    -- The schema's channel, as the Python clients name it ("<schema>_jobs").
    PERFORM pg_notify(n.nspname || '_jobs', v_kind.item_queue)
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = '{schema}.task'::regclass;
    RETURN v_task;
END;
$$;

CREATE OR REPLACE FUNCTION {schema}.create_task(kind text, items jsonb, options jsonb DEFAULT NULL)
RETURNS uuid
LANGUAGE sql
AS $$
    SELECT {schema}.create_task_v2(kind, items, options);
$$;
