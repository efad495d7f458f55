--
-- PostgreSQL database dump
--

\restrict NSQdiIOgTAtttm26sBqH0LF1SEnmgmMgueDjvoEQ0awXbX7hFF1AD5CrwW1KhAZ

-- Dumped from database version 15.20 (Debian 15.20-0+deb12u1)
-- Dumped by pg_dump version 15.20 (Debian 15.20-0+deb12u1)

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: shoal; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA shoal;


--
-- Name: item_status; Type: TYPE; Schema: shoal; Owner: -
--

CREATE TYPE shoal.item_status AS ENUM (
    'pending',
    'running',
    'completed',
    'error',
    'cancelled'
);


--
-- Name: job_state; Type: TYPE; Schema: shoal; Owner: -
--

CREATE TYPE shoal.job_state AS ENUM (
    'created',
    'retry',
    'active',
    'completed',
    'cancelled',
    'failed'
);


--
-- Name: task_outcome; Type: TYPE; Schema: shoal; Owner: -
--

CREATE TYPE shoal.task_outcome AS ENUM (
    'completed',
    'completed_with_errors',
    'cancelled',
    'timed_out'
);


--
-- Name: task_status; Type: TYPE; Schema: shoal; Owner: -
--

CREATE TYPE shoal.task_status AS ENUM (
    'processing',
    'completed',
    'cancelled'
);


--
-- Name: claim_items(text, integer, timestamp with time zone); Type: FUNCTION; Schema: shoal; Owner: -
--

CREATE FUNCTION shoal.claim_items(p_queue text, p_limit integer, p_now timestamp with time zone) RETURNS TABLE(job_id bigint, queue text, job_data text, priority integer, job_attempt integer, retry_limit integer, retry_delay_s double precision, retry_backoff boolean, retry_delay_max_s double precision, expire_in_s double precision, singleton_key text, dead_letter text, created_at timestamp with time zone, started_at timestamp with time zone, lease_expires_at timestamp with time zone, item_id bigint, fence integer, run integer, ref text, data text, task_id text, kind text, params text, max_attempts integer)
    LANGUAGE sql
    SET enable_seqscan TO 'off'
    SET enable_bitmapscan TO 'off'
    SET enable_sort TO 'off'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    AS $$
    WITH claimed AS (
        SELECT c.id, c.queue, c.data, c.priority, c.attempt, c.retry_limit, c.retry_delay,
               c.retry_backoff, c.retry_delay_max, c.expire_in, c.singleton_key, c.dead_letter,
               c.created_at, c.started_at, c.lease_expires_at,
               (c.data->>'item')::bigint AS item_id
        FROM "shoal".take_jobs(p_queue, p_limit, p_now) AS c
    )
    SELECT c.id, c.queue, c.data::text, c.priority, c.attempt, c.retry_limit,
           extract(epoch FROM c.retry_delay)::float8, c.retry_backoff,
           extract(epoch FROM c.retry_delay_max)::float8, extract(epoch FROM c.expire_in)::float8,
           c.singleton_key, c.dead_letter, c.created_at, c.started_at, c.lease_expires_at,
           c.item_id, NULL::integer, NULL::integer, NULL::text, NULL::text, NULL::text,
           NULL::text, NULL::text, NULL::integer
    FROM claimed c
    UNION ALL
    SELECT NULL::bigint, NULL::text, NULL::text, NULL::integer, NULL::integer, NULL::integer,
           NULL::float8, NULL::boolean, NULL::float8, NULL::float8, NULL::text, NULL::text,
           NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
           g.id, g.attempt, g.run, g.ref, g.data::text, g.task_id::text, g.kind, g.params::text,
           g.max_attempts
    FROM "shoal".guard_items(ARRAY(SELECT c.item_id FROM claimed c), p_now) AS g;
$$;


--
-- Name: job_id_seq; Type: SEQUENCE; Schema: shoal; Owner: -
--

CREATE SEQUENCE shoal.job_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: job; Type: TABLE; Schema: shoal; Owner: -
--

CREATE TABLE shoal.job (
    id bigint DEFAULT nextval('shoal.job_id_seq'::regclass) NOT NULL,
    queue text NOT NULL COLLATE pg_catalog."C",
    state shoal.job_state DEFAULT 'created'::shoal.job_state NOT NULL,
    priority integer DEFAULT 0 NOT NULL,
    data jsonb DEFAULT 'null'::jsonb NOT NULL,
    attempt integer DEFAULT 0 NOT NULL,
    retry_limit integer NOT NULL,
    retry_delay interval NOT NULL,
    retry_backoff boolean NOT NULL,
    retry_delay_max interval NOT NULL,
    expire_in interval NOT NULL,
    singleton_key text COLLATE pg_catalog."C",
    dead_letter text COLLATE pg_catalog."C",
    origin_queue text COLLATE pg_catalog."C",
    origin_id bigint,
    start_after timestamp with time zone NOT NULL,
    created_at timestamp with time zone NOT NULL,
    started_at timestamp with time zone,
    lease_expires_at timestamp with time zone,
    finished_at timestamp with time zone,
    output jsonb,
    errors jsonb DEFAULT '[]'::jsonb NOT NULL,
    CONSTRAINT active_has_lease CHECK (((state = 'active'::shoal.job_state) = (lease_expires_at IS NOT NULL))),
    CONSTRAINT active_was_started CHECK (((state <> 'active'::shoal.job_state) OR (started_at IS NOT NULL))),
    CONSTRAINT finished_has_time CHECK (((state = ANY (ARRAY['completed'::shoal.job_state, 'cancelled'::shoal.job_state, 'failed'::shoal.job_state])) = (finished_at IS NOT NULL))),
    CONSTRAINT job_attempt_check CHECK ((attempt >= 0)),
    CONSTRAINT job_errors_check CHECK ((jsonb_typeof(errors) = 'array'::text)),
    CONSTRAINT job_expire_in_check CHECK ((expire_in > '00:00:00'::interval)),
    CONSTRAINT job_queue_check CHECK (((length(queue) >= 1) AND (length(queue) <= 128))),
    CONSTRAINT job_retry_delay_check CHECK ((retry_delay >= '00:00:00'::interval)),
    CONSTRAINT job_retry_delay_max_check CHECK ((retry_delay_max >= '00:00:00'::interval)),
    CONSTRAINT job_retry_limit_check CHECK ((retry_limit >= 0))
);


--
-- Name: claim_jobs(text, integer, timestamp with time zone); Type: FUNCTION; Schema: shoal; Owner: -
--

CREATE FUNCTION shoal.claim_jobs(p_queue text, p_limit integer, p_now timestamp with time zone) RETURNS SETOF shoal.job
    LANGUAGE sql
    SET enable_seqscan TO 'off'
    SET enable_bitmapscan TO 'off'
    SET enable_sort TO 'off'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    AS $$
    -- The claim need not wait for its WAL flush: a claim lost to a server
    -- crash only puts its jobs back to waiting; their workers' results then
    -- lose the attempt fence and the jobs run again (at-least-once, as for
    -- any crash). A completion is flushed, and with it every earlier claim.
    SELECT set_config('synchronous_commit', 'off', true);
    WITH next AS (
        SELECT id
        FROM "shoal".job
        WHERE queue = p_queue
          AND state IN ('created', 'retry')
          AND start_after <= coalesce(p_now, now())
          AND NOT EXISTS (SELECT 1 FROM "shoal".paused_queue p WHERE p.queue = p_queue)
        ORDER BY priority DESC, id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    )
    UPDATE "shoal".job j
    SET state = 'active',
        attempt = j.attempt + 1,
        started_at = coalesce(p_now, now()),
        lease_expires_at = coalesce(p_now, now()) + j.expire_in
    FROM next
    WHERE j.id = next.id
    RETURNING j.*;
$$;


--
-- Name: complete_items(bigint[], integer[], jsonb[], bigint[], integer[], timestamp with time zone); Type: FUNCTION; Schema: shoal; Owner: -
--

CREATE FUNCTION shoal.complete_items(p_ids bigint[], p_fences integer[], p_results jsonb[], p_job_ids bigint[], p_job_attempts integer[], p_now timestamp with time zone) RETURNS TABLE(what text, id bigint, task_id uuid)
    LANGUAGE sql
    SET enable_seqscan TO 'off'
    SET enable_bitmapscan TO 'off'
    SET enable_sort TO 'off'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    AS $$
    WITH jobs AS (
        SELECT j.id FROM "shoal".complete_jobs(p_job_ids, p_job_attempts, NULL, p_now) AS j
        WHERE cardinality(p_job_ids) > 0
    ), done AS (
        UPDATE "shoal".item i
        SET status = 'completed',
            result = coalesce(u.result, 'null'),
            error = NULL,
            finished_at = coalesce(p_now, now()),
            updated_at = coalesce(p_now, now())
        FROM unnest(p_ids, p_fences, p_results) AS u(id, attempt, result)
        WHERE i.id = u.id AND i.status = 'running' AND i.attempt = u.attempt
        RETURNING i.id, i.task_id
    )
    SELECT 'item', d.id, NULL::uuid FROM done d
    UNION ALL
    SELECT 'job', j.id, NULL FROM jobs j
    UNION ALL
    SELECT 'task', NULL, t.task_id
    FROM (SELECT DISTINCT d.task_id FROM done d) t
    WHERE NOT EXISTS (
        SELECT 1 FROM "shoal".item i
        WHERE i.task_id = t.task_id AND i.status IN ('pending', 'running')
          AND i.id <> ALL(p_ids));
$$;


--
-- Name: complete_jobs(bigint[], integer[], jsonb[], timestamp with time zone); Type: FUNCTION; Schema: shoal; Owner: -
--

CREATE FUNCTION shoal.complete_jobs(p_ids bigint[], p_attempts integer[], p_outputs jsonb[], p_now timestamp with time zone) RETURNS TABLE(id bigint)
    LANGUAGE sql
    SET enable_seqscan TO 'off'
    SET enable_bitmapscan TO 'off'
    SET enable_sort TO 'off'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    AS $$
    UPDATE "shoal".job j
    SET state = 'completed',
        finished_at = coalesce(p_now, now()),
        lease_expires_at = NULL,
        output = u.output
    FROM unnest(p_ids, p_attempts, p_outputs) AS u(id, attempt, output)
    WHERE j.id = u.id AND j.state = 'active' AND j.attempt = u.attempt
    RETURNING j.id;
$$;


--
-- Name: guard_items(bigint[], timestamp with time zone); Type: FUNCTION; Schema: shoal; Owner: -
--

CREATE FUNCTION shoal.guard_items(p_ids bigint[], p_now timestamp with time zone) RETURNS TABLE(id bigint, attempt integer, run integer, ref text, data jsonb, task_id uuid, kind text, params jsonb, max_attempts integer)
    LANGUAGE sql
    SET enable_seqscan TO 'off'
    SET enable_bitmapscan TO 'off'
    SET enable_sort TO 'off'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    AS $$
    UPDATE "shoal".item i
    SET status = 'running',
        attempt = i.attempt + 1,
        started_at = coalesce(p_now, now()),
        updated_at = coalesce(p_now, now())
    FROM "shoal".task t
    WHERE i.id = ANY(p_ids) AND i.status = 'pending' AND t.id = i.task_id
    RETURNING i.id, i.attempt, i.attempt - i.attempt_base, i.ref, i.data, i.task_id, t.kind,
              t.params, t.max_attempts;
$$;


--
-- Name: take_jobs(text, integer, timestamp with time zone); Type: FUNCTION; Schema: shoal; Owner: -
--

CREATE FUNCTION shoal.take_jobs(p_queue text, p_limit integer, p_now timestamp with time zone) RETURNS SETOF shoal.job
    LANGUAGE sql
    SET enable_seqscan TO 'off'
    SET enable_bitmapscan TO 'off'
    SET enable_sort TO 'off'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    AS $$
    SELECT set_config('synchronous_commit', 'off', true);
    WITH next AS (
        SELECT id
        FROM "shoal".job
        WHERE queue = p_queue
          AND state IN ('created', 'retry')
          AND start_after <= coalesce(p_now, now())
          AND NOT EXISTS (SELECT 1 FROM "shoal".paused_queue p WHERE p.queue = p_queue)
        ORDER BY priority DESC, id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    )
    UPDATE "shoal".job j
    SET state = 'completed',
        attempt = j.attempt + 1,
        started_at = coalesce(p_now, now()),
        finished_at = coalesce(p_now, now())
    FROM next
    WHERE j.id = next.id
    RETURNING j.*;
$$;


--
-- Name: config; Type: TABLE; Schema: shoal; Owner: -
--

CREATE TABLE shoal.config (
    key text NOT NULL COLLATE pg_catalog."C",
    value jsonb NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    CONSTRAINT config_key_check CHECK (((length(key) >= 1) AND (length(key) <= 200)))
);


--
-- Name: counter; Type: TABLE; Schema: shoal; Owner: -
--

CREATE TABLE shoal.counter (
    name text NOT NULL,
    value bigint DEFAULT 0 NOT NULL
);


--
-- Name: ingest_dead; Type: TABLE; Schema: shoal; Owner: -
--

CREATE TABLE shoal.ingest_dead (
    id bigint NOT NULL,
    topic text NOT NULL COLLATE pg_catalog."C",
    message_id text NOT NULL COLLATE pg_catalog."C",
    envelope jsonb NOT NULL,
    reason text NOT NULL,
    error text NOT NULL,
    attempt integer NOT NULL,
    dead_at timestamp with time zone NOT NULL,
    redriven_at timestamp with time zone,
    CONSTRAINT ingest_dead_reason_check CHECK ((reason = ANY (ARRAY['poison'::text, 'attempts'::text, 'business'::text])))
);


--
-- Name: ingest_dead_id_seq; Type: SEQUENCE; Schema: shoal; Owner: -
--

ALTER TABLE shoal.ingest_dead ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME shoal.ingest_dead_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: ingest_done; Type: TABLE; Schema: shoal; Owner: -
--

CREATE TABLE shoal.ingest_done (
    message_id text NOT NULL COLLATE pg_catalog."C",
    expires_at timestamp with time zone NOT NULL
);


--
-- Name: ingest_topic; Type: TABLE; Schema: shoal; Owner: -
--

CREATE TABLE shoal.ingest_topic (
    topic text NOT NULL COLLATE pg_catalog."C",
    depth bigint DEFAULT 0 NOT NULL,
    ready bigint DEFAULT 0 NOT NULL,
    in_flight bigint DEFAULT 0 NOT NULL,
    delayed bigint DEFAULT 0 NOT NULL,
    oldest_age_s double precision,
    wait_s double precision,
    paused boolean DEFAULT false NOT NULL,
    checked_at timestamp with time zone,
    last_wait_s double precision,
    last_wait_at timestamp with time zone
);


--
-- Name: item; Type: TABLE; Schema: shoal; Owner: -
--

CREATE TABLE shoal.item (
    id bigint NOT NULL,
    task_id uuid NOT NULL,
    ref text NOT NULL COLLATE pg_catalog."C",
    data jsonb DEFAULT 'null'::jsonb NOT NULL,
    status shoal.item_status DEFAULT 'pending'::shoal.item_status NOT NULL,
    attempt integer DEFAULT 0 NOT NULL,
    attempt_base integer DEFAULT 0 NOT NULL,
    result jsonb,
    error text,
    errors jsonb DEFAULT '[]'::jsonb NOT NULL,
    started_at timestamp with time zone,
    updated_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone,
    CONSTRAINT finished_has_time CHECK (((status = ANY (ARRAY['completed'::shoal.item_status, 'error'::shoal.item_status, 'cancelled'::shoal.item_status])) = (finished_at IS NOT NULL))),
    CONSTRAINT item_attempt_check CHECK ((attempt >= 0)),
    CONSTRAINT item_check CHECK ((attempt_base <= attempt)),
    CONSTRAINT item_errors_check CHECK ((jsonb_typeof(errors) = 'array'::text))
);


--
-- Name: item_id_seq; Type: SEQUENCE; Schema: shoal; Owner: -
--

ALTER TABLE shoal.item ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME shoal.item_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: job_archive; Type: TABLE; Schema: shoal; Owner: -
--

CREATE TABLE shoal.job_archive (
    id bigint NOT NULL,
    queue text NOT NULL COLLATE pg_catalog."C",
    state shoal.job_state NOT NULL,
    priority integer NOT NULL,
    data jsonb NOT NULL,
    attempt integer NOT NULL,
    retry_limit integer NOT NULL,
    retry_delay interval NOT NULL,
    retry_backoff boolean NOT NULL,
    retry_delay_max interval NOT NULL,
    expire_in interval NOT NULL,
    singleton_key text COLLATE pg_catalog."C",
    dead_letter text COLLATE pg_catalog."C",
    origin_queue text COLLATE pg_catalog."C",
    origin_id bigint,
    start_after timestamp with time zone NOT NULL,
    created_at timestamp with time zone NOT NULL,
    started_at timestamp with time zone,
    lease_expires_at timestamp with time zone,
    finished_at timestamp with time zone,
    output jsonb,
    errors jsonb NOT NULL,
    archived_at timestamp with time zone NOT NULL
);


--
-- Name: migration; Type: TABLE; Schema: shoal; Owner: -
--

CREATE TABLE shoal.migration (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL,
    checksum text
);


--
-- Name: paused_queue; Type: TABLE; Schema: shoal; Owner: -
--

CREATE TABLE shoal.paused_queue (
    queue text NOT NULL COLLATE pg_catalog."C",
    paused_at timestamp with time zone NOT NULL
);


--
-- Name: schedule; Type: TABLE; Schema: shoal; Owner: -
--

CREATE TABLE shoal.schedule (
    name text NOT NULL COLLATE pg_catalog."C",
    queue text NOT NULL COLLATE pg_catalog."C",
    cron text NOT NULL,
    timezone text DEFAULT 'UTC'::text NOT NULL,
    data jsonb DEFAULT 'null'::jsonb NOT NULL,
    options jsonb DEFAULT '{}'::jsonb NOT NULL,
    last_tick timestamp with time zone NOT NULL,
    created_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    CONSTRAINT schedule_name_check CHECK ((name ~ '^[A-Za-z0-9][A-Za-z0-9_.\-/]{0,127}$'::text))
);


--
-- Name: task; Type: TABLE; Schema: shoal; Owner: -
--

CREATE TABLE shoal.task (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    kind text NOT NULL COLLATE pg_catalog."C",
    status shoal.task_status DEFAULT 'processing'::shoal.task_status NOT NULL,
    outcome shoal.task_outcome,
    idempotency_key text COLLATE pg_catalog."C",
    request_hash text NOT NULL,
    params jsonb DEFAULT 'null'::jsonb NOT NULL,
    total integer NOT NULL,
    max_attempts integer NOT NULL,
    zombie_timeout interval NOT NULL,
    deadline_at timestamp with time zone,
    cancel_reason shoal.task_outcome,
    cancel_requested_at timestamp with time zone,
    item_queue text NOT NULL COLLATE pg_catalog."C",
    job_options jsonb DEFAULT '{}'::jsonb NOT NULL,
    on_complete_queue text COLLATE pg_catalog."C",
    created_at timestamp with time zone NOT NULL,
    completed_at timestamp with time zone,
    last_item_at timestamp with time zone,
    CONSTRAINT cancel_has_time CHECK (((cancel_reason IS NULL) = (cancel_requested_at IS NULL))),
    CONSTRAINT cancelled_outcome CHECK (((status <> 'cancelled'::shoal.task_status) OR (outcome = ANY (ARRAY['cancelled'::shoal.task_outcome, 'timed_out'::shoal.task_outcome])))),
    CONSTRAINT closed_has_outcome CHECK (((status = 'processing'::shoal.task_status) = (outcome IS NULL))),
    CONSTRAINT closed_has_time CHECK (((status = 'processing'::shoal.task_status) = (completed_at IS NULL))),
    CONSTRAINT task_cancel_reason_check CHECK ((cancel_reason = ANY (ARRAY['cancelled'::shoal.task_outcome, 'timed_out'::shoal.task_outcome]))),
    CONSTRAINT task_max_attempts_check CHECK ((max_attempts > 0)),
    CONSTRAINT task_total_check CHECK ((total > 0)),
    CONSTRAINT task_zombie_timeout_check CHECK ((zombie_timeout > '00:00:00'::interval))
);


--
-- Data for Name: config; Type: TABLE DATA; Schema: shoal; Owner: -
--



--
-- Data for Name: counter; Type: TABLE DATA; Schema: shoal; Owner: -
--



--
-- Data for Name: ingest_dead; Type: TABLE DATA; Schema: shoal; Owner: -
--



--
-- Data for Name: ingest_done; Type: TABLE DATA; Schema: shoal; Owner: -
--



--
-- Data for Name: ingest_topic; Type: TABLE DATA; Schema: shoal; Owner: -
--



--
-- Data for Name: item; Type: TABLE DATA; Schema: shoal; Owner: -
--

INSERT INTO shoal.item OVERRIDING SYSTEM VALUE VALUES (4, 'b7cfa19b-4b2f-4050-b2a7-00e8a5240819', 'item-3', 'null', 'pending', 0, 0, NULL, NULL, '[]', NULL, '2026-11-30 12:00:00+00', NULL);
INSERT INTO shoal.item OVERRIDING SYSTEM VALUE VALUES (5, 'b7cfa19b-4b2f-4050-b2a7-00e8a5240819', 'item-4', 'null', 'pending', 0, 0, NULL, NULL, '[]', NULL, '2026-11-30 12:00:00+00', NULL);
INSERT INTO shoal.item OVERRIDING SYSTEM VALUE VALUES (6, 'b7cfa19b-4b2f-4050-b2a7-00e8a5240819', 'item-5', 'null', 'pending', 0, 0, NULL, NULL, '[]', NULL, '2026-11-30 12:00:00+00', NULL);
INSERT INTO shoal.item OVERRIDING SYSTEM VALUE VALUES (7, 'b7cfa19b-4b2f-4050-b2a7-00e8a5240819', 'item-6', 'null', 'pending', 0, 0, NULL, NULL, '[]', NULL, '2026-11-30 12:00:00+00', NULL);
INSERT INTO shoal.item OVERRIDING SYSTEM VALUE VALUES (8, 'b7cfa19b-4b2f-4050-b2a7-00e8a5240819', 'item-7', 'null', 'pending', 0, 0, NULL, NULL, '[]', NULL, '2026-11-30 12:00:00+00', NULL);
INSERT INTO shoal.item OVERRIDING SYSTEM VALUE VALUES (1, 'b7cfa19b-4b2f-4050-b2a7-00e8a5240819', 'item-0', 'null', 'running', 1, 0, NULL, NULL, '[]', '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', NULL);
INSERT INTO shoal.item OVERRIDING SYSTEM VALUE VALUES (2, 'b7cfa19b-4b2f-4050-b2a7-00e8a5240819', 'item-1', 'null', 'running', 1, 0, NULL, NULL, '[]', '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', NULL);
INSERT INTO shoal.item OVERRIDING SYSTEM VALUE VALUES (3, 'b7cfa19b-4b2f-4050-b2a7-00e8a5240819', 'item-2', 'null', 'running', 1, 0, NULL, NULL, '[]', '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', NULL);


--
-- Data for Name: job; Type: TABLE DATA; Schema: shoal; Owner: -
--

INSERT INTO shoal.job VALUES (6, 'upgrade.jobs', 'created', 0, '{"n": 5}', 0, 2, '00:01:00', false, '01:00:00', '00:00:30', NULL, NULL, NULL, NULL, '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', NULL, NULL, NULL, NULL, '[]');
INSERT INTO shoal.job VALUES (7, 'upgrade.jobs', 'created', 0, '{"n": 6}', 0, 2, '00:01:00', false, '01:00:00', '00:00:30', NULL, NULL, NULL, NULL, '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', NULL, NULL, NULL, NULL, '[]');
INSERT INTO shoal.job VALUES (8, 'upgrade.jobs', 'created', 0, '{"n": 7}', 0, 2, '00:01:00', false, '01:00:00', '00:00:30', NULL, NULL, NULL, NULL, '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', NULL, NULL, NULL, NULL, '[]');
INSERT INTO shoal.job VALUES (9, 'upgrade.jobs', 'created', 0, '{"n": 8}', 0, 2, '00:01:00', false, '01:00:00', '00:00:30', NULL, NULL, NULL, NULL, '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', NULL, NULL, NULL, NULL, '[]');
INSERT INTO shoal.job VALUES (10, 'upgrade.jobs', 'created', 0, '{"n": 9}', 0, 2, '00:01:00', false, '01:00:00', '00:00:30', NULL, NULL, NULL, NULL, '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', NULL, NULL, NULL, NULL, '[]');
INSERT INTO shoal.job VALUES (1, 'upgrade.jobs', 'active', 0, '{"n": 0}', 1, 2, '00:01:00', false, '01:00:00', '00:00:30', NULL, NULL, NULL, NULL, '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', '2026-11-30 12:00:30+00', NULL, NULL, '[]');
INSERT INTO shoal.job VALUES (2, 'upgrade.jobs', 'active', 0, '{"n": 1}', 1, 2, '00:01:00', false, '01:00:00', '00:00:30', NULL, NULL, NULL, NULL, '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', '2026-11-30 12:00:30+00', NULL, NULL, '[]');
INSERT INTO shoal.job VALUES (3, 'upgrade.jobs', 'active', 0, '{"n": 2}', 1, 2, '00:01:00', false, '01:00:00', '00:00:30', NULL, NULL, NULL, NULL, '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', '2026-11-30 12:00:30+00', NULL, NULL, '[]');
INSERT INTO shoal.job VALUES (4, 'upgrade.jobs', 'retry', 0, '{"n": 3}', 1, 2, '00:01:00', false, '01:00:00', '00:00:30', NULL, NULL, NULL, NULL, '2026-11-30 12:01:00+00', '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', NULL, NULL, NULL, '[{"at": "2026-11-30T12:00:00+00:00", "type": "RuntimeError", "attempt": 1, "message": "the worker of the previous release failed it", "traceback": "RuntimeError: the worker of the previous release failed it\n"}]');
INSERT INTO shoal.job VALUES (5, 'upgrade.jobs', 'retry', 0, '{"n": 4}', 1, 2, '00:01:00', false, '01:00:00', '00:00:30', NULL, NULL, NULL, NULL, '2026-11-30 12:01:00+00', '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', NULL, NULL, NULL, '[{"at": "2026-11-30T12:00:00+00:00", "type": "RuntimeError", "attempt": 1, "message": "the worker of the previous release failed it", "traceback": "RuntimeError: the worker of the previous release failed it\n"}]');
INSERT INTO shoal.job VALUES (14, 'batch.upgrade.items', 'created', 0, '{"item": 4}', 0, 3, '00:00:01', true, '01:00:00', '00:30:00', 'item-4:0', NULL, NULL, NULL, '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', NULL, NULL, NULL, NULL, '[]');
INSERT INTO shoal.job VALUES (15, 'batch.upgrade.items', 'created', 0, '{"item": 5}', 0, 3, '00:00:01', true, '01:00:00', '00:30:00', 'item-5:0', NULL, NULL, NULL, '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', NULL, NULL, NULL, NULL, '[]');
INSERT INTO shoal.job VALUES (16, 'batch.upgrade.items', 'created', 0, '{"item": 6}', 0, 3, '00:00:01', true, '01:00:00', '00:30:00', 'item-6:0', NULL, NULL, NULL, '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', NULL, NULL, NULL, NULL, '[]');
INSERT INTO shoal.job VALUES (17, 'batch.upgrade.items', 'created', 0, '{"item": 7}', 0, 3, '00:00:01', true, '01:00:00', '00:30:00', 'item-7:0', NULL, NULL, NULL, '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', NULL, NULL, NULL, NULL, '[]');
INSERT INTO shoal.job VALUES (18, 'batch.upgrade.items', 'created', 0, '{"item": 8}', 0, 3, '00:00:01', true, '01:00:00', '00:30:00', 'item-8:0', NULL, NULL, NULL, '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', NULL, NULL, NULL, NULL, '[]');
INSERT INTO shoal.job VALUES (11, 'batch.upgrade.items', 'completed', 0, '{"item": 1}', 1, 3, '00:00:01', true, '01:00:00', '00:30:00', 'item-1:0', NULL, NULL, NULL, '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', NULL, '2026-11-30 12:00:00+00', NULL, '[]');
INSERT INTO shoal.job VALUES (12, 'batch.upgrade.items', 'completed', 0, '{"item": 2}', 1, 3, '00:00:01', true, '01:00:00', '00:30:00', 'item-2:0', NULL, NULL, NULL, '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', NULL, '2026-11-30 12:00:00+00', NULL, '[]');
INSERT INTO shoal.job VALUES (13, 'batch.upgrade.items', 'completed', 0, '{"item": 3}', 1, 3, '00:00:01', true, '01:00:00', '00:30:00', 'item-3:0', NULL, NULL, NULL, '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', NULL, '2026-11-30 12:00:00+00', NULL, '[]');
INSERT INTO shoal.job VALUES (21, 'topic.upgrade.readings', 'created', 0, '{"id": "m-2", "body": {"reading": 2}, "published_at": "2026-11-30T12:00:00+00:00"}', 0, 2147483647, '00:00:00', false, '01:00:00', '00:05:00', NULL, NULL, NULL, NULL, '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', NULL, NULL, NULL, NULL, '[]');
INSERT INTO shoal.job VALUES (22, 'topic.upgrade.readings', 'created', 0, '{"id": "m-3", "body": {"reading": 3}, "published_at": "2026-11-30T12:00:00+00:00"}', 0, 2147483647, '00:00:00', false, '01:00:00', '00:05:00', NULL, NULL, NULL, NULL, '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', NULL, NULL, NULL, NULL, '[]');
INSERT INTO shoal.job VALUES (23, 'topic.upgrade.readings', 'created', 0, '{"id": "m-4", "body": {"reading": 4}, "published_at": "2026-11-30T12:00:00+00:00"}', 0, 2147483647, '00:00:00', false, '01:00:00', '00:05:00', NULL, NULL, NULL, NULL, '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', NULL, NULL, NULL, NULL, '[]');
INSERT INTO shoal.job VALUES (24, 'topic.upgrade.readings', 'created', 0, '{"id": "m-5", "body": {"reading": 5}, "published_at": "2026-11-30T12:00:00+00:00"}', 0, 2147483647, '00:00:00', false, '01:00:00', '00:05:00', NULL, NULL, NULL, NULL, '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', NULL, NULL, NULL, NULL, '[]');
INSERT INTO shoal.job VALUES (19, 'topic.upgrade.readings', 'active', 0, '{"id": "m-0", "body": {"reading": 0}, "published_at": "2026-11-30T12:00:00+00:00"}', 1, 2147483647, '00:00:00', false, '01:00:00', '00:05:00', NULL, NULL, NULL, NULL, '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', '2026-11-30 12:05:00+00', NULL, NULL, '[]');
INSERT INTO shoal.job VALUES (20, 'topic.upgrade.readings', 'active', 0, '{"id": "m-1", "body": {"reading": 1}, "published_at": "2026-11-30T12:00:00+00:00"}', 1, 2147483647, '00:00:00', false, '01:00:00', '00:05:00', NULL, NULL, NULL, NULL, '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', '2026-11-30 12:00:00+00', '2026-11-30 12:05:00+00', NULL, NULL, '[]');


--
-- Data for Name: job_archive; Type: TABLE DATA; Schema: shoal; Owner: -
--



--
-- Data for Name: migration; Type: TABLE DATA; Schema: shoal; Owner: -
--

INSERT INTO shoal.migration VALUES (1, 'queue', '2026-12-01 07:10:12.466896+00', '1a503f06de36659f45d67faaf4ebcaae9ede86cb1d628aeb5bef6cc64df7f4d0');
INSERT INTO shoal.migration VALUES (2, 'batch', '2026-12-01 07:10:12.466896+00', '6d19acc4b82a37a358e177d98dd0b689a161c0794fe911907d42ea8ef881bb20');
INSERT INTO shoal.migration VALUES (3, 'ingest', '2026-12-01 07:10:12.466896+00', 'bbc0dd054baf6ce2ca769bd4dc0d9f959614541a13564f9c00018324c7338d96');


--
-- Data for Name: paused_queue; Type: TABLE DATA; Schema: shoal; Owner: -
--



--
-- Data for Name: schedule; Type: TABLE DATA; Schema: shoal; Owner: -
--



--
-- Data for Name: task; Type: TABLE DATA; Schema: shoal; Owner: -
--

INSERT INTO shoal.task VALUES ('b7cfa19b-4b2f-4050-b2a7-00e8a5240819', 'upgrade.items', 'processing', NULL, NULL, 'c493c3a45ec19a59da9ed688960e04929f2fa8848ca7ca671953bf620ae258f5', 'null', 8, 4, '00:01:00', NULL, NULL, NULL, 'batch.upgrade.items', '{"priority": 0, "expire_in": 1800.0, "retry_delay": 1.0, "retry_limit": 3, "retry_backoff": true}', NULL, '2026-11-30 12:00:00+00', NULL, NULL);


--
-- Name: ingest_dead_id_seq; Type: SEQUENCE SET; Schema: shoal; Owner: -
--

SELECT pg_catalog.setval('shoal.ingest_dead_id_seq', 1, false);


--
-- Name: item_id_seq; Type: SEQUENCE SET; Schema: shoal; Owner: -
--

SELECT pg_catalog.setval('shoal.item_id_seq', 8, true);


--
-- Name: job_id_seq; Type: SEQUENCE SET; Schema: shoal; Owner: -
--

SELECT pg_catalog.setval('shoal.job_id_seq', 24, true);


--
-- Name: config config_pkey; Type: CONSTRAINT; Schema: shoal; Owner: -
--

ALTER TABLE ONLY shoal.config
    ADD CONSTRAINT config_pkey PRIMARY KEY (key);


--
-- Name: counter counter_pkey; Type: CONSTRAINT; Schema: shoal; Owner: -
--

ALTER TABLE ONLY shoal.counter
    ADD CONSTRAINT counter_pkey PRIMARY KEY (name);


--
-- Name: ingest_dead ingest_dead_pkey; Type: CONSTRAINT; Schema: shoal; Owner: -
--

ALTER TABLE ONLY shoal.ingest_dead
    ADD CONSTRAINT ingest_dead_pkey PRIMARY KEY (id);


--
-- Name: ingest_done ingest_done_pkey; Type: CONSTRAINT; Schema: shoal; Owner: -
--

ALTER TABLE ONLY shoal.ingest_done
    ADD CONSTRAINT ingest_done_pkey PRIMARY KEY (message_id);


--
-- Name: ingest_topic ingest_topic_pkey; Type: CONSTRAINT; Schema: shoal; Owner: -
--

ALTER TABLE ONLY shoal.ingest_topic
    ADD CONSTRAINT ingest_topic_pkey PRIMARY KEY (topic);


--
-- Name: item item_pkey; Type: CONSTRAINT; Schema: shoal; Owner: -
--

ALTER TABLE ONLY shoal.item
    ADD CONSTRAINT item_pkey PRIMARY KEY (id);


--
-- Name: job job_pkey; Type: CONSTRAINT; Schema: shoal; Owner: -
--

ALTER TABLE ONLY shoal.job
    ADD CONSTRAINT job_pkey PRIMARY KEY (id);


--
-- Name: migration migration_pkey; Type: CONSTRAINT; Schema: shoal; Owner: -
--

ALTER TABLE ONLY shoal.migration
    ADD CONSTRAINT migration_pkey PRIMARY KEY (version);


--
-- Name: paused_queue paused_queue_pkey; Type: CONSTRAINT; Schema: shoal; Owner: -
--

ALTER TABLE ONLY shoal.paused_queue
    ADD CONSTRAINT paused_queue_pkey PRIMARY KEY (queue);


--
-- Name: schedule schedule_pkey; Type: CONSTRAINT; Schema: shoal; Owner: -
--

ALTER TABLE ONLY shoal.schedule
    ADD CONSTRAINT schedule_pkey PRIMARY KEY (name);


--
-- Name: task task_idempotency_key_key; Type: CONSTRAINT; Schema: shoal; Owner: -
--

ALTER TABLE ONLY shoal.task
    ADD CONSTRAINT task_idempotency_key_key UNIQUE (idempotency_key);


--
-- Name: task task_pkey; Type: CONSTRAINT; Schema: shoal; Owner: -
--

ALTER TABLE ONLY shoal.task
    ADD CONSTRAINT task_pkey PRIMARY KEY (id);


--
-- Name: ingest_dead_waiting; Type: INDEX; Schema: shoal; Owner: -
--

CREATE INDEX ingest_dead_waiting ON shoal.ingest_dead USING btree (topic, id) WHERE (redriven_at IS NULL);


--
-- Name: ingest_done_expires; Type: INDEX; Schema: shoal; Owner: -
--

CREATE INDEX ingest_done_expires ON shoal.ingest_done USING btree (expires_at);


--
-- Name: item_task_status; Type: INDEX; Schema: shoal; Owner: -
--

CREATE INDEX item_task_status ON shoal.item USING btree (task_id, status, id);


--
-- Name: job_archive_archived_at; Type: INDEX; Schema: shoal; Owner: -
--

CREATE INDEX job_archive_archived_at ON shoal.job_archive USING btree (archived_at);


--
-- Name: job_archive_id; Type: INDEX; Schema: shoal; Owner: -
--

CREATE INDEX job_archive_id ON shoal.job_archive USING btree (id);


--
-- Name: job_claim; Type: INDEX; Schema: shoal; Owner: -
--

CREATE INDEX job_claim ON shoal.job USING btree (queue, priority DESC, id) WHERE (state = ANY (ARRAY['created'::shoal.job_state, 'retry'::shoal.job_state]));


--
-- Name: job_finished; Type: INDEX; Schema: shoal; Owner: -
--

CREATE INDEX job_finished ON shoal.job USING btree (finished_at) WHERE (state = ANY (ARRAY['completed'::shoal.job_state, 'cancelled'::shoal.job_state, 'failed'::shoal.job_state]));


--
-- Name: job_lease; Type: INDEX; Schema: shoal; Owner: -
--

CREATE INDEX job_lease ON shoal.job USING btree (lease_expires_at) WHERE (state = 'active'::shoal.job_state);


--
-- Name: job_singleton; Type: INDEX; Schema: shoal; Owner: -
--

CREATE UNIQUE INDEX job_singleton ON shoal.job USING btree (queue, singleton_key) WHERE ((singleton_key IS NOT NULL) AND (state = ANY (ARRAY['created'::shoal.job_state, 'retry'::shoal.job_state, 'active'::shoal.job_state])));


--
-- Name: task_created; Type: INDEX; Schema: shoal; Owner: -
--

CREATE INDEX task_created ON shoal.task USING btree (created_at DESC, id);


--
-- Name: task_processing; Type: INDEX; Schema: shoal; Owner: -
--

CREATE INDEX task_processing ON shoal.task USING btree (created_at) WHERE (status = 'processing'::shoal.task_status);


--
-- PostgreSQL database dump complete
--

\unrestrict NSQdiIOgTAtttm26sBqH0LF1SEnmgmMgueDjvoEQ0awXbX7hFF1AD5CrwW1KhAZ

