"""The tool service: ToolCallRequested in, ToolCallCompleted out; a step's tool runs at most once.

Before a tool runs, a row keyed by the step id is inserted in ``tool_calls`` (status ``running``); when
it finishes the row gets the result. A redelivered request (a planner republishing after a crash, a
rebalance) finds the row: a finished call is answered from it (``replayed=true``) without running the
tool again; a call still marked ``running`` was interrupted mid-execution (its worker died), and
because its effects may or may not have happened, it is not run again either: the result says so.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import asyncpg

from services.tools.registry import Tool, ToolArgumentError, ToolContext, ToolError
from streams.events import Event, ToolCallCompleted, ToolCallRequested
from streams.runtime import Context, Runtime, ServiceConfig, ServiceRunner

log = logging.getLogger(__name__)
SERVICE = "tools"


class ToolService:
    def __init__(self, runtime: Runtime, pool: asyncpg.Pool, tools: list[Tool]) -> None:
        self.runtime = runtime
        self.pool = pool
        self.tools = {t.name: t for t in tools}

    def service(self, *, concurrency: int = 32, **overrides) -> ServiceRunner:
        topics = self.runtime.topics
        config = ServiceConfig(name=SERVICE, topics=[topics.tool_requests], group_id=topics.group(SERVICE),
                               concurrency=concurrency, **overrides)
        return ServiceRunner(self.runtime, config, self.handle)

    async def handle(self, event: Event, ctx: Context) -> None:
        if not isinstance(event, ToolCallRequested):
            raise TypeError(f"the tool service does not handle {type(event).__name__}")
        started = time.perf_counter()
        tool = self.tools.get(event.tool)
        if tool is None:
            await self._reply(ctx, event, started, error=f"unknown tool {event.tool!r}; this worker serves "
                                                          f"{', '.join(sorted(self.tools)) or 'none'}")
            return
        try:
            arguments = tool.validate(json.loads(event.arguments))
        except (json.JSONDecodeError, ToolArgumentError) as exc:
            await self._reply(ctx, event, started, error=f"invalid arguments: {exc}")
            return
        previous = await self._claim(event, arguments)
        if previous is not None:
            await self._replay(ctx, event, started, previous)
            return
        try:
            value = await asyncio.wait_for(tool.call(arguments, ToolContext(event.run_id, event.step_id, self.pool)),
                                           tool.timeout_s)
            result = json.dumps(value)
        except TimeoutError:
            await self._finish(event, error=f"timed out after {tool.timeout_s:g} s")
            await self._reply(ctx, event, started, error=f"{tool.name} timed out after {tool.timeout_s:g} s")
            return
        except ToolError as exc:
            await self._finish(event, error=str(exc))
            await self._reply(ctx, event, started, error=str(exc))
            return
        except (TypeError, ValueError) as exc:
            await self._finish(event, error=f"{type(exc).__name__}: {exc}")
            await self._reply(ctx, event, started, error=f"{tool.name} failed: {exc}")
            return
        await self._finish(event, result=result)
        await self._reply(ctx, event, started, result=result)

    async def _claim(self, event: ToolCallRequested, arguments: dict[str, Any]) -> asyncpg.Record | None:
        """Insert the running row; return the existing row when this step was seen before."""
        inserted = await self.pool.fetchval(
            """INSERT INTO tool_calls (step_id, run_id, tool, arguments, status)
               VALUES ($1, $2, $3, $4::jsonb, 'running') ON CONFLICT (step_id) DO NOTHING RETURNING step_id""",
            event.step_id, event.run_id, event.tool, json.dumps(arguments))
        if inserted is not None:
            return None
        return await self.pool.fetchrow(
            "SELECT status, result::text AS result, error FROM tool_calls WHERE step_id = $1", event.step_id)

    async def _finish(self, event: ToolCallRequested, *, result: str | None = None, error: str | None = None) -> None:
        await self.pool.execute(
            """UPDATE tool_calls SET status = $2, result = $3::jsonb, error = $4, finished_at = now()
               WHERE step_id = $1""",
            event.step_id, "failed" if error else "succeeded", result, error)

    async def _replay(self, ctx: Context, event: ToolCallRequested, started: float, row: asyncpg.Record) -> None:
        if row["status"] == "succeeded":
            await self._reply(ctx, event, started, result=row["result"], replayed=True)
        elif row["status"] == "failed":
            await self._reply(ctx, event, started, error=row["error"], replayed=True)
        else:
            log.warning("tools: %s was interrupted mid-execution; not running it again", event.step_id)
            await self._reply(ctx, event, started, replayed=True,
                              error="interrupted: an earlier attempt started but did not finish; the tool was "
                                    "not run again because its effects may already have happened")

    async def _reply(self, ctx: Context, event: ToolCallRequested, started: float, *, result: str | None = None,
                     error: str | None = None, replayed: bool = False) -> None:
        await ctx.emit(self.runtime.topics.tool_results, ToolCallCompleted.build(
            run_id=event.run_id, step=event.step_id, service=SERVICE, attempt=event.attempt,
            parent_step_id=event.parent_step_id, tool=event.tool, ok=error is None, result=result, error=error,
            duration_ms=(time.perf_counter() - started) * 1000, replayed=replayed))
