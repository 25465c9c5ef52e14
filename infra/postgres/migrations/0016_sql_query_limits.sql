-- sql_query reads only what its role was granted, and spills at most temp_file_limit to disk (issue 37;
-- services/tools/sql.py says why each piece is there).
--
-- 1. temp_file_limit. A superuser-only setting: the tool service's login sets it (SET LOCAL, before
--    SET LOCAL ROLE agentstream_readonly), so agentstream_tools, the role of the tool services' logins,
--    may set it (PostgreSQL 15+). agentstream_readonly may not, so the model's SQL cannot raise it
--    (set_config('temp_file_limit', '-1', true) is refused). The privilege is cluster-wide, like the roles
--    (0005): granted once, a concurrent grant from another database's migration tolerated, and a login
--    that may not grant it (not a superuser) leaves a notice: the tool then refuses to run until it is
--    granted (services/tools/sql.py).
DO $$
BEGIN
    IF NOT has_parameter_privilege('agentstream_tools', 'temp_file_limit', 'SET') THEN
        BEGIN
            GRANT SET ON PARAMETER temp_file_limit TO agentstream_tools;
        EXCEPTION
            WHEN insufficient_privilege THEN
                RAISE NOTICE 'sql_query: grant SET ON PARAMETER temp_file_limit to agentstream_tools as a superuser';
            WHEN duplicate_object OR unique_violation THEN
                NULL;  -- another database's migration granted it meanwhile
        END;
    END IF;
END
$$;

-- 2. What the query may read. PUBLIC may read the system catalogs (pg_roles, pg_stat_activity, pg_user,
--    pg_settings…), and privileges only add up: no role can be refused what PUBLIC may do. So the function
--    looks at the query's plan before it reads a row, and refuses:
--    - a relation that is not granted to the function's role itself (SELECT in its ACL): documents, not
--      the catalogs PUBLIC reads (views show as the tables under them: pg_roles as pg_authid);
--    - a function in FROM other than the set-returning and text-search ones listed (pg_stat_get_activity,
--      pg_show_all_settings, ts_stat, which runs SQL of its own…);
--    - in any expression of the plan (VERBOSE: every output, condition and call), the functions and types
--      that name roles or run SQL of their own: CURRENT_USER and its kin, regrole, aclitem, pg_get_*
--      (pg_get_userbyid), has_*_privilege, current_setting (session_authorization), query_to_xml and its
--      kin, pg_stat_get_* …: each string of the plan but the names the query chose (aliases, CTE
--      names), its string literals taken out (a quoted name stays: "session_user"() is a call);
--    - before planning, in the text: regrole and aclitem (their input functions look roles up while the
--      query is parsed, and say whether one exists), acldefault and makeaclitem (immutable: the planner
--      would compute them before the plan shows them) and U& escapes (which could spell a name otherwise).
--    The plan is EXPLAIN's of the same text, run after OPEN … FOR EXECUTE has accepted it as one query
--    (EXECUTE alone would run a second statement after a semicolon).
CREATE OR REPLACE FUNCTION agentstream_readonly_query(query text, max_rows integer, max_bytes integer)
RETURNS TABLE (item json, stop text)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
DECLARE
    rows_cursor refcursor;
    r record;
    plan jsonb;
    node jsonb;
    forbidden text;
    n integer := 0;
    used bigint := 0;
    whole json;
    size bigint;
    room bigint;
    skeleton bigint;
    ncols integer;
    share bigint;
BEGIN
    forbidden := substring(lower(query) FROM '(regrole|\maclitem|\macldefault|\mmakeaclitem|u&)');
    IF forbidden IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = format('permission denied: sql_query does not accept %s in a query', forbidden);
    END IF;
    OPEN rows_cursor FOR EXECUTE query;  -- one row-returning query, or an error
    EXECUTE 'EXPLAIN (VERBOSE, FORMAT JSON) ' || query INTO plan;
    FOR node IN SELECT v FROM jsonb_path_query(plan, 'strict $.**') AS v
                WHERE jsonb_typeof(v) = 'object' AND v ? 'Node Type' LOOP
        IF node ? 'Relation Name' AND NOT EXISTS (
                SELECT 1 FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace,
                     aclexplode(c.relacl) AS a
                WHERE s.nspname = node->>'Schema' AND c.relname = node->>'Relation Name'
                  AND a.grantee = (SELECT oid FROM pg_roles WHERE rolname = current_user)
                  AND a.privilege_type = 'SELECT') THEN
            RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
                MESSAGE = format('permission denied: sql_query reads only the tables granted to it, not %I.%I',
                                 node->>'Schema', node->>'Relation Name');
        END IF;
        IF node->>'Node Type' = 'Function Scan' AND NOT coalesce(node->>'Schema' = 'pg_catalog'
                AND node->>'Function Name' IN (
                'generate_series', 'generate_subscripts', 'unnest', 'json_each', 'json_each_text', 'jsonb_each',
                'jsonb_each_text', 'json_array_elements', 'json_array_elements_text', 'jsonb_array_elements',
                'jsonb_array_elements_text', 'json_object_keys', 'jsonb_object_keys', 'json_to_record',
                'json_to_recordset', 'jsonb_to_record', 'jsonb_to_recordset', 'json_populate_record',
                'json_populate_recordset', 'jsonb_populate_record', 'jsonb_populate_recordset', 'jsonb_path_query',
                'regexp_matches', 'regexp_split_to_table', 'string_to_table', 'to_tsquery', 'plainto_tsquery',
                'phraseto_tsquery', 'websearch_to_tsquery', 'to_tsvector'), false) THEN
            RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
                MESSAGE = format('permission denied: sql_query may not read from the function %s',
                                 coalesce(node->>'Function Name', node->>'Function Call'));
        END IF;
    END LOOP;
    -- Each string of the plan on its own (a quote in one cannot hide text in the next).
    SELECT m INTO forbidden
      FROM jsonb_path_query(plan, 'strict $.** ? (@.type() == "object")') AS o, jsonb_each(o) AS kv,
           jsonb_path_query(kv.value, 'strict $.**') AS v,
           substring(regexp_replace(lower(v #>> '{}'), '("([^"]|"")*")|''([^'']|'''')*''', '\1', 'g') FROM
               '\m(current_user|session_user|current_role|system_user|user|getpgusername|current_setting'
               '|current_query|regrole|to_regrole|acl[a-z0-9_]*|makeaclitem|has_[a-z0-9_]*_privilege|pg_has_role'
               '|pg_get_[a-z0-9_]*|pg_stat_get_[a-z0-9_]*|pg_show_all_settings|pg_settings_get_flags'
               '|pg_identify_object[a-z0-9_]*|pg_describe_object|[a-z0-9_]*blocking_pids|[a-z0-9_]*_to_xml[a-z0-9_]*'
               '|ts_stat|[a-z0-9_]*description|pg_prepared_statement|pg_cursor|pg_lock_status'
               '|pg_terminate_backend|pg_cancel_backend|agentstream_[a-z0-9_]*)\M') AS m
     WHERE kv.key NOT IN ('Alias', 'CTE Name', 'Plan', 'Plans') AND jsonb_typeof(v) = 'string' AND m IS NOT NULL
     LIMIT 1;
    IF forbidden IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = format('permission denied: sql_query may not call %s (it names roles, reads the catalogs '
                             'or runs SQL of its own)', forbidden);
    END IF;

    LOOP
        FETCH rows_cursor INTO r;
        EXIT WHEN NOT FOUND;
        IF n >= max_rows THEN
            item := NULL;
            stop := 'rows';
            RETURN NEXT;
            RETURN;
        END IF;
        n := n + 1;
        whole := to_json(r);
        size := octet_length(whole::text);
        IF used + size <= max_bytes THEN
            used := used + size;
            item := whole;
            stop := NULL;
            RETURN NEXT;
            CONTINUE;
        END IF;
        room := max_bytes - used;
        -- What the row's keys and punctuation take; the rest is shared between its values.
        SELECT count(*), coalesce(sum(octet_length(to_json(e.key)::text) + 2), 0) + 2
          INTO ncols, skeleton FROM json_each(whole) AS e;
        share := (room - skeleton) / greatest(ncols, 1);
        item := NULL;
        IF share >= 16 THEN
            SELECT json_object_agg(e.key, public.agentstream_cut_json(e.value, share::integer) ORDER BY e.i)
              INTO item FROM json_each(whole) WITH ORDINALITY AS e(key, value, i);
            IF octet_length(item::text) > room THEN
                item := NULL;
            END IF;
        END IF;
        stop := 'bytes';
        RETURN NEXT;
        RETURN;
    END LOOP;
END
$$;
ALTER FUNCTION agentstream_readonly_query(text, integer, integer) OWNER TO agentstream_readonly;
REVOKE ALL ON FUNCTION agentstream_readonly_query(text, integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agentstream_readonly_query(text, integer, integer) TO agentstream_readonly;

-- 0005's overload (for workers older than 0010; the model's SQL could call it too) gets the same checks:
-- it calls the one above, and still returns up to max_rows + 1 rows (the extra one says it truncated).
CREATE OR REPLACE FUNCTION agentstream_readonly_query(query text, max_rows integer)
RETURNS SETOF json
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
    SELECT item FROM public.agentstream_readonly_query(query, max_rows + 1, 2147483647) WHERE item IS NOT NULL
$$;
ALTER FUNCTION agentstream_readonly_query(text, integer) OWNER TO agentstream_readonly;
REVOKE ALL ON FUNCTION agentstream_readonly_query(text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agentstream_readonly_query(text, integer) TO agentstream_readonly;
