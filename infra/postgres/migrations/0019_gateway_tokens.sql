-- The HTTP gateway's bearer tokens (issue 33; docs/gateway.md, "Auth"). A token is shown once, when
-- `agentstream token create` makes it: `ags_<token_id>_<secret>`. Only the SHA-256 of its secret is kept, so
-- a copy of this table (a backup, a replica) lets nobody in. A token is a tenant and a role: a reader reads,
-- an approver also decides on tool calls, a submitter also submits and cancels; all within its tenant's cell.
CREATE TABLE IF NOT EXISTS gateway_tokens (
    token_id      text PRIMARY KEY,           -- the public part, 12 hex characters: what list and revoke name
    secret_sha256 text NOT NULL,              -- hex SHA-256 of the secret part, never the secret
    tenant        text NOT NULL,
    role          text NOT NULL CHECK (role IN ('submitter', 'approver', 'reader')),
    name          text NOT NULL DEFAULT '',   -- what the token is for (shown as the approver of its decisions)
    created_at    timestamptz NOT NULL DEFAULT now(),
    revoked_at    timestamptz                 -- set by `agentstream token revoke`; never deleted, for the record
);
REVOKE ALL ON gateway_tokens FROM PUBLIC;

-- On a secure stack the gateway is a principal of its own. It acts for every tenant it holds tokens of and
-- enforces each token's cell itself (a run of another tenant is 404 to it), so its login reads every cell's
-- runs and decides on their tool calls as the operator's approver does (0011, 0015); it reads the tokens,
-- and writes none (`agentstream token` runs as the schema's owner).
SELECT agentstream_ensure_role('agentstream_gateway');
SELECT agentstream_ensure_member('agentstream_approver', 'agentstream_gateway');
GRANT USAGE ON SCHEMA public TO agentstream_gateway;
GRANT SELECT ON gateway_tokens TO agentstream_gateway;
