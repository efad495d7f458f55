-- Braces are doubled where a regex needs them: the text goes through psycopg's sql.SQL.format.
-- The extraction workbench's own tables, beside shoal's (its tasks and items
-- live in shoal's schema; these hold what they point at).

-- One row per distinct file: the same bytes uploaded twice are one document.
-- The bytes live here (bytea) so every worker on every machine reads them from
-- the one database the tasks are in, in the same transaction as the row.
CREATE TABLE {schema}.document (
    id          bigserial PRIMARY KEY,
    sha256      text NOT NULL UNIQUE CHECK (sha256 ~ '^[0-9a-f]{{64}}$'),
    filename    text NOT NULL CHECK (length(filename) BETWEEN 1 AND 255),
    format      text NOT NULL CHECK (format IN ('pdf', 'txt', 'md')),
    size_bytes  integer NOT NULL CHECK (size_bytes > 0 AND size_bytes = length(content)),
    content     bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Templates are versioned and a version is never changed: a task names the
-- version it was started with, so its results mean the same thing forever.
CREATE TABLE {schema}.template (
    id           bigserial PRIMARY KEY,
    name         text NOT NULL CHECK (name ~ '^[a-z][a-z0-9_]{{0,62}}$'),
    version      integer NOT NULL CHECK (version >= 1),
    description  text NOT NULL DEFAULT '',
    fields       jsonb NOT NULL CHECK (jsonb_typeof(fields) = 'array' AND jsonb_array_length(fields) > 0),
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (name, version)
);

-- Every call to a model endpoint, answered or not: the usage of an item is
-- the sum of its calls, including the runs that failed or were interrupted.
CREATE TABLE {schema}.model_call (
    id                 bigserial PRIMARY KEY,
    task_id            uuid NOT NULL,
    item_id            bigint NOT NULL,
    attempt            integer NOT NULL CHECK (attempt >= 1),
    document_id        bigint NOT NULL REFERENCES {schema}.document (id),
    model              text NOT NULL,
    outcome            text NOT NULL
                       CHECK (outcome IN ('answered', 'invalid', 'rejected', 'unavailable', 'timeout')),
    prompt_tokens      integer NOT NULL DEFAULT 0 CHECK (prompt_tokens >= 0),
    completion_tokens  integer NOT NULL DEFAULT 0 CHECK (completion_tokens >= 0),
    cost_usd           numeric(14, 6) NOT NULL DEFAULT 0 CHECK (cost_usd >= 0),
    response_id        text,
    at                 timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX model_call_task_item ON {schema}.model_call (task_id, item_id);
