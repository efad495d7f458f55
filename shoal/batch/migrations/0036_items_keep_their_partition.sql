-- Items keep their partition key: a batch kind can be partitioned.
--
-- Why. A kind's limits (global_concurrency, rate_limit) were counted for the
-- whole kind: partition_by was refused, because an item's key would come
-- from the item's data, which its jobs do not carry (their data is the
-- item's id), and a job sent again for an item (after a reap, an orphan
-- sweep, a retry-failed, a hand-back at shutdown) had nothing to key it by.
-- Now each item is keyed once, when its task is created (where its data is
-- at hand, and the kind's partition_by function if it has one), and keeps
-- its key on its row (item.partition_key); every job of the item is sent
-- with it (insert_item_jobs_v3 in 0035, or the queue's insert with the key
-- given), so a retried, rescued or re-sent item stays in its partition.
--
-- item.partition_key: the key the item named itself, else the one its kind's
-- partition_by gave it ('' for data without the field); NULL when its kind
-- was not partitioned and it named none. A nullable column without a
-- default: adding it rewrites nothing, and an item without a key stores
-- nothing more.
ALTER TABLE {schema}.item ADD COLUMN partition_key text COLLATE "C";

-- How a kind is partitioned, stored with its other settings for creators
-- without its code (SyncBatches, create_task()): by a field of the item's
-- data (read by them), or by a function (named here; only a process with
-- the kind's code can run it, so they take only items that name their key).
ALTER TABLE {schema}.batch_kind
    ADD COLUMN partition_field text,
    ADD COLUMN partition_function text,
    ADD CONSTRAINT batch_kind_partitioned_once
        CHECK (partition_field IS NULL OR partition_function IS NULL);

-- create_task_v3: create_task_v2 (0032_create_task_under_limits.sql) whose
-- items may name their partition key (an entry {{"ref", "data", "partition_key"}}),
-- are keyed as above, and have their jobs written by insert_item_jobs_v3
-- with those keys; create_task() is pointed at it. A request whose items
-- name no key has the fingerprint v2 gave it. v2 stays for the previous
-- release's callers.
CREATE FUNCTION {schema}.create_task_v3(p_kind text, p_items jsonb, p_options jsonb)
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
    v_partition jsonb;
    v_unkeyed bigint;
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
            WHERE k NOT IN ('ref', 'data', 'partition_key');
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
        -- A string or an integer, as shoal.queue.limits.partition_key_of
        -- takes it (the type named as Python names the decoded value); null
        -- is no key.
        v_partition := CASE jsonb_typeof(v_entry) WHEN 'object'
                            THEN coalesce(v_entry -> 'partition_key', 'null') ELSE 'null' END;
        IF jsonb_typeof(v_partition) = 'string'
           OR (jsonb_typeof(v_partition) = 'number' AND v_partition::text ~ '^-?[0-9]+$') THEN
            IF length(v_partition #>> '{{}}') > 512 THEN
                PERFORM {schema}.invalid_input_v1(format('items[%s].partition_key', v_ord),
                    'must be at most 512 characters, without NUL');
            END IF;
        ELSIF jsonb_typeof(v_partition) <> 'null' THEN
            PERFORM {schema}.invalid_input_v1(format('items[%s].partition_key', v_ord),
                'a partition key must be a string or an integer, got '
                || CASE jsonb_typeof(v_partition) WHEN 'boolean' THEN 'bool'
                        WHEN 'number' THEN 'float' WHEN 'array' THEN 'list'
                        ELSE 'dict' END);
        END IF;
    END LOOP;
    -- A kind partitioned by a function: only a process with the kind's code
    -- can key an item that names no key of its own, as CreatePlan says.
    IF v_kind.partition_function IS NOT NULL THEN
        SELECT min(u.ord) - 1 INTO v_unkeyed
        FROM jsonb_array_elements(p_items) WITH ORDINALITY AS u(e, ord)
        WHERE jsonb_typeof(u.e) <> 'object'
           OR jsonb_typeof(u.e -> 'partition_key') IS NULL
           OR jsonb_typeof(u.e -> 'partition_key') = 'null';
        IF v_unkeyed IS NOT NULL THEN
            PERFORM {schema}.invalid_input_v1(format('items[%s].partition_key', v_unkeyed),
                format('batch kind %s is partitioned by %s, which runs only in a process with '
                       'the kind''s code (Batches of its App); give each item a partition_key',
                       {schema}.value_text_v1(to_jsonb(p_kind)), v_kind.partition_function));
        END IF;
    END IF;

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
                   -- An item's key, when it names one, is part of the request;
                   -- one without a key is fingerprinted as create_task_v2 did.
                   || CASE WHEN jsonb_typeof(u.e -> 'partition_key') IN ('string', 'number')
                           THEN jsonb_build_array(u.e ->> 'partition_key')
                           ELSE '[]'::jsonb END
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
    -- of shoal/batch/queries.sql writes them: each item keyed by its own
    -- partition_key, else by its kind's partition field ('' when its data
    -- has none), else not at all (its kind is not partitioned).
    WITH items AS (
        INSERT INTO {schema}.item (task_id, ref, data, partition_key, updated_at)
        SELECT v_task,
               CASE jsonb_typeof(u.e) WHEN 'string' THEN u.e #>> '{{}}' ELSE u.e ->> 'ref' END,
               CASE jsonb_typeof(u.e) WHEN 'object' THEN coalesce(u.e -> 'data', 'null')
                                      ELSE 'null' END,
               CASE WHEN jsonb_typeof(u.e -> 'partition_key') IN ('string', 'number')
                    THEN u.e ->> 'partition_key'
                    WHEN v_kind.partition_field IS NOT NULL
                    THEN coalesce(u.e -> 'data' ->> v_kind.partition_field, '') END,
               now()
        FROM jsonb_array_elements(p_items) WITH ORDINALITY AS u(e, ord)
        ORDER BY u.ord
        RETURNING id, partition_key
    )
    SELECT {schema}.insert_item_jobs_v3(
        ARRAY(SELECT id FROM items ORDER BY id),
        ARRAY(SELECT 'item-' || id || ':0' FROM items ORDER BY id),
        ARRAY(SELECT partition_key FROM items ORDER BY id),
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
    SELECT {schema}.create_task_v3(kind, items, options);
$$;
