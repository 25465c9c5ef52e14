-- The operator's tools under logins of their own, never the schema owner's (issue 36, item 2;
-- docs/security.md, "The operator's tools"). Until now `agentstream dlq` and `agentstream replay` connected
-- as the owner (the superuser on `agentstream dev up --secure`).
--
--   operator-reader (agentstream_operator_reader, 0015)  `dlq list|show`, `replay show|diff`: reads, as
--                   before, and now the re-drive record too.
--   operator        (agentstream_operator)  `dlq redrive`: records re-drives in dlq_redrives (0009), nothing
--                   else. Re-driving is this role's (and the gateway's for its operator tokens, 0020) only.
--   replay          (agentstream_replay)  `replay rerun|fork|window`: reads every run (the originals), and
--                   writes only the runs of replay pipelines (topic prefix `replay.`, agentstream/replay/
--                   rerun.py) and their steps, events, sessions, planner leases and tool calls; decides on
--                   their approvals (the original's recorded decisions, given again), never on another run's.
--   a tenant's login (agentstream_tenant, 0013)  reads its own cell's re-drive records (its dead letters'),
--                   as it reads its own runs.
--
-- agentstream_replay is deliberately a member of no service role: their policies (0015) let them write
-- every cell's rows, and row-level security takes the union of a login's policies.
SELECT agentstream_ensure_role('agentstream_operator'), agentstream_ensure_role('agentstream_replay');
GRANT USAGE ON SCHEMA public TO agentstream_operator, agentstream_replay;

-- Re-drive records, by cell: the operator and the gateway record them; the operator's reader reads them all,
-- a tenant its own dead-letter topic's.
GRANT SELECT, INSERT, UPDATE, DELETE ON dlq_redrives TO agentstream_operator;
GRANT USAGE ON SEQUENCE dlq_redrives_id_seq TO agentstream_operator;
GRANT SELECT ON dlq_redrives TO agentstream_operator_reader, agentstream_tenant;
ALTER TABLE dlq_redrives ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS agentstream_redrivers ON dlq_redrives;
DROP POLICY IF EXISTS agentstream_operator_reader ON dlq_redrives;
DROP POLICY IF EXISTS agentstream_tenant_redrives ON dlq_redrives;
CREATE POLICY agentstream_redrivers ON dlq_redrives TO agentstream_operator, agentstream_gateway
    USING (true) WITH CHECK (true);
CREATE POLICY agentstream_operator_reader ON dlq_redrives FOR SELECT TO agentstream_operator_reader USING (true);
CREATE POLICY agentstream_tenant_redrives ON dlq_redrives FOR SELECT TO agentstream_tenant
    USING (dlq_topic = agentstream_tenant_prefix() || 'agent.dlq');

-- Replays: a pipeline of their own under `replay.<id>.`, run by `agentstream replay` in-process (the real
-- planner; live and fork also the real inference, tools and retrieval).
CREATE OR REPLACE FUNCTION agentstream_is_replay_run(p_run_id text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, public AS $$
    SELECT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = p_run_id
                   AND coalesce(r.state ->> 'topic_prefix', '') LIKE 'replay.%')
$$;
GRANT EXECUTE ON FUNCTION agentstream_is_replay_run(text) TO agentstream_replay;
GRANT SELECT ON agentstream_migrations TO agentstream_replay;
GRANT SELECT, INSERT, UPDATE ON runs, steps, events, sessions, planner_leases, tool_calls TO agentstream_replay;
GRANT SELECT, INSERT ON event_payloads TO agentstream_replay;
GRANT SELECT ON approval_decisions, documents TO agentstream_replay;
SELECT agentstream_ensure_member('agentstream_readonly', 'agentstream_replay');  -- live: sql_query's SET LOCAL ROLE

DROP POLICY IF EXISTS agentstream_replay_read ON runs;
DROP POLICY IF EXISTS agentstream_replay_insert ON runs;
DROP POLICY IF EXISTS agentstream_replay_update ON runs;
CREATE POLICY agentstream_replay_read ON runs FOR SELECT TO agentstream_replay USING (true);
CREATE POLICY agentstream_replay_insert ON runs FOR INSERT TO agentstream_replay
    WITH CHECK (coalesce(state ->> 'topic_prefix', '') LIKE 'replay.%');
CREATE POLICY agentstream_replay_update ON runs FOR UPDATE TO agentstream_replay
    USING (coalesce(state ->> 'topic_prefix', '') LIKE 'replay.%')
    WITH CHECK (coalesce(state ->> 'topic_prefix', '') LIKE 'replay.%');
DROP POLICY IF EXISTS agentstream_replay_read ON steps;
DROP POLICY IF EXISTS agentstream_replay_insert ON steps;
DROP POLICY IF EXISTS agentstream_replay_update ON steps;
CREATE POLICY agentstream_replay_read ON steps FOR SELECT TO agentstream_replay USING (true);
CREATE POLICY agentstream_replay_insert ON steps FOR INSERT TO agentstream_replay
    WITH CHECK (agentstream_is_replay_run(run_id));
CREATE POLICY agentstream_replay_update ON steps FOR UPDATE TO agentstream_replay
    USING (agentstream_is_replay_run(run_id)) WITH CHECK (agentstream_is_replay_run(run_id));
DROP POLICY IF EXISTS agentstream_replay_read ON events;
DROP POLICY IF EXISTS agentstream_replay_insert ON events;
DROP POLICY IF EXISTS agentstream_replay_update ON events;
CREATE POLICY agentstream_replay_read ON events FOR SELECT TO agentstream_replay USING (true);
CREATE POLICY agentstream_replay_insert ON events FOR INSERT TO agentstream_replay
    WITH CHECK (agentstream_is_replay_run(run_id));
CREATE POLICY agentstream_replay_update ON events FOR UPDATE TO agentstream_replay
    USING (agentstream_is_replay_run(run_id)) WITH CHECK (agentstream_is_replay_run(run_id));
DROP POLICY IF EXISTS agentstream_replay_read ON approval_decisions;
CREATE POLICY agentstream_replay_read ON approval_decisions FOR SELECT TO agentstream_replay USING (true);
DROP POLICY IF EXISTS agentstream_replay_read ON sessions;
DROP POLICY IF EXISTS agentstream_replay_write ON sessions;
DROP POLICY IF EXISTS agentstream_replay_update ON sessions;
CREATE POLICY agentstream_replay_read ON sessions FOR SELECT TO agentstream_replay USING (true);
CREATE POLICY agentstream_replay_write ON sessions FOR INSERT TO agentstream_replay WITH CHECK (prefix LIKE 'replay.%');
CREATE POLICY agentstream_replay_update ON sessions FOR UPDATE TO agentstream_replay
    USING (prefix LIKE 'replay.%') WITH CHECK (prefix LIKE 'replay.%');

-- Planner leases and tool calls were readable and writable by their one service only, so they had no
-- row-level security: now they have, and that service keeps every row.
ALTER TABLE planner_leases ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS agentstream_services ON planner_leases;
DROP POLICY IF EXISTS agentstream_replay_leases ON planner_leases;
CREATE POLICY agentstream_services ON planner_leases TO agentstream_planner USING (true) WITH CHECK (true);
CREATE POLICY agentstream_replay_leases ON planner_leases TO agentstream_replay
    USING (prefix LIKE 'replay.%') WITH CHECK (prefix LIKE 'replay.%');
ALTER TABLE tool_calls ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS agentstream_services ON tool_calls;
DROP POLICY IF EXISTS agentstream_replay_calls ON tool_calls;
CREATE POLICY agentstream_services ON tool_calls TO agentstream_tools USING (true) WITH CHECK (true);
CREATE POLICY agentstream_replay_calls ON tool_calls TO agentstream_replay
    USING (agentstream_is_replay_run(run_id)) WITH CHECK (agentstream_is_replay_run(run_id));

-- agentstream_decide(), as 0017 last defined it (a call of the pending fan-out that waits for approval may
-- be decided too), and one change: a member of agentstream_replay decides on the runs of replay pipelines
-- only (the replayed run gets the decisions its original got), recorded under its login like anyone's.
-- Same arguments and result: replaced in place, its grants kept and one added.
CREATE OR REPLACE FUNCTION agentstream_decide(p_run_id text, p_step_id text, p_approved boolean, p_reason text)
RETURNS TABLE (approved boolean, reason text, decided_by text, decided_at timestamptz, decided_now boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
#variable_conflict use_column
DECLARE
    run_status text;
    waiting_at text;
    call_waits boolean;
    inserted boolean := false;
BEGIN
    IF NOT pg_has_role(session_user, 'agentstream_approver', 'MEMBER') THEN
        IF pg_has_role(session_user, 'agentstream_replay', 'MEMBER') THEN
            IF NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = p_run_id
                           AND coalesce(r.state ->> 'topic_prefix', '') LIKE 'replay.%') THEN
                RETURN;
            END IF;
        ELSIF NOT pg_has_role(session_user, 'agentstream_tenant_approver', 'MEMBER') OR NOT EXISTS (
                SELECT 1 FROM runs r JOIN tenant_logins t ON t.login = session_user
                WHERE r.run_id = p_run_id AND coalesce(r.state ->> 'topic_prefix', '') = t.topic_prefix) THEN
            RETURN;
        END IF;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM approval_decisions d WHERE d.run_id = p_run_id AND d.step_id = p_step_id) THEN
        SELECT r.status, r.state ->> 'pending_step_id',
               r.status IN ('running', 'awaiting_approval') AND r.state ->> 'pending_kind' = 'tools'
               AND jsonb_path_exists(r.state -> 'pending_request',
                                     '$.calls[*] ? (@.step_id == $step && @.awaiting_approval == true)',
                                     jsonb_build_object('step', p_step_id))
          INTO run_status, waiting_at, call_waits
          FROM runs r WHERE r.run_id = p_run_id;
        IF NOT coalesce(call_waits, false)
           AND (run_status IS DISTINCT FROM 'awaiting_approval' OR waiting_at IS DISTINCT FROM p_step_id) THEN
            RAISE EXCEPTION USING ERRCODE = 'ZA001', MESSAGE = CASE
                WHEN run_status IS NULL THEN format('no run %s', p_run_id)
                WHEN run_status = 'awaiting_approval' THEN
                    format('run %s waits for approval at step %s, not at %s', p_run_id, waiting_at, p_step_id)
                ELSE format('run %s is %s: it does not wait for approval at step %s', p_run_id, run_status,
                            p_step_id) END,
                HINT = 'nothing was recorded; `agentstream approvals` lists the tool calls waiting for approval';
        END IF;
        INSERT INTO approval_decisions AS d (run_id, step_id, approved, reason, decided_by)
        VALUES (p_run_id, p_step_id, p_approved, coalesce(p_reason, ''), session_user)
        ON CONFLICT (run_id, step_id) DO NOTHING;
        inserted := FOUND;  -- false: a concurrent call recorded its decision first
    END IF;
    RETURN QUERY SELECT d.approved, d.reason, d.decided_by, d.decided_at, inserted FROM approval_decisions d
                 WHERE d.run_id = p_run_id AND d.step_id = p_step_id;
END
$$;
GRANT EXECUTE ON FUNCTION agentstream_decide(text, text, boolean, text) TO agentstream_replay;
