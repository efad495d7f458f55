-- Parsed text, stored per file content and parser version: a second task (another
-- template, another extractor) over the same document reads it from here instead of
-- parsing (and perhaps OCRing) the PDF again. Keyed by the content hash like the
-- documents, so two uploads of the same bytes share it.
CREATE TABLE {schema}.parsed (
    sha256          text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{{64}}$'),
    parser_version  integer NOT NULL CHECK (parser_version >= 1),
    parsed          jsonb NOT NULL,
    pages           integer NOT NULL CHECK (pages >= 1),
    ocr_pages       integer NOT NULL DEFAULT 0 CHECK (ocr_pages >= 0),
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sha256, parser_version)
);
