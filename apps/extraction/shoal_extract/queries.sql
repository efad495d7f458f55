-- The extraction workbench's statements. {schema} is its own schema.

-- name: insert_documents
-- Many files in one statement; a file whose bytes are already stored is not
-- written again. Rows this statement inserted are invisible to its own reads
-- of the table, so each row comes from `inserted` or from the table.
WITH incoming AS (
    SELECT *
    FROM unnest(%(sha256)s::text[], %(filename)s::text[], %(format)s::text[], %(content)s::bytea[])
        WITH ORDINALITY AS t (sha256, filename, format, content, ord)
), inserted AS (
    INSERT INTO {schema}.document (sha256, filename, format, size_bytes, content, created_at)
    SELECT sha256, filename, format, length(content), content, COALESCE(%(now)s, now())
    FROM incoming
    ORDER BY ord
    ON CONFLICT (sha256) DO NOTHING
    RETURNING id, sha256, filename, format, size_bytes, created_at
)
SELECT COALESCE(i.id, d.id), t.sha256, COALESCE(i.filename, d.filename),
       COALESCE(i.format, d.format), COALESCE(i.size_bytes, d.size_bytes),
       COALESCE(i.created_at, d.created_at), i.id IS NOT NULL
FROM incoming t
LEFT JOIN inserted i ON i.sha256 = t.sha256
LEFT JOIN {schema}.document d ON d.sha256 = t.sha256
ORDER BY t.ord

-- name: documents_by_sha
-- Rows another transaction committed after our import statement began.
SELECT id, sha256, filename, format, size_bytes, created_at, false
FROM {schema}.document
WHERE sha256 = ANY(%(sha256)s::text[])

-- name: list_documents
-- A page of documents by id, newest last; never the bytes.
SELECT id, sha256, filename, format, size_bytes, created_at, false
FROM {schema}.document
WHERE id > %(after_id)s
ORDER BY id
LIMIT %(limit)s

-- name: documents_by_id
-- The documents among the given ids (those that exist).
SELECT id, sha256, filename, format, size_bytes, created_at, false
FROM {schema}.document
WHERE id = ANY(%(ids)s::bigint[])

-- name: document_content
-- One document with its bytes, for the worker that parses it.
SELECT id, sha256, filename, format, size_bytes, created_at, false, content
FROM {schema}.document
WHERE id = %(id)s

-- name: lock_template_name
-- Serialises saves of one template name, so two never pick the same version.
SELECT pg_advisory_xact_lock(hashtextextended('shoal_extract.template:' || %(name)s, 0))

-- name: latest_template
-- The newest version of one template.
SELECT id, name, version, description, fields
FROM {schema}.template
WHERE name = %(name)s
ORDER BY version DESC
LIMIT 1

-- name: insert_template
-- A new version of a template.
INSERT INTO {schema}.template (name, version, description, fields, created_at)
VALUES (%(name)s, %(version)s, %(description)s, %(fields)s::jsonb, COALESCE(%(now)s, now()))
RETURNING id, name, version, description, fields

-- name: latest_templates
-- The newest version of every template, by name.
SELECT DISTINCT ON (name) id, name, version, description, fields
FROM {schema}.template
ORDER BY name, version DESC

-- name: template_by_id
-- One template version.
SELECT id, name, version, description, fields
FROM {schema}.template
WHERE id = %(id)s

-- name: record_call
-- One model call and what it cost.
INSERT INTO {schema}.model_call
    (task_id, item_id, attempt, document_id, model, outcome, prompt_tokens,
     completion_tokens, cost_usd, response_id, at)
VALUES (%(task_id)s, %(item_id)s, %(attempt)s, %(document_id)s, %(model)s, %(outcome)s,
        %(prompt_tokens)s, %(completion_tokens)s, %(cost_usd)s, %(response_id)s,
        COALESCE(%(now)s, now()))

-- name: usage_by_item
-- Calls, tokens and cost of each item of a task, every attempt counted.
-- A cache hit is no call; a call answered 429 with Retry-After (paused) is one.
SELECT item_id, count(*) FILTER (WHERE outcome <> 'cached'), COALESCE(sum(prompt_tokens), 0),
       COALESCE(sum(completion_tokens), 0), COALESCE(sum(cost_usd), 0),
       count(*) FILTER (WHERE outcome = 'cached'), count(*) FILTER (WHERE outcome = 'paused')
FROM {schema}.model_call
WHERE task_id = %(task_id)s
GROUP BY item_id

-- name: parsed_text
-- A document's stored parse by this parser version, if any.
SELECT parsed
FROM {schema}.parsed
WHERE sha256 = %(sha256)s AND parser_version = %(parser_version)s

-- name: store_parsed
-- The first parse of a document wins; a concurrent one writes nothing.
INSERT INTO {schema}.parsed (sha256, parser_version, parsed, pages, ocr_pages, created_at)
VALUES (%(sha256)s, %(parser_version)s, %(parsed)s::jsonb, %(pages)s, %(ocr_pages)s,
        COALESCE(%(now)s, now()))
ON CONFLICT (sha256, parser_version) DO NOTHING

-- name: parse_count
-- How many parses are stored for the given document hashes (tests and the summary).
SELECT count(*)
FROM {schema}.parsed
WHERE sha256 = ANY(%(sha256)s::text[])

-- name: template_version
-- One version of a template by name.
SELECT id, name, version, description, fields
FROM {schema}.template
WHERE name = %(name)s AND version = %(version)s

-- name: insert_review
-- A person accepts or corrects one value.
INSERT INTO {schema}.review
    (task_id, item_id, document_id, template_id, field, action, original, value, reviewer, at)
VALUES (%(task_id)s, %(item_id)s, %(document_id)s, %(template_id)s, %(field)s, %(action)s,
        %(original)s::jsonb, %(value)s::jsonb, %(reviewer)s, COALESCE(%(now)s, now()))
RETURNING id, item_id, field, action, original, value, reviewer, at

-- name: reviews_of_task
-- The newest review of each value of a task.
SELECT DISTINCT ON (item_id, field) id, item_id, field, action, original, value, reviewer, at
FROM {schema}.review
WHERE task_id = %(task_id)s
ORDER BY item_id, field, id DESC

-- name: reviews_of_template
-- The newest review of each field of each document, over every task of one
-- template name (any version): the key to score an extractor against.
SELECT DISTINCT ON (d.sha256, r.field) d.sha256, d.filename, r.field, r.value
FROM {schema}.review r
JOIN {schema}.template t ON t.id = r.template_id
JOIN {schema}.document d ON d.id = r.document_id
WHERE t.name = %(name)s
ORDER BY d.sha256, r.field, r.id DESC

-- name: cached_result
-- A model's stored answer for this content, parser, template version and model.
SELECT extraction
FROM {schema}.model_result
WHERE sha256 = %(sha256)s AND parser_version = %(parser_version)s
  AND template_id = %(template_id)s AND model = %(model)s

-- name: store_result
-- The first answer stored wins; a concurrent one writes nothing.
INSERT INTO {schema}.model_result (sha256, parser_version, template_id, model, extraction, created_at)
VALUES (%(sha256)s, %(parser_version)s, %(template_id)s, %(model)s, %(extraction)s::jsonb,
        COALESCE(%(now)s, now()))
ON CONFLICT DO NOTHING

-- name: budget_ensure
-- The model's budget row, created full and unpaused the first time.
INSERT INTO {schema}.model_budget (model) VALUES (%(model)s)
ON CONFLICT (model) DO NOTHING

-- name: budget_row
-- The model's budget, locked for this transaction: claims take turns; and now.
SELECT paused_until, requests, tokens, counted_at, COALESCE(%(now)s, now())
FROM {schema}.model_budget
WHERE model = %(model)s
FOR UPDATE

-- name: budget_update
-- The buckets after a claim (or a refill that was not enough).
UPDATE {schema}.model_budget
SET requests = %(requests)s, tokens = %(tokens)s, counted_at = %(counted_at)s
WHERE model = %(model)s

-- name: budget_settle
-- A call used more (or fewer) tokens than it was estimated at.
UPDATE {schema}.model_budget
SET tokens = tokens - %(extra)s
WHERE model = %(model)s AND tokens IS NOT NULL

-- name: budget_pause
-- The endpoint said to wait: no worker calls this model before then. A later
-- pause never shortens an earlier one.
INSERT INTO {schema}.model_budget (model, paused_until)
VALUES (%(model)s, COALESCE(%(now)s, now()) + make_interval(secs => %(seconds)s))
ON CONFLICT (model) DO UPDATE
SET paused_until = GREATEST(
    {schema}.model_budget.paused_until, EXCLUDED.paused_until)
RETURNING paused_until

-- name: budget_state
-- The model budgets, for the workbench (pauses in force, buckets).
SELECT model, paused_until, requests, tokens, counted_at, COALESCE(%(now)s, now())
FROM {schema}.model_budget
ORDER BY model
