"""``sql_query``: a read-only SQL query for the model, on what the ``agentstream_readonly`` role may read.

The model writes the SQL, so the database, not this module, has to make it harmless. Migration
0005_tool_roles.sql creates the role ``agentstream_readonly`` (SELECT on ``documents`` only) and the
function ``agentstream_readonly_query``, SECURITY DEFINER and owned by that role; 0010 gives it a byte
limit, 0016 a check of the query's plan. A call runs, on a connection of the tool's own pool (``query_pool``):

    BEGIN READ ONLY;
    SET LOCAL temp_file_limit = …; SET LOCAL ROLE agentstream_readonly; SET LOCAL statement_timeout = …;
    SELECT item, stop FROM agentstream_readonly_query($1, $2, $3);   -- the model's SQL is a bound parameter
    ROLLBACK;

Why each piece:

- **the SECURITY DEFINER function**, not only ``SET LOCAL ROLE``: with ``SET ROLE`` alone the model's
  SQL can undo the role (``set_config('role', 'none', true)``) and then run dynamic SQL as the pool's
  login (``ts_stat('select … from tool_calls')``, ``query_to_xml``): tested, it works. PostgreSQL
  refuses to change ``role`` or ``session_authorization`` inside a SECURITY DEFINER function, so in
  there the SQL stays ``agentstream_readonly`` whatever it calls;
- **one statement only**: the function opens the SQL as a cursor (``OPEN … FOR EXECUTE``), which
  PostgreSQL allows only for a single query that returns rows: ``select 1; drop …`` fails with
  "cannot open multi-query plan as cursor", ``INSERT``/``CREATE`` with "cannot open … as cursor". Only
  then is it prefixed with anything (``EXPLAIN``, below): a plain ``EXECUTE`` would run a second statement;
- **only the tables granted to the role** (0016): PUBLIC may read the system catalogs (``pg_roles``,
  ``pg_stat_activity``, ``pg_user``, ``pg_settings``: role names, other sessions), and no role can be
  refused what PUBLIC may do. So before a row is read the function plans the query (``EXPLAIN
  (VERBOSE, FORMAT JSON)``) and refuses, as "permission denied", a relation not granted to
  ``agentstream_readonly`` itself (a view shows as the tables under it), a function in FROM other than
  the set-returning and text-search ones it lists, and, anywhere in the plan's expressions, the
  functions and types that name roles or run SQL of their own (``CURRENT_USER`` and its kin,
  ``regrole``, ``aclitem``, ``pg_get_userbyid``, ``has_*_privilege``, ``current_setting``,
  ``query_to_xml``, ``pg_stat_get_*``…); ``regrole``, ``aclitem`` and ``U&`` escapes are refused in
  the text already (their input functions look a role up while the query is parsed). Server facts
  that name no role stay readable (``version()``, ``current_database()``);
- **temp_file_limit** (``max_temp_bytes``): a sort or hash that spills to disk stops there. It is a
  superuser setting, so the tool's login sets it, before ``SET ROLE`` (migration 0016 lets
  ``agentstream_tools`` set it); ``agentstream_readonly`` may not, so the SQL cannot raise it. A login
  that may not set it gets a clear error, not a query without the limit;
- **READ ONLY transaction**: writes in data-modifying CTEs and functions (``nextval``, …) fail too;
- **statement_timeout**: the whole function call is one protocol message, so the timer armed when it
  starts cannot be disarmed by ``set_config('statement_timeout', …)`` inside it; the tool's own
  timeout is the last resort;
- **row limit**: the function stops at the row after ``max_rows`` (and says so, without converting it);
- **byte limit**, in PostgreSQL: the function adds up the rows' JSON text and stops before ``max_bytes``;
  the row that does not fit comes back with its values cut to fit (``…`` at the end) and nothing after
  it is read. A 50 MB value is cut inside the server and never crosses the wire, so no single call can
  exhaust a worker's memory; ``max_result_chars`` then bounds what the model is handed;
- **its own pool** (``query_pool``, ``pool_size`` connections): a slow or huge query waits for, and
  holds, only these connections, never the ones the tool service records its calls and results with;
- **ROLLBACK** (never commit) and ``pg_advisory_unlock_all()``: the pool does not reset connections on
  release (streams/store/db.py), so session state the SQL might leave — ``set_config(…, false)``, a
  session advisory lock — is undone before the connection goes back. A call that is cancelled or fails
  mid-way terminates its connection instead;
- **JSON**: rows come back as ``to_json(row)``, so dates, numerics, uuids, bytea and vectors arrive as
  JSON already (PostgreSQL's own rendering), with the columns in order.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import asyncpg

from agentstream.services.tools.registry import Tool, ToolContext, tool
from agentstream.streams.core.errors import ToolError
from agentstream.streams.store import db

ROLE = "agentstream_readonly"
FUNCTION = "agentstream_readonly_query"
READABLE = ("documents",)
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclass(frozen=True, kw_only=True)
class SqlQueryConfig:
    """Limits of ``sql_query``; the role and function come from migration 0005."""

    statement_timeout_s: float = 5.0
    max_rows: int = 100
    #: Most bytes of rows (their JSON text) PostgreSQL hands back: counted and cut in the server, so a
    #: huge value never reaches the worker. Below ``max_result_chars``, so that a cut row still fits it.
    max_bytes: int = 16_000
    #: Longest JSON result handed back; rows past it are dropped (``truncated`` says so).
    max_result_chars: int = 20_000
    max_query_chars: int = 10_000
    #: Connections of the tool's own pool (``query_pool``); a call waits ``statement_timeout_s`` for one.
    pool_size: int = 2
    #: Most bytes of temporary files one query may write (sorts and hashes past ``work_mem`` spill to
    #: disk): PostgreSQL's ``temp_file_limit`` for the call's transaction, rounded up to kB.
    max_temp_bytes: int = 64 * 1024 * 1024
    role: str = ROLE

    def __post_init__(self) -> None:
        if not _IDENTIFIER.match(self.role):
            raise ValueError(f"SqlQueryConfig: role {self.role!r} is not a plain lower-case identifier")
        if (self.statement_timeout_s <= 0 or self.max_rows < 1 or self.max_result_chars < 100 or self.max_bytes < 100
                or self.pool_size < 1 or self.max_temp_bytes < 1):
            raise ValueError("SqlQueryConfig: statement_timeout_s, max_rows, max_bytes (100 or more), "
                             "max_result_chars (100 or more), pool_size and max_temp_bytes must be positive")


async def query_pool(database_url: str, config: SqlQueryConfig) -> asyncpg.Pool:
    """The small pool ``sql_query`` runs on, apart from the tool service's own (see the module docstring)."""
    return await db.create_pool(database_url, min_size=1, max_size=config.pool_size)


async def run_query(pool: asyncpg.Pool, query: str, config: SqlQueryConfig) -> dict[str, Any]:
    """Run ``query`` as described in the module docstring; PostgreSQL's refusals become ``ToolError``s."""
    if not query.strip():
        raise ToolError("the query is empty")
    if len(query) > config.max_query_chars:
        raise ToolError(f"the query is longer than {config.max_query_chars} characters")
    timeout_ms = max(1, int(config.statement_timeout_s * 1000))
    temp_kb = -(-config.max_temp_bytes // 1024)
    error: asyncpg.PostgresError | None = None
    setting_up = True  # whether an error came from the SETs, before the query
    rows: list[asyncpg.Record] = []
    try:
        conn = await pool.acquire(timeout=config.statement_timeout_s)
    except TimeoutError:
        raise ToolError(f"sql_query is busy: its {config.pool_size} connection(s) stayed taken for "
                        f"{config.statement_timeout_s:g} s", retriable=True) from None
    clean = False
    try:
        transaction = conn.transaction(readonly=True)
        await transaction.start()
        try:
            # temp_file_limit first: it is checked against the login, which may set it; the role may not.
            await conn.execute(f"SET LOCAL temp_file_limit = '{temp_kb}kB'; SET LOCAL ROLE {config.role}; "
                               f"SET LOCAL statement_timeout = {timeout_ms}")
            setting_up = False
            rows = await conn.fetch(f"SELECT item, stop FROM {FUNCTION}($1, $2, $3)", query, config.max_rows,
                                    config.max_bytes)
        except asyncpg.PostgresError as exc:
            error = exc
        await transaction.rollback()
        await conn.execute("SELECT pg_advisory_unlock_all()")
        clean = True
    finally:
        if not clean:  # cancelled or broken mid-way: whatever state the SQL left goes with the connection
            conn.terminate()
        await pool.release(conn)
    if error is not None and setting_up and isinstance(error, asyncpg.InsufficientPrivilegeError):
        raise ToolError(f"sql_query is not set up in this database: {error} (migration 0016_sql_query_limits "
                        "lets agentstream_tools set temp_file_limit; the tool's login needs that role)")
    if error is not None:
        raise ToolError(_explain(error, config))
    stop = rows[-1]["stop"] if rows else None
    return _result([r["item"] for r in rows if r["item"] is not None], config, stop)


def _explain(exc: asyncpg.PostgresError, config: SqlQueryConfig) -> str:
    if isinstance(exc, asyncpg.QueryCanceledError):
        return f"the query was cancelled after its time limit of {config.statement_timeout_s:g} s"
    if isinstance(exc, asyncpg.InvalidCursorDefinitionError):
        return f"only one read-only query (SELECT, WITH … SELECT, VALUES, TABLE) may run: {exc}"
    if isinstance(exc, asyncpg.ReadOnlySQLTransactionError):
        return f"the database is read-only for this tool: {exc}"
    if isinstance(exc, asyncpg.InsufficientPrivilegeError):
        return f"{exc}; this tool may read only: {', '.join(READABLE)}"
    if isinstance(exc, asyncpg.ConfigurationLimitExceededError) and "temp_file_limit" in str(exc):
        return f"the query needs more temporary disk space than its limit of {config.max_temp_bytes} bytes"
    if isinstance(exc, asyncpg.UndefinedFunctionError) and FUNCTION in str(exc):
        return "sql_query is not set up in this database (migration 0010_readonly_query_bytes has not run)"
    return f"the query failed: {type(exc).__name__}: {exc}"


def _number(text: str) -> float | str:
    """A JSON number with a fraction: a float when the float says exactly the same, else the digits as a
    string (a numeric(20,4) amount must not come back rounded)."""
    value = float(text)
    if math.isfinite(value) and Decimal(repr(value)) == Decimal(text):
        return value
    return text


class _Columns(list):
    """A row's (name, value) pairs, in order, duplicates kept (only the outer object of each row)."""


def _plain(value: Any) -> Any:
    if isinstance(value, _Columns):
        return {k: _plain(v) for k, v in value}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _result(raw_rows: list[str], config: SqlQueryConfig, stop: str | None = None) -> dict[str, Any]:
    """``{"columns", "rows", "row_count", "truncated", "truncated_by"}`` within ``max_result_chars``.
    ``stop`` is why PostgreSQL stopped (``rows``, ``bytes``: the last row's values were cut) or None;
    ``truncated_by`` says which limit cut the result (``rows``, ``bytes``, ``chars``), None when whole."""
    truncated_by = stop if stop in ("rows", "bytes") else ("rows" if len(raw_rows) > config.max_rows else None)
    pairs = [json.loads(r, object_pairs_hook=_Columns, parse_float=_number, parse_constant=str)
             for r in raw_rows[: config.max_rows]]
    columns = [name for name, _ in pairs[0]] if pairs else []
    rows = [[_plain(value) for _, value in row] for row in pairs]
    budget = config.max_result_chars - len(json.dumps(columns)) - 80
    size, kept = 0, 0
    for row in rows:
        size += len(json.dumps(row)) + 1
        if size > budget:
            truncated_by = "chars"
            break
        kept += 1
    return {"columns": columns, "rows": rows[:kept], "row_count": kept, "truncated": truncated_by is not None,
            "truncated_by": truncated_by}


def sql_query_tool(config: SqlQueryConfig | None = None) -> Tool:
    """The ``sql_query`` tool bound to ``config``."""
    config = config or SqlQueryConfig()

    @tool(name="sql_query",
          description=f"Run one read-only SQL query (PostgreSQL) on the tables {', '.join(READABLE)}; returns "
                      f"columns and at most {config.max_rows} rows. Name the columns you need "
                      "(documents.embedding is large).",
          timeout_s=config.statement_timeout_s + 2.0, idempotent=True)  # a read-only transaction
    async def sql_query(query: str, ctx: ToolContext) -> dict[str, Any]:
        if ctx.query_pool is None:  # never the service's own pool: see the module docstring
            raise ToolError("sql_query needs its own database pool (ToolContext.query_pool)")
        return await run_query(ctx.query_pool, query, config)

    return sql_query


__all__ = ["SqlQueryConfig", "query_pool", "run_query", "sql_query_tool"]
