-- Runs survive anything (issue 11): planner partition leases (fencing), claim-check bodies, and a
-- transition writer that refuses fenced planners and reports them apart from version conflicts.

-- Which planner owns partition N of a pipeline (topic prefix), and since which epoch. A planner bumps
-- the epoch when Kafka assigns it the partition; every transition it records carries the epoch it
-- holds, and a transition whose epoch is no longer current is refused: a planner that was paused past
-- its session timeout, or cut off from the broker, cannot write over its successor's work.
CREATE TABLE IF NOT EXISTS planner_leases (
    prefix       text    NOT NULL,
    partition    integer NOT NULL,
    epoch        bigint  NOT NULL,
    owner        text    NOT NULL,
    acquired_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (prefix, partition)
);

-- Events too large for a Kafka record (streams/claims.py): the encoded event, by its SHA-256.
CREATE TABLE IF NOT EXISTS event_payloads (
    digest      text PRIMARY KEY,
    body        bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS event_payloads_created_at ON event_payloads (created_at);

-- The planner's sweeper looks for active runs that have not moved for a while.
CREATE INDEX IF NOT EXISTS runs_active_updated ON runs (updated_at) WHERE status NOT IN ('completed', 'failed');

-- One round trip per batch of planner transitions, as in 0003, plus fencing. Returns
-- {"conflicts": [run ids whose version check failed], "fenced": [run ids whose lease epoch is stale]};
-- neither kind writes anything. The lease rows are read FOR SHARE, so a planner taking a partition over
-- (UPDATE of its lease) waits for transitions in flight to commit and then sees them.
DROP FUNCTION IF EXISTS agentstream_record_transitions(jsonb);
CREATE FUNCTION agentstream_record_transitions(batch jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    fenced    text[];
    conflicts text[];
    updated   text[];
    skipped   text[];
BEGIN
    SELECT coalesce(array_agg(t.run_id) FILTER (WHERE l.epoch IS DISTINCT FROM t.epoch), '{}')
    INTO fenced
    FROM jsonb_to_recordset(coalesce(batch -> 'leases', '[]')) AS t(run_id text, prefix text, partition int,
                                                                    epoch bigint)
    LEFT JOIN LATERAL (SELECT epoch FROM planner_leases
                       WHERE prefix = t.prefix AND partition = t.partition FOR SHARE) l ON true;

    WITH n AS (
        SELECT * FROM jsonb_to_recordset(coalesce(batch -> 'new_runs', '[]')) AS x(
            run_id text, status text, task text, state jsonb, version int, step_count int, answer text,
            error_code text, error text, traceparent text, submitted_at timestamptz, updated_at timestamptz,
            finished_at timestamptz)
        WHERE NOT (x.run_id = ANY (fenced))
    ), ins AS (
        INSERT INTO runs (run_id, status, task, state, version, step_count, answer, error_code, error,
                          traceparent, submitted_at, updated_at, finished_at)
        SELECT run_id, status, task, state, version, step_count, answer, error_code, error, traceparent,
               submitted_at, updated_at, finished_at FROM n
        ON CONFLICT (run_id) DO NOTHING RETURNING run_id
    )
    SELECT coalesce(array_agg(n.run_id) FILTER (WHERE n.run_id NOT IN (SELECT run_id FROM ins)), '{}')
    INTO conflicts FROM n;

    WITH u AS (
        SELECT * FROM jsonb_to_recordset(coalesce(batch -> 'updates', '[]')) AS x(
            run_id text, status text, state jsonb, version int, expected int, step_count int, answer text,
            error_code text, error text, updated_at timestamptz, finished_at timestamptz)
        WHERE NOT (x.run_id = ANY (fenced))
    ), upd AS (
        UPDATE runs SET status = u.status, state = u.state, version = u.version, step_count = u.step_count,
                        answer = u.answer, error_code = u.error_code, error = u.error,
                        updated_at = u.updated_at, finished_at = u.finished_at
        FROM u WHERE runs.run_id = u.run_id AND runs.version = u.expected
        RETURNING runs.run_id
    )
    SELECT coalesce(array_agg(u.run_id) FILTER (WHERE u.run_id NOT IN (SELECT run_id FROM upd)), '{}')
    INTO updated FROM u;
    conflicts := conflicts || updated;
    skipped := conflicts || fenced;

    INSERT INTO events (event_id, run_id, step_id, event_type, topic, partition, "offset", produced_at,
                        appended_at, consumed_at, consumed_by, producer, traceparent, payload)
    SELECT event_id, run_id, step_id, event_type, topic, partition, "offset", produced_at, appended_at,
           consumed_at, consumed_by, producer, traceparent, payload
    FROM jsonb_to_recordset(coalesce(batch -> 'events', '[]')) AS e(
        event_id uuid, run_id text, step_id text, event_type text, topic text, partition int, "offset" bigint,
        produced_at timestamptz, appended_at timestamptz, consumed_at timestamptz, consumed_by text,
        producer text, traceparent text, payload jsonb)
    WHERE NOT (e.run_id = ANY (skipped))
    ON CONFLICT DO NOTHING;

    UPDATE events SET partition = s.partition, "offset" = s."offset", appended_at = s.appended_at,
                      consumed_at = s.consumed_at, consumed_by = s.consumed_by
    FROM jsonb_to_recordset(coalesce(batch -> 'sources', '[]')) AS s(
        run_id text, event_id uuid, partition int, "offset" bigint, appended_at timestamptz,
        consumed_at timestamptz, consumed_by text)
    WHERE events.event_id = s.event_id AND events."offset" IS NULL AND NOT (s.run_id = ANY (skipped));

    INSERT INTO steps (step_id, run_id, step_index, kind, status, request, requested_at)
    SELECT step_id, run_id, step_index, kind, 'requested', request, requested_at
    FROM jsonb_to_recordset(coalesce(batch -> 'steps_requested', '[]')) AS r(
        step_id text, run_id text, step_index int, kind text, request jsonb, requested_at timestamptz)
    WHERE NOT (r.run_id = ANY (skipped))
    ON CONFLICT (step_id) DO NOTHING;

    UPDATE steps SET status = c.status, result = c.result, error = c.error, completed_at = c.completed_at
    FROM jsonb_to_recordset(coalesce(batch -> 'steps_completed', '[]')) AS c(
        run_id text, step_id text, status text, result jsonb, error text, completed_at timestamptz)
    WHERE steps.step_id = c.step_id AND NOT (c.run_id = ANY (skipped));

    RETURN jsonb_build_object('conflicts', to_jsonb(conflicts), 'fenced', to_jsonb(fenced));
END
$$;
