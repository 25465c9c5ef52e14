-- Parallel tool calls (issue 32): a model reply may ask for several tool calls, which fan out as steps of
-- their own while the run's pending step is the batch (runs.state->>'pending_kind' = 'tools', the calls in
-- runs.state->'pending_request'->'calls', services/planner/fanout.py). Approval is per call: a call of a
-- tool that needs approval waits (its entry has "awaiting_approval": true) while the other calls run, so
-- the run may be 'running' while one of its calls waits for a person.
--
-- agentstream_decide(), as 0015 defined it, with one change: with no decision on the step yet, it also
-- records one on a call of the run's pending fan-out that waits for approval (before: only on the run's
-- pending step while the run is 'awaiting_approval'). Same arguments and result, so it is replaced in
-- place and keeps its grants.
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
        IF NOT pg_has_role(session_user, 'agentstream_tenant_approver', 'MEMBER') OR NOT EXISTS (
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
