-- The gateway's operator tokens (issue 33, item 3: dead letters in the console; docs/gateway.md, "Auth").
-- An operator reads as a reader does and also browses and re-drives its tenant's dead letters
-- (`/v1/dead-letters`); it neither approves nor submits.
ALTER TABLE gateway_tokens DROP CONSTRAINT IF EXISTS gateway_tokens_role_check;
ALTER TABLE gateway_tokens ADD CONSTRAINT gateway_tokens_role_check
    CHECK (role IN ('submitter', 'approver', 'reader', 'operator'));

-- On a secure stack the gateway re-drives for its operator tokens, as `agentstream dlq redrive` does for
-- the operator: it records each re-drive in dlq_redrives (0009) so that a letter is re-driven once.
GRANT SELECT, INSERT, UPDATE, DELETE ON dlq_redrives TO agentstream_gateway;
GRANT USAGE ON SEQUENCE dlq_redrives_id_seq TO agentstream_gateway;
