-- Conversations (issue 32): a task may be a turn of a session. The session's transcript is kept here, written
-- by the planner in the same transaction as its turns' transitions (streams/store/sessions.py), and mirrored
-- on the compacted agent.sessions topic. Which turns wait is not stored apart: a session's turns that have
-- not ended are its runs with state->>'session' (queued ones wait, in state->>'session_seq' order).

CREATE TABLE IF NOT EXISTS sessions (
    prefix       text    NOT NULL,            -- the pipeline's topic prefix (tenants, replays, tests)
    session_id   text    NOT NULL,
    -- Moves on with every delete: a turn that began in an earlier epoch belongs to a deleted session.
    epoch        integer NOT NULL DEFAULT 0,
    -- [{"run_id", "user", "reply", "answer", "tokens"}], oldest first: what the next turn starts from.
    turns        jsonb   NOT NULL DEFAULT '[]',
    dropped      integer NOT NULL DEFAULT 0,   -- turns dropped so far to keep within the token budget
    tokens       integer NOT NULL DEFAULT 0,   -- the estimated tokens of turns
    last_run_id  text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    deleted_at   timestamptz,                  -- set by a delete; cleared when a turn begins the session again
    PRIMARY KEY (prefix, session_id)
);
CREATE INDEX IF NOT EXISTS sessions_updated ON sessions (prefix, updated_at DESC);
-- A turn's arrival and a turn's end look up the session's turns that have not ended.
CREATE INDEX IF NOT EXISTS runs_session_active ON runs ((state ->> 'session'))
    WHERE status NOT IN ('completed', 'failed');

-- Who may do what (docs/security.md): the planner writes sessions; readers read them; a tenant's logins read
-- their own cell's only (row-level security, as runs in 0013).
GRANT SELECT, INSERT, UPDATE ON sessions TO agentstream_planner;
GRANT SELECT ON sessions TO agentstream_reader, agentstream_tenant;
ALTER TABLE sessions ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS agentstream_services ON sessions;
CREATE POLICY agentstream_services ON sessions TO agentstream_planner, agentstream_reader USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS agentstream_tenant_sessions ON sessions;
CREATE POLICY agentstream_tenant_sessions ON sessions FOR SELECT TO agentstream_tenant
    USING (prefix = agentstream_tenant_prefix());

-- `agentstream session delete`: erase the transcript and move the epoch on, in one statement; return the
-- session's turns that have not ended (the caller stops them: they fail with session_deleted), or NULL when
-- there is no such session. An approver's login may delete (a tenant's approver only its own cell's
-- sessions); readers may not.
CREATE OR REPLACE FUNCTION agentstream_delete_session(p_prefix text, p_session text) RETURNS text[]
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    own_prefix text := agentstream_tenant_prefix();
    active     text[];
BEGIN
    IF own_prefix IS NOT NULL AND own_prefix IS DISTINCT FROM p_prefix THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = format('a login of the cell %L may not delete a session of another cell', own_prefix);
    END IF;
    UPDATE sessions SET turns = '[]', dropped = 0, tokens = 0, epoch = epoch + 1, deleted_at = now(),
                        updated_at = now()
    WHERE prefix = p_prefix AND session_id = p_session;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT coalesce(array_agg(run_id ORDER BY submitted_at), '{}') INTO active FROM runs
    WHERE state ->> 'session' = p_session AND coalesce(state ->> 'topic_prefix', '') = p_prefix
      AND status NOT IN ('completed', 'failed');
    RETURN active;
END
$$;
REVOKE ALL ON FUNCTION agentstream_delete_session(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agentstream_delete_session(text, text) TO agentstream_approver, agentstream_tenant_approver;

-- The transition writer, as 0008 defined it, plus the sessions of the batch's turns (its last two
-- statements). Same argument and result: replaced in place, its grants kept.
CREATE OR REPLACE FUNCTION agentstream_record_transitions(batch jsonb) RETURNS jsonb
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

    -- Sessions (new here): a turn's arrival opens its session (created, or begun again after a delete);
    -- a completed turn's transcript replaces the session's, unless the session was deleted meanwhile (its
    -- epoch moved on: then nothing is written, and the delete stands).
    INSERT INTO sessions AS s (prefix, session_id, last_run_id, created_at, updated_at)
    SELECT DISTINCT ON (w.prefix, w.session_id) w.prefix, w.session_id, w.run_id, w.at, w.at
    FROM jsonb_to_recordset(coalesce(batch -> 'sessions', '[]')) AS w(
        kind text, prefix text, session_id text, run_id text, at timestamptz)
    WHERE w.kind = 'open' AND NOT (w.run_id = ANY (skipped))
    ON CONFLICT (prefix, session_id) DO UPDATE SET deleted_at = NULL, updated_at = EXCLUDED.updated_at
        WHERE s.deleted_at IS NOT NULL;

    UPDATE sessions s SET turns = w.turns, dropped = w.dropped, tokens = w.tokens, last_run_id = w.run_id,
                          updated_at = w.at
    FROM jsonb_to_recordset(coalesce(batch -> 'sessions', '[]')) AS w(
        kind text, prefix text, session_id text, run_id text, epoch int, turns jsonb, dropped int, tokens int,
        at timestamptz)
    WHERE w.kind = 'append' AND s.prefix = w.prefix AND s.session_id = w.session_id AND s.epoch = w.epoch
      AND NOT (w.run_id = ANY (skipped));

    RETURN jsonb_build_object('conflicts', to_jsonb(conflicts), 'fenced', to_jsonb(fenced));
END
$$;
