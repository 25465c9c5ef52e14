-- A decision made through the HTTP gateway is recorded as the token's (issue 33; docs/gateway.md, "Auth").
--
-- agentstream_decide() (0015) records session_user as the decider: through the gateway that is the
-- gateway's login, `gateway`, for every token of every tenant, so approval_decisions could not say which
-- person's token approved a transfer (the secure-stack test, tests/integration/hostile/test_gateway_secure.py,
-- found it). agentstream_decide_as() is the same decision with the decider named by the caller, for members
-- of agentstream_gateway only (the gateway has checked the token; its login decides on every cell's runs
-- already, as the operator's approver, 0019), and only a name under `gateway:` (the gateway names a token
-- `gateway:<tenant>:<token name or id>`): the gateway's login can never record a decision as a database
-- login or a person that did not come through it. Anyone else gets no row, as from agentstream_decide().
-- The rules are 0015's: the first decision on a step stands; a step the run does not wait at is refused
-- (SQLSTATE ZA001), recording nothing.
CREATE OR REPLACE FUNCTION agentstream_decide_as(p_run_id text, p_step_id text, p_approved boolean, p_reason text,
                                                 p_decided_by text)
RETURNS TABLE (approved boolean, reason text, decided_by text, decided_at timestamptz, decided_now boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
#variable_conflict use_column
DECLARE
    run_status text;
    waiting_at text;
    inserted boolean := false;
BEGIN
    IF NOT pg_has_role(session_user, 'agentstream_gateway', 'MEMBER')
            OR NOT pg_has_role(session_user, 'agentstream_approver', 'MEMBER') THEN
        RETURN;
    END IF;
    IF p_decided_by IS NULL OR p_decided_by NOT LIKE 'gateway:_%' OR length(p_decided_by) > 300
            OR p_decided_by ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('a decider named by the gateway is gateway:<tenant>:<token>, not %L', p_decided_by);
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
                HINT = 'nothing was recorded; GET /v1/approvals lists the tool calls waiting for approval';
        END IF;
        INSERT INTO approval_decisions AS d (run_id, step_id, approved, reason, decided_by)
        VALUES (p_run_id, p_step_id, p_approved, coalesce(p_reason, ''), p_decided_by)
        ON CONFLICT (run_id, step_id) DO NOTHING;
        inserted := FOUND;
    END IF;
    RETURN QUERY SELECT d.approved, d.reason, d.decided_by, d.decided_at, inserted FROM approval_decisions d
                 WHERE d.run_id = p_run_id AND d.step_id = p_step_id;
END
$$;
REVOKE ALL ON FUNCTION agentstream_decide_as(text, text, boolean, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agentstream_decide_as(text, text, boolean, text, text) TO agentstream_gateway;
