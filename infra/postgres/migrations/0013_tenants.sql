-- Tenants (docs/security.md, "Tenants"): a tenant is a cell of the pipeline under its own topic prefix,
-- reached on Kafka only by its own principal (prefix ACLs), and in PostgreSQL only through its own logins,
-- which see its runs and nothing else (row-level security). Which prefix a login belongs to is recorded
-- in tenant_logins (0011, which agentstream_decide() reads too) by whoever creates the login (`agentstream
-- dev up --secure --tenant NAME`), never said by the client.
SELECT agentstream_ensure_role('agentstream_tenant');
SELECT agentstream_ensure_member('agentstream_tenant', 'agentstream_tenant_approver');
GRANT USAGE ON SCHEMA public TO agentstream_tenant;
GRANT SELECT ON runs, steps, events TO agentstream_tenant;

-- The calling login's tenant prefix (NULL for a login that is not a tenant's).
CREATE OR REPLACE FUNCTION agentstream_tenant_prefix() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT topic_prefix FROM tenant_logins WHERE login = session_user
$$;
REVOKE ALL ON FUNCTION agentstream_tenant_prefix() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agentstream_tenant_prefix() TO agentstream_tenant;

-- Row-level security on the run history. The schema's owner (and superusers) are not subject to it; the
-- services and the operator's reader see every row; a tenant's login sees its own runs' rows only.
ALTER TABLE runs ENABLE ROW LEVEL SECURITY;
ALTER TABLE steps ENABLE ROW LEVEL SECURITY;
ALTER TABLE events ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS agentstream_services ON runs;
DROP POLICY IF EXISTS agentstream_services ON steps;
DROP POLICY IF EXISTS agentstream_services ON events;
CREATE POLICY agentstream_services ON runs TO agentstream_planner, agentstream_tools, agentstream_retrieval,
    agentstream_inference, agentstream_reader USING (true) WITH CHECK (true);
CREATE POLICY agentstream_services ON steps TO agentstream_planner, agentstream_tools, agentstream_retrieval,
    agentstream_inference, agentstream_reader USING (true) WITH CHECK (true);
CREATE POLICY agentstream_services ON events TO agentstream_planner, agentstream_tools, agentstream_retrieval,
    agentstream_inference, agentstream_reader USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS agentstream_tenant_runs ON runs;
DROP POLICY IF EXISTS agentstream_tenant_steps ON steps;
DROP POLICY IF EXISTS agentstream_tenant_events ON events;
CREATE POLICY agentstream_tenant_runs ON runs FOR SELECT TO agentstream_tenant
    USING (coalesce(state ->> 'topic_prefix', '') = agentstream_tenant_prefix());
CREATE POLICY agentstream_tenant_steps ON steps FOR SELECT TO agentstream_tenant
    USING (EXISTS (SELECT 1 FROM runs r WHERE r.run_id = steps.run_id));       -- runs' policy applies inside
CREATE POLICY agentstream_tenant_events ON events FOR SELECT TO agentstream_tenant
    USING (EXISTS (SELECT 1 FROM runs r WHERE r.run_id = events.run_id));
