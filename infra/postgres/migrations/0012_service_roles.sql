-- One role per service, with only the tables it uses (docs/security.md). A service's login is a member
-- of its role (on `agentstream dev up --secure`: the logins planner, tools, retrieval, inference, and
-- worker for `agentstream worker all`); the schema stays owned by the login that migrates, which the
-- services no longer need.
--
-- What each reads and writes, from the code:
--   every service   the migration ledger (read: a worker checks at start that nothing is pending), the
--                   claim-checked payloads (streams/claims.py: write, read, expire), the workers'
--                   registry (streams/telemetry/discovery.py: register, heartbeat, leave, list)
--   planner         runs, steps, events (agentstream_record_transitions runs as its caller), its
--                   partition leases, recorded approval decisions (read)
--   tools           tool_calls (the claim and the result of each call, streams/tool_calls.py), runs (read:
--                   the check of each call against its run), and the sql_query tool's read-only role
--   retrieval       documents (read: the search; ingesting is the schema owner's)
--   inference       nothing more
-- Tables of one's own tools (a tool writing its own table through ctx.pool) are granted to
-- agentstream_tools by whoever creates them.
SELECT agentstream_ensure_role(r) FROM unnest(ARRAY['agentstream_planner', 'agentstream_tools', 'agentstream_retrieval',
                                                   'agentstream_inference']) AS r;

GRANT USAGE ON SCHEMA public TO agentstream_planner, agentstream_tools, agentstream_retrieval,
    agentstream_inference;
GRANT SELECT ON agentstream_migrations TO agentstream_planner, agentstream_tools, agentstream_retrieval,
    agentstream_inference;
GRANT SELECT, INSERT, DELETE ON event_payloads TO agentstream_planner, agentstream_tools, agentstream_retrieval,
    agentstream_inference;
GRANT SELECT, INSERT, UPDATE, DELETE ON workers TO agentstream_planner, agentstream_tools, agentstream_retrieval,
    agentstream_inference;

GRANT SELECT, INSERT, UPDATE ON runs, steps, events, planner_leases TO agentstream_planner;
GRANT SELECT ON approval_decisions TO agentstream_planner;

GRANT SELECT ON runs TO agentstream_tools;
GRANT SELECT, INSERT, UPDATE ON tool_calls TO agentstream_tools;
SELECT agentstream_ensure_member('agentstream_readonly', 'agentstream_tools');  -- sql_query's SET LOCAL ROLE

GRANT SELECT ON documents TO agentstream_retrieval;
