-- One round trip per batch of planner transitions: the planner sends a JSON document, this function
-- writes runs (with the optimistic version check), events, request offsets and steps, atomically, and
-- returns the run ids whose version check failed (their rows are left untouched).
CREATE OR REPLACE FUNCTION agentstream_record_transitions(batch jsonb) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    conflicts text[];
    updated   text[];
BEGIN
    WITH n AS (
        SELECT * FROM jsonb_to_recordset(coalesce(batch -> 'new_runs', '[]')) AS x(
            run_id text, status text, task text, state jsonb, version int, step_count int, answer text,
            error_code text, error text, traceparent text, submitted_at timestamptz, updated_at timestamptz,
            finished_at timestamptz)
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

    INSERT INTO events (event_id, run_id, step_id, event_type, topic, partition, "offset", produced_at,
                        appended_at, consumed_at, consumed_by, producer, traceparent, payload)
    SELECT event_id, run_id, step_id, event_type, topic, partition, "offset", produced_at, appended_at,
           consumed_at, consumed_by, producer, traceparent, payload
    FROM jsonb_to_recordset(coalesce(batch -> 'events', '[]')) AS e(
        event_id uuid, run_id text, step_id text, event_type text, topic text, partition int, "offset" bigint,
        produced_at timestamptz, appended_at timestamptz, consumed_at timestamptz, consumed_by text,
        producer text, traceparent text, payload jsonb)
    WHERE NOT (e.run_id = ANY (conflicts))
    ON CONFLICT DO NOTHING;

    UPDATE events SET partition = s.partition, "offset" = s."offset", appended_at = s.appended_at,
                      consumed_at = s.consumed_at, consumed_by = s.consumed_by
    FROM jsonb_to_recordset(coalesce(batch -> 'sources', '[]')) AS s(
        run_id text, event_id uuid, partition int, "offset" bigint, appended_at timestamptz,
        consumed_at timestamptz, consumed_by text)
    WHERE events.event_id = s.event_id AND events."offset" IS NULL AND NOT (s.run_id = ANY (conflicts));

    INSERT INTO steps (step_id, run_id, step_index, kind, status, request, requested_at)
    SELECT step_id, run_id, step_index, kind, 'requested', request, requested_at
    FROM jsonb_to_recordset(coalesce(batch -> 'steps_requested', '[]')) AS r(
        step_id text, run_id text, step_index int, kind text, request jsonb, requested_at timestamptz)
    WHERE NOT (r.run_id = ANY (conflicts))
    ON CONFLICT (step_id) DO NOTHING;

    UPDATE steps SET status = c.status, result = c.result, error = c.error, completed_at = c.completed_at
    FROM jsonb_to_recordset(coalesce(batch -> 'steps_completed', '[]')) AS c(
        run_id text, step_id text, status text, result jsonb, error text, completed_at timestamptz)
    WHERE steps.step_id = c.step_id AND NOT (c.run_id = ANY (conflicts));

    RETURN conflicts;
END
$$;
