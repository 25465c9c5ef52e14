-- The sql_query tool's read-only role, and the function it runs the model's SQL through
-- (services/tools/sql.py says why each piece is there).
--
-- Roles are cluster-wide while migrations run per database (tests migrate fresh databases in the same
-- cluster, possibly at the same time): the role is created only if missing, a concurrent creation is
-- tolerated, and role-level settings are made only by the migration that created it.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentstream_readonly') THEN
        BEGIN
            CREATE ROLE agentstream_readonly NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT
                NOREPLICATION NOBYPASSRLS;
            -- For a session that logs in as it (an operator may give it LOGIN and a password).
            ALTER ROLE agentstream_readonly SET default_transaction_read_only = on;
            ALTER ROLE agentstream_readonly SET statement_timeout = '5s';
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;  -- another database's migration created it meanwhile
        END;
    END IF;
    -- The service's login must be able to SET ROLE to it (and to make it own the function below);
    -- a superuser can already.
    IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
       AND NOT pg_has_role(current_user, 'agentstream_readonly', 'MEMBER') THEN
        EXECUTE format('GRANT agentstream_readonly TO %I', current_user);
    END IF;
END
$$;

-- What it may read: the retrieval corpus, nothing else. Not runs/steps/events (every run's task,
-- conversation and answers: one run's model must not read another's), not tool_calls (tool results and
-- arguments), not tools. New tables are not readable unless a later migration grants them.
GRANT USAGE ON SCHEMA public TO agentstream_readonly;
GRANT SELECT ON documents TO agentstream_readonly;

-- One read-only query, at most max_rows + 1 rows (the extra row tells the caller it truncated), each
-- as JSON. SECURITY DEFINER owned by the read-only role: inside it PostgreSQL refuses to change `role`
-- or `session_authorization`, so the SQL cannot leave the role. FOR … IN EXECUTE opens a cursor, which
-- only a single row-returning query can be: no second statement, no DDL, no plain DML.
CREATE OR REPLACE FUNCTION agentstream_readonly_query(query text, max_rows integer)
RETURNS SETOF json
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
DECLARE
    r record;
    n integer := 0;
BEGIN
    FOR r IN EXECUTE query LOOP
        n := n + 1;
        RETURN NEXT to_json(r);
        EXIT WHEN n > max_rows;
    END LOOP;
END
$$;
ALTER FUNCTION agentstream_readonly_query(text, integer) OWNER TO agentstream_readonly;
REVOKE ALL ON FUNCTION agentstream_readonly_query(text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agentstream_readonly_query(text, integer) TO agentstream_readonly;

-- Why a tool call ended as it did, next to its status (the tool service re-publishes a call's
-- dead letter from it when the call is redelivered): retries_exhausted | timeout | tool_error.
ALTER TABLE tool_calls ADD COLUMN IF NOT EXISTS error_kind text;
