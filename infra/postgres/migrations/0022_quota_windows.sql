-- Budgets over time per cell (issue 36, item 4; docs/security.md, "Quotas per tenant"): tokens per hour and
-- per day, task submissions per second, counted by the cell's planners where they count them today (a
-- model step's tokens, a task's admission) and shared by all the planners of the cell.
--
-- quota_usage: one row per cell (topic prefix) and budget, holding the use of the budget's current fixed
-- window (UTC-aligned second, hour or day: streams/store/budgets.py says which). A charge for a newer window
-- starts it over; a charge stamped with an older window (a planner whose clock is behind) counts in the
-- newer one, never resets it.
--
-- quota_charges: what was charged, by key (a model step's id, a run's task), so that a redelivered step or
-- task (a planner that crashed between the charge and its transition, a rebalance) is not counted twice.
-- Keys are kept a day (the longest window) and pruned by the charges themselves (every 256th, by the key's
-- hash), so no timer is needed.
--
-- Only the planners charge: the tables and the function are the planner role's (and the owner's); no
-- client, tenant, tool or reader login can read or move a cell's counters.
CREATE TABLE quota_usage (
    prefix       text        NOT NULL,
    budget       text        NOT NULL,
    window_start timestamptz NOT NULL,
    used         bigint      NOT NULL,
    PRIMARY KEY (prefix, budget)
);

CREATE TABLE quota_charges (
    prefix     text        NOT NULL,
    charge_key text        NOT NULL,
    charged_at timestamptz NOT NULL,
    PRIMARY KEY (prefix, charge_key)
);
CREATE INDEX quota_charges_age ON quota_charges (charged_at);

-- Charge p_amounts to the budgets p_budgets of cell p_prefix (each in its window p_windows[i], which the
-- caller computes), once per p_key (NULL: a read, nothing charged); return each budget's use in its window
-- after the charge (0 for a budget with no use in the window). One round trip, one ledger row and one row
-- per budget charged.
CREATE FUNCTION agentstream_charge_quota(p_prefix text, p_key text, p_at timestamptz, p_budgets text[],
                                         p_windows timestamptz[], p_amounts bigint[])
RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    fresh boolean := false;
    used_now bigint;
    result bigint[] := '{}';
BEGIN
    IF p_key IS NOT NULL THEN
        INSERT INTO quota_charges (prefix, charge_key, charged_at) VALUES (p_prefix, p_key, p_at)
        ON CONFLICT DO NOTHING;
        fresh := FOUND;
        IF fresh AND (hashtext(p_key) & 255) = 0 THEN
            DELETE FROM quota_charges WHERE charged_at < p_at - interval '1 day';
        END IF;
    END IF;
    FOR i IN 1 .. coalesce(array_length(p_budgets, 1), 0) LOOP
        used_now := NULL;
        IF fresh AND p_amounts[i] > 0 THEN
            INSERT INTO quota_usage AS u (prefix, budget, window_start, used)
            VALUES (p_prefix, p_budgets[i], p_windows[i], p_amounts[i])
            ON CONFLICT (prefix, budget) DO UPDATE
                SET used = CASE WHEN u.window_start >= EXCLUDED.window_start THEN u.used + EXCLUDED.used
                                ELSE EXCLUDED.used END,
                    window_start = greatest(u.window_start, EXCLUDED.window_start)
            RETURNING u.used INTO used_now;
        ELSE
            SELECT CASE WHEN u.window_start >= p_windows[i] THEN u.used ELSE 0 END INTO used_now
            FROM quota_usage u WHERE u.prefix = p_prefix AND u.budget = p_budgets[i];
        END IF;
        result := result || coalesce(used_now, 0);
    END LOOP;
    RETURN result;
END $$;

REVOKE ALL ON quota_usage, quota_charges FROM PUBLIC;
REVOKE ALL ON FUNCTION agentstream_charge_quota(text, text, timestamptz, text[], timestamptz[], bigint[]) FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE ON quota_usage TO agentstream_planner;
GRANT SELECT, INSERT, DELETE ON quota_charges TO agentstream_planner;
GRANT EXECUTE ON FUNCTION agentstream_charge_quota(text, text, timestamptz, text[], timestamptz[], bigint[])
    TO agentstream_planner;
