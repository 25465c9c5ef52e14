-- Decisions that say what was recorded, only on a step a run waits at; readers that see their own cell
-- (docs/security.md, "PostgreSQL"; issue 37).
--
-- The operator's reader has a role of its own, agentstream_operator_reader: it sees every cell's runs,
-- as the services do (on `agentstream dev up --secure`: the login `operator-reader`, which `agentstream
-- status --operator` uses). agentstream_reader, the role of the clients' logins, no longer does (until
-- now the default cell's `client` login read every tenant's runs): a reader's login sees the runs of the
-- cell tenant_logins records for it and, without a row there, the default cell's (topic prefix '').
-- agentstream_approver, the operator's approver, decides on every cell's runs (0011), so it reads them
-- all too. approval_decisions, part of the run history, is row-level secured like it.
SELECT agentstream_ensure_role('agentstream_operator_reader');
SELECT agentstream_ensure_member('agentstream_operator_reader', 'agentstream_approver');
GRANT USAGE ON SCHEMA public TO agentstream_operator_reader;
GRANT SELECT ON runs, steps, events, event_payloads, workers, approval_decisions TO agentstream_operator_reader;

-- The calling login's cell: its tenant_logins prefix, else the default cell's ('').
CREATE OR REPLACE FUNCTION agentstream_cell_prefix() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT coalesce((SELECT topic_prefix FROM tenant_logins WHERE login = session_user), '')
$$;
REVOKE ALL ON FUNCTION agentstream_cell_prefix() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agentstream_cell_prefix() TO agentstream_reader;

DROP POLICY IF EXISTS agentstream_services ON runs;
DROP POLICY IF EXISTS agentstream_services ON steps;
DROP POLICY IF EXISTS agentstream_services ON events;
CREATE POLICY agentstream_services ON runs TO agentstream_planner, agentstream_tools, agentstream_retrieval,
    agentstream_inference, agentstream_operator_reader USING (true) WITH CHECK (true);
CREATE POLICY agentstream_services ON steps TO agentstream_planner, agentstream_tools, agentstream_retrieval,
    agentstream_inference, agentstream_operator_reader USING (true) WITH CHECK (true);
CREATE POLICY agentstream_services ON events TO agentstream_planner, agentstream_tools, agentstream_retrieval,
    agentstream_inference, agentstream_operator_reader USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS agentstream_cell_runs ON runs;
DROP POLICY IF EXISTS agentstream_cell_steps ON steps;
DROP POLICY IF EXISTS agentstream_cell_events ON events;
CREATE POLICY agentstream_cell_runs ON runs FOR SELECT TO agentstream_reader
    USING (coalesce(state ->> 'topic_prefix', '') = agentstream_cell_prefix());
CREATE POLICY agentstream_cell_steps ON steps FOR SELECT TO agentstream_reader
    USING (EXISTS (SELECT 1 FROM runs r WHERE r.run_id = steps.run_id));       -- runs' policy applies inside
CREATE POLICY agentstream_cell_events ON events FOR SELECT TO agentstream_reader
    USING (EXISTS (SELECT 1 FROM runs r WHERE r.run_id = events.run_id));

-- Decisions are written by agentstream_decide() only (it runs as the owner, who is not subject to this).
ALTER TABLE approval_decisions ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS agentstream_services ON approval_decisions;
DROP POLICY IF EXISTS agentstream_cell_decisions ON approval_decisions;
CREATE POLICY agentstream_services ON approval_decisions FOR SELECT TO agentstream_planner,
    agentstream_operator_reader USING (true);
CREATE POLICY agentstream_cell_decisions ON approval_decisions FOR SELECT TO agentstream_reader
    USING (EXISTS (SELECT 1 FROM runs r WHERE r.run_id = approval_decisions.run_id));

-- agentstream_decide(), as 0011 defined it (SECURITY DEFINER; the decision recorded under session_user;
-- members of agentstream_approver decide on any run, a tenant's approver on its own tenant's runs only;
-- anyone else gets no row; the first decision on a step stands), and two changes:
--   * it also returns when the decision was recorded and whether this call recorded it (decided_now
--     false: an earlier decision stands and this one was not recorded), so a client can say what holds
--     instead of what it asked for (`agentstream deny` printed "denied" while an approval stood);
--   * with no decision on the step yet, it refuses, recording nothing, unless the run waits for approval
--     at that very step (runs.status 'awaiting_approval', runs.state->>'pending_step_id': the planner's
--     state, services/planner/state.py): SQLSTATE ZA001, the client's NotAwaitingApproval. A decision
--     made ahead, for a step the run has not reached, would otherwise be waiting for whatever call
--     comes up at that step.
-- The result's columns change, so the function is dropped and created again, with its grants.
DROP FUNCTION IF EXISTS agentstream_decide(text, text, boolean, text);
CREATE FUNCTION agentstream_decide(p_run_id text, p_step_id text, p_approved boolean, p_reason text)
RETURNS TABLE (approved boolean, reason text, decided_by text, decided_at timestamptz, decided_now boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
#variable_conflict use_column
DECLARE
    run_status text;
    waiting_at text;
    inserted boolean := false;
BEGIN
    IF NOT pg_has_role(session_user, 'agentstream_approver', 'MEMBER') THEN
        IF NOT pg_has_role(session_user, 'agentstream_tenant_approver', 'MEMBER') OR NOT EXISTS (
                SELECT 1 FROM runs r JOIN tenant_logins t ON t.login = session_user
                WHERE r.run_id = p_run_id AND coalesce(r.state ->> 'topic_prefix', '') = t.topic_prefix) THEN
            RETURN;
        END IF;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM approval_decisions d WHERE d.run_id = p_run_id AND d.step_id = p_step_id) THEN
        SELECT r.status, r.state ->> 'pending_step_id' INTO run_status, waiting_at FROM runs r
        WHERE r.run_id = p_run_id;
        IF run_status IS DISTINCT FROM 'awaiting_approval' OR waiting_at IS DISTINCT FROM p_step_id THEN
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
REVOKE ALL ON FUNCTION agentstream_decide(text, text, boolean, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agentstream_decide(text, text, boolean, text) TO agentstream_approver,
    agentstream_tenant_approver;
