-- Run history: one row per run, per step, per event.

CREATE TABLE runs (
    run_id        text PRIMARY KEY,
    status        text NOT NULL,
    task          text NOT NULL,
    -- The planner's whole state (services/planner/state.py); version increases with every transition.
    state         jsonb NOT NULL,
    version       integer NOT NULL,
    step_count    integer NOT NULL DEFAULT 0,
    answer        text,
    error_code    text,
    error         text,
    traceparent   text,
    submitted_at  timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    finished_at   timestamptz
);
CREATE INDEX runs_submitted_at ON runs (submitted_at);
CREATE INDEX runs_active ON runs (status) WHERE status NOT IN ('completed', 'failed');

CREATE TABLE steps (
    step_id       text PRIMARY KEY,
    run_id        text NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    step_index    integer NOT NULL,
    kind          text NOT NULL,          -- model | tool | retrieval
    status        text NOT NULL,          -- requested | completed | failed
    request       jsonb NOT NULL,
    result        jsonb,
    error         text,
    requested_at  timestamptz NOT NULL,
    completed_at  timestamptz,
    UNIQUE (run_id, step_index)
);

-- Every event once. A request is recorded when the planner publishes it; its partition, offset and
-- the time it was consumed are filled in from the headers of the result that answers it.
CREATE TABLE events (
    event_id      uuid PRIMARY KEY,
    run_id        text NOT NULL,
    step_id       text,
    event_type    text NOT NULL,
    topic         text NOT NULL,
    partition     integer,
    "offset"      bigint,
    produced_at   timestamptz NOT NULL,   -- created_at: when the producer made the event
    appended_at   timestamptz,            -- the Kafka record's timestamp: when it was sent to the broker
    consumed_at   timestamptz,
    consumed_by   text,
    producer      text NOT NULL,
    traceparent   text,
    payload       jsonb NOT NULL,
    recorded_at   timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX events_position ON events (topic, partition, "offset") WHERE "offset" IS NOT NULL;
CREATE INDEX events_run ON events (run_id, produced_at);

-- Tools the tool workers serve (each worker upserts its own at start); submit and the planner read it.
CREATE TABLE tools (
    name          text PRIMARY KEY,
    description   text NOT NULL,
    parameters    jsonb NOT NULL,         -- JSON schema of the arguments
    requires_approval boolean NOT NULL DEFAULT false,
    registered_by text NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- The tool service's idempotency record: a call with the same step_id never executes twice.
CREATE TABLE tool_calls (
    step_id       text PRIMARY KEY,
    run_id        text NOT NULL,
    tool          text NOT NULL,
    arguments     jsonb NOT NULL,
    status        text NOT NULL,          -- running | succeeded | failed
    result        jsonb,
    error         text,
    attempts      integer NOT NULL DEFAULT 1,
    started_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz
);

-- Retrieval's corpus. Full-text search now; embeddings (pgvector) are filled by ingestion.
CREATE TABLE documents (
    id            bigserial PRIMARY KEY,
    collection    text NOT NULL DEFAULT 'default',
    source        text,
    chunk_index   integer NOT NULL DEFAULT 0,
    content       text NOT NULL,
    content_hash  text NOT NULL,
    metadata      jsonb NOT NULL DEFAULT '{}',
    embedding     vector(384),
    tsv           tsvector GENERATED ALWAYS AS (to_tsvector('english', content)) STORED,
    created_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (collection, content_hash)
);
CREATE INDEX documents_tsv ON documents USING gin (tsv);
