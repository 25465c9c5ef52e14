-- Who may read runs, and who may approve a tool call (docs/security.md).
--
-- agentstream_reader: what clients need to follow runs (`agentstream status`, `events`, `approvals`,
-- `top`, AgentClient.wait/status/events) and nothing else: SELECT on the run history and the workers'
-- registry, no write anywhere. A client's own login is a member (on `agentstream dev up --secure`: the
-- login `client`), so the workers' login is not shared with clients.
--
-- agentstream_approver: a reader that may also decide on a tool call waiting for approval, through
-- agentstream_decide() only. The decision is recorded with the *authenticated* login (session_user), not
-- with a name the caller chooses; with AGENTSTREAM_APPROVALS=recorded the planner acts only on decisions
-- recorded here, so a decision published to Kafka by anyone else changes nothing.
--
-- Roles are cluster-wide while migrations run per database: created only if missing, a concurrent
-- creation tolerated (as in 0005), by one function that later migrations use too.
CREATE OR REPLACE FUNCTION agentstream_ensure_role(role_name text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = role_name) THEN
        BEGIN
            EXECUTE format('CREATE ROLE %I NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE INHERIT '
                           'NOREPLICATION NOBYPASSRLS', role_name);
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;  -- another database's migration created it meanwhile
        END;
    END IF;
END
$$;
REVOKE ALL ON FUNCTION agentstream_ensure_role(text) FROM PUBLIC;
-- Membership likewise (pg_auth_members is shared by the cluster's databases too).
CREATE OR REPLACE FUNCTION agentstream_ensure_member(role_name text, member_name text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid
                   JOIN pg_roles u ON u.oid = m.member WHERE r.rolname = role_name AND u.rolname = member_name) THEN
        BEGIN
            EXECUTE format('GRANT %I TO %I', role_name, member_name);
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END;
    END IF;
END
$$;
REVOKE ALL ON FUNCTION agentstream_ensure_member(text, text) FROM PUBLIC;
SELECT agentstream_ensure_role('agentstream_reader'), agentstream_ensure_role('agentstream_approver');
SELECT agentstream_ensure_member('agentstream_reader', 'agentstream_approver');

CREATE TABLE IF NOT EXISTS approval_decisions (
    run_id      text NOT NULL,
    step_id     text NOT NULL,
    approved    boolean NOT NULL,
    reason      text NOT NULL DEFAULT '',
    decided_by  text NOT NULL,               -- the login that decided (session_user), never the caller's word
    decided_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, step_id)
);

GRANT USAGE ON SCHEMA public TO agentstream_reader;
GRANT SELECT ON runs, steps, events, event_payloads, workers, approval_decisions TO agentstream_reader;

-- The first decision on a step wins; later ones return it unchanged (a retried approve is harmless, a
-- second approver cannot overturn the first). Members of agentstream_approver (and superusers) decide on any
-- run; a tenant's approver (agentstream_tenant_approver, 0013) only on its own tenant's runs: tenant_logins
-- says which topic prefix a tenant's login belongs to. Anyone else gets no row back.
CREATE TABLE IF NOT EXISTS tenant_logins (
    login        text PRIMARY KEY,
    topic_prefix text NOT NULL
);
REVOKE ALL ON tenant_logins FROM PUBLIC;
SELECT agentstream_ensure_role('agentstream_tenant_approver');

CREATE OR REPLACE FUNCTION agentstream_decide(p_run_id text, p_step_id text, p_approved boolean, p_reason text)
RETURNS TABLE (approved boolean, reason text, decided_by text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
BEGIN
    IF NOT pg_has_role(session_user, 'agentstream_approver', 'MEMBER') THEN
        IF NOT pg_has_role(session_user, 'agentstream_tenant_approver', 'MEMBER') OR NOT EXISTS (
                SELECT 1 FROM runs r JOIN tenant_logins t ON t.login = session_user
                WHERE r.run_id = p_run_id AND coalesce(r.state ->> 'topic_prefix', '') = t.topic_prefix) THEN
            RETURN;
        END IF;
    END IF;
    INSERT INTO approval_decisions AS d (run_id, step_id, approved, reason, decided_by)
    VALUES (p_run_id, p_step_id, p_approved, coalesce(p_reason, ''), session_user)
    ON CONFLICT (run_id, step_id) DO NOTHING;
    RETURN QUERY SELECT d.approved, d.reason, d.decided_by FROM approval_decisions d
                 WHERE d.run_id = p_run_id AND d.step_id = p_step_id;
END
$$;
REVOKE ALL ON FUNCTION agentstream_decide(text, text, boolean, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agentstream_decide(text, text, boolean, text) TO agentstream_approver,
    agentstream_tenant_approver;
