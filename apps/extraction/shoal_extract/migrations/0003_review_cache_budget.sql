-- Review, reuse of model results, and the model budget shared by every worker.

-- A person's verdict on one extracted value: accepted as it is, or corrected.
-- Append-only: a later review of the same value supersedes an earlier one
-- (the newest row per item and field counts), and nothing is ever lost.
CREATE TABLE {schema}.review (
    id           bigserial PRIMARY KEY,
    task_id      uuid NOT NULL,
    item_id      bigint NOT NULL,
    document_id  bigint NOT NULL REFERENCES {schema}.document (id),
    template_id  bigint NOT NULL REFERENCES {schema}.template (id),
    field        text NOT NULL CHECK (field ~ '^[a-z][a-z0-9_]{{0,62}}$'),
    action       text NOT NULL CHECK (action IN ('accepted', 'corrected')),
    original     jsonb NOT NULL,  -- the extracted value ('null': not found)
    value        jsonb NOT NULL,  -- the value the reviewer stands by
    reviewer     text NOT NULL CHECK (length(reviewer) BETWEEN 1 AND 200),
    at           timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX review_task_item ON {schema}.review (task_id, item_id, field, id);
CREATE INDEX review_template_document ON {schema}.review (template_id, document_id);

-- A model's answer for one document content, parser, template version and model:
-- a second item asking the same (a re-run, another task) reuses it, no call made.
CREATE TABLE {schema}.model_result (
    sha256          text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{{64}}$'),
    parser_version  integer NOT NULL CHECK (parser_version >= 1),
    template_id     bigint NOT NULL REFERENCES {schema}.template (id),
    model           text NOT NULL,
    extraction      jsonb NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sha256, parser_version, template_id, model)
);

-- One row per model: a pause an endpoint asked for (429 Retry-After), and the
-- requests-per-minute and tokens-per-minute buckets, shared by every worker.
-- NULL buckets are full; a bucket may go below zero (debt) when a call used
-- more tokens than it was estimated at.
CREATE TABLE {schema}.model_budget (
    model         text PRIMARY KEY,
    paused_until  timestamptz,
    requests      double precision,
    tokens        double precision,
    counted_at    timestamptz
);

-- A cache hit and a paused call are recorded too (neither costs anything).
ALTER TABLE {schema}.model_call DROP CONSTRAINT model_call_outcome_check;
ALTER TABLE {schema}.model_call ADD CONSTRAINT model_call_outcome_check
    CHECK (outcome IN ('answered', 'invalid', 'rejected', 'unavailable', 'timeout',
                       'cached', 'paused'));
