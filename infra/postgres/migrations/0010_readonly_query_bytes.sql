-- sql_query's byte limit, counted and enforced inside PostgreSQL (services/tools/sql.py says why): a
-- row limit alone lets one huge value (a 50 MB text) cross the wire into the tool worker's memory.
--
-- A new overload with max_bytes; the two-argument function of 0005 stays for workers of the previous
-- release during a rolling upgrade (docs/upgrades.md).

-- A JSON value cut to at most `budget` bytes of JSON text: a string keeps its beginning (with "…"), any
-- other value becomes the beginning of its JSON text, as a string. Halving until it fits keeps
-- multi-byte characters whole (left() counts characters).
CREATE OR REPLACE FUNCTION agentstream_cut_json(value json, budget integer)
RETURNS json
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog
AS $$
DECLARE
    whole text := CASE json_typeof(value) WHEN 'string' THEN value #>> '{}' ELSE value::text END;
    n integer := greatest(budget - 8, 0);
    piece text;
BEGIN
    IF octet_length(value::text) <= budget THEN
        RETURN value;
    END IF;
    LOOP
        piece := to_json(left(whole, n) || '…')::text;
        EXIT WHEN octet_length(piece) <= budget OR n = 0;
        n := n / 2;
    END LOOP;
    RETURN piece::json;
END
$$;

-- One read-only query, as 0005's function, returning (item, stop): each row as JSON with stop NULL,
-- while the rows' JSON texts add up to at most max_bytes; then one last row saying why it stopped:
--   (NULL, 'rows')        a row past max_rows exists (it is not converted);
--   (cut row, 'bytes')    the next row did not fit: its values cut so that it fits what was left
--                         (NULL when not even that fits), and nothing after it is read.
CREATE OR REPLACE FUNCTION agentstream_readonly_query(query text, max_rows integer, max_bytes integer)
RETURNS TABLE (item json, stop text)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
DECLARE
    r record;
    n integer := 0;
    used bigint := 0;
    whole json;
    size bigint;
    room bigint;
    skeleton bigint;
    ncols integer;
    share bigint;
BEGIN
    FOR r IN EXECUTE query LOOP
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
