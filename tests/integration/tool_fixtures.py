"""Tools the tool-service tests serve (tests/integration/test_tools.py), and the built-ins with test limits.

Executions are counted in ``test_tool_runs`` and side effects in ``test_effects``; the tests create both.
"""

from __future__ import annotations

import asyncio

from agentstream.services.tools.builtin import RetrieveConfig, retrieve_tool
from agentstream.services.tools.registry import ToolContext, tool
from agentstream.services.tools.sql import SqlQueryConfig, sql_query_tool
from agentstream.streams.core.errors import ToolError

RUNS_TABLE = "test_tool_runs"


@tool(description="Fail retriably for the first `failures` executions with this key, then succeed.",
      max_attempts=3, backoff_s=0.05)
async def flaky(key: str, failures: int, ctx: ToolContext) -> str:
    assert ctx.pool is not None
    await ctx.pool.execute(f"INSERT INTO {RUNS_TABLE} (key, step_id, attempt) VALUES ($1, $2, $3)",
                           key, ctx.step_id, ctx.attempt)
    n = await ctx.pool.fetchval(f"SELECT count(*) FROM {RUNS_TABLE} WHERE key = $1", key)
    if n <= failures:
        raise ToolError(f"transient failure {n} of {failures}", retriable=True)
    return f"ok after {n} executions"


@tool(description="`flaky`, declared idempotent: its calls keep no tool_calls row.", max_attempts=3,
      backoff_s=0.05, idempotent=True)
async def flaky_read(key: str, failures: int, ctx: ToolContext) -> str:
    return await flaky(key, failures, ctx)


@tool(description="Sleep past the tool's 0.5 s limit.", timeout_s=0.5)
async def slow(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "woke up"


@tool(description="Record a side effect, then take `seconds` (long enough to be killed meanwhile).", timeout_s=120)
async def effect_then_sleep(label: str, seconds: float, ctx: ToolContext) -> str:
    assert ctx.pool is not None
    await ctx.pool.execute("INSERT INTO test_effects (run_id, step_id, label) VALUES ($1, $2, $3)",
                           ctx.run_id, ctx.step_id, label)
    await asyncio.sleep(seconds)
    return f"recorded {label}"


sql_query = sql_query_tool(SqlQueryConfig(statement_timeout_s=0.5, max_rows=5))
retrieve = retrieve_tool(RetrieveConfig(timeout_s=5.0, max_attempts=1))
