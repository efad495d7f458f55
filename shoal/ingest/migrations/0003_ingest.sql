-- Ingest pipelines: de-duplication markers, dead letters, per-topic backlog
-- state, and run-time configuration. Messages of the postgres transport are
-- ordinary jobs in queue 'topic.<name>' (see docs/ingest.md).

-- A done-marker per applied message id, kept for the de-duplication TTL.
CREATE TABLE {schema}.ingest_done (
    message_id text COLLATE "C" PRIMARY KEY,
    expires_at timestamptz NOT NULL
);
CREATE INDEX ingest_done_expires ON {schema}.ingest_done (expires_at);

-- Messages no consumer could apply: poison rows split out of a batch, messages
-- past an attempt cap, business errors. `shoal topic redrive` publishes them again.
CREATE TABLE {schema}.ingest_dead (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic       text COLLATE "C" NOT NULL,
    message_id  text COLLATE "C" NOT NULL,
    envelope    jsonb NOT NULL,
    reason      text NOT NULL CHECK (reason IN ('poison', 'attempts', 'business')),
    error       text NOT NULL,
    attempt     integer NOT NULL,
    dead_at     timestamptz NOT NULL,
    redriven_at timestamptz
);
CREATE INDEX ingest_dead_waiting ON {schema}.ingest_dead (topic, id) WHERE redriven_at IS NULL;

-- What the backlog monitor last saw of each topic, and the pause flag producers check.
CREATE TABLE {schema}.ingest_topic (
    topic          text COLLATE "C" PRIMARY KEY,
    depth          bigint NOT NULL DEFAULT 0,
    ready          bigint NOT NULL DEFAULT 0,
    in_flight      bigint NOT NULL DEFAULT 0,
    delayed        bigint NOT NULL DEFAULT 0,
    oldest_age_s   double precision,
    wait_s         double precision,
    paused         boolean NOT NULL DEFAULT false,
    checked_at     timestamptz,
    -- written by consumers (at most every few seconds): the lag of a recently
    -- applied message, now minus its published_at.
    last_wait_s    double precision,
    last_wait_at   timestamptz
);

-- Run-time switches such as ingest.mode, read through a short cache.
CREATE TABLE {schema}.config (
    key        text COLLATE "C" PRIMARY KEY CHECK (length(key) BETWEEN 1 AND 200),
    value      jsonb NOT NULL,
    updated_at timestamptz NOT NULL
);
