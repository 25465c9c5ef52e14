"""agentstream agents as MCP tools, on the official SDK's ``MCPServer``.

The server is a client of the pipeline, like the CLI: each tool call submits a task through one shared
``AgentClient`` (Kafka is the intake), waits for the run's outcome, and returns it. Tools:

- ``run_agent(task, tools?, max_steps?, session?, output_schema?, deadline_s?)``: any task, with the tools
  the caller names (default: every registered tool);
- one tool per ``AgentToolset`` (``agentstream mcp serve --toolset NAME=TOOL,TOOL``): ``NAME(task, session?)``
  runs the task with exactly those tools, so an MCP client sees a purpose-built agent rather than a
  generic runner. When named agent definitions exist (their own issue), each will become such a tool.

Results. A completed run is the answer as text; a run with an ``output_schema`` also gives its parsed
output as ``structuredContent`` (an object as is, any other JSON value as ``{"result": value}``, since
MCP before 2026-07-28 allows only objects there). A rejected task, a failed run (its ``error_code`` and
error) or a run that has not ended after ``wait_s`` is an error result (``isError``) saying so, with the
run id; the run id is in the result's ``_meta`` (``agentstream/run_id``) either way.

Progress. When the MCP client asks for progress (a ``progressToken``), the model's tokens are followed
as they are generated (``AgentClient.stream``) and sent as progress notifications: the count of chunks
so far, and as message the current step's text so far (its end), at most every ``PROGRESS_EVERY_S``.

Cancellation. A call the MCP client cancels (or that the server is stopped during) cancels its run: no
one waits for that answer any more, and a run left going would spend the model's time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, cast

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from agentstream.streams.client.agent_client import AgentClient
from agentstream.streams.client.outcomes import RunResult
from agentstream.streams.core.errors import ConfigError, TaskRejected
from agentstream.streams.core.task_rules import MAX_STEPS_LIMIT

log = logging.getLogger(__name__)

#: The key of the run id in a result's ``_meta``.
RUN_ID_META = "agentstream/run_id"
#: Seconds between two progress notifications of one call, at least (a model's chunks can be many).
PROGRESS_EVERY_S = 0.1
#: Characters of the current step's text a progress message carries (its end).
PROGRESS_MESSAGE_CHARS = 300
INSTRUCTIONS = ("Runs agentstream agents: each tool call is one agent run (model steps and tool calls on an "
                "event-streamed pipeline); the result is the run's answer.")


@dataclass(frozen=True, kw_only=True)
class AgentToolset:
    """An MCP tool that runs tasks with a fixed set of agentstream tools."""

    name: str
    tools: tuple[str, ...]
    description: str = ""
    max_steps: int = 8

    @classmethod
    def parse(cls, spec: str) -> AgentToolset:
        """``NAME=TOOL,TOOL`` (``NAME=`` alone: no tools, the model answers by itself)."""
        name, eq, tools = spec.partition("=")
        name = name.strip()
        if not eq or not name.replace("_", "").replace("-", "").isalnum() or len(name) > 64:
            raise ConfigError(f"toolset {spec!r}: expected NAME=TOOL,TOOL with NAME of letters, digits, '_', '-'")
        return cls(name=name, tools=tuple(t.strip() for t in tools.split(",") if t.strip()))


@dataclass(frozen=True, kw_only=True)
class ServeOptions:
    """How ``agentstream mcp serve`` answers."""

    #: Seconds a call waits for its run's outcome before it answers that the run goes on.
    wait_s: float = 300.0
    toolsets: tuple[AgentToolset, ...] = ()
    #: The server's name, as MCP clients show it.
    name: str = "agentstream"
    #: The SDK's log level (and, over HTTP, uvicorn's): DEBUG, INFO, WARNING, ERROR or CRITICAL.
    log_level: str = "WARNING"


def agents_server(client: AgentClient, options: ServeOptions | None = None) -> MCPServer:
    """The MCP server whose tools run agents through ``client`` (started by the caller, who also closes it)."""
    options = options or ServeOptions()
    runner = _Runner(client, options.wait_s)
    level = options.log_level.upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ConfigError(f"unknown log level {options.log_level!r}")
    server: MCPServer = MCPServer(options.name, instructions=INSTRUCTIONS, log_level=cast(Any, level))
    agent_runs = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=True)

    async def run_agent(
        task: Annotated[str, Field(description="What the agent should do.")],
        ctx: Context,
        tools: Annotated[list[str] | None, Field(
            description="agentstream tools the run may call (default: every registered tool).")] = None,
        max_steps: Annotated[int, Field(ge=1, le=MAX_STEPS_LIMIT,
                                        description="Most steps (model and tool) the run may take.")] = 8,
        session: Annotated[str | None, Field(
            description="A conversation id: the task is a turn of it and sees its earlier turns.")] = None,
        output_schema: Annotated[dict[str, Any] | None, Field(
            description="A JSON Schema the answer must match; the parsed answer is the structured content.")] = None,
        deadline_s: Annotated[float | None, Field(gt=0, description="Seconds after which the run fails.")] = None,
    ) -> CallToolResult:
        return await runner.run(ctx, task, tools=tools, max_steps=max_steps, session=session,
                                output_schema=output_schema, deadline=deadline_s)

    server.add_tool(run_agent, name="run_agent", annotations=agent_runs,
                    description="Run an agentstream agent on a task and return its answer (structured content "
                                "when an output_schema is given).")
    names = {"run_agent"}
    for toolset in options.toolsets:
        if toolset.name in names:
            raise ConfigError(f"two MCP tools are named {toolset.name!r}")
        names.add(toolset.name)
        server.add_tool(_toolset_tool(runner, toolset), name=toolset.name, annotations=agent_runs,
                        description=toolset.description or (
                            f"Run an agentstream agent on a task with the tools {', '.join(toolset.tools)}."
                            if toolset.tools else "Run an agentstream agent on a task (no tools)."))
    return server


def _toolset_tool(runner: _Runner, toolset: AgentToolset) -> Callable[..., Awaitable[CallToolResult]]:
    async def run_toolset(
        task: Annotated[str, Field(description="What the agent should do.")],
        ctx: Context,
        session: Annotated[str | None, Field(
            description="A conversation id: the task is a turn of it and sees its earlier turns.")] = None,
    ) -> CallToolResult:
        return await runner.run(ctx, task, tools=list(toolset.tools), max_steps=toolset.max_steps, session=session)

    return run_toolset


class _Runner:
    """Submits, follows and answers one call's run."""

    def __init__(self, client: AgentClient, wait_s: float) -> None:
        self.client = client
        self.wait_s = wait_s

    async def run(self, ctx: Context, task: str, *, tools: Sequence[str] | None, max_steps: int,
                  session: str | None, output_schema: dict[str, Any] | None = None,
                  deadline: float | None = None) -> CallToolResult:
        try:
            run_id = await self.client.submit(task, tools=None if tools is None else list(tools), max_steps=max_steps,
                                              session=session, output_schema=output_schema, deadline=deadline)
        except TaskRejected as exc:
            return _error(f"the task was refused: {exc}")
        follower = asyncio.create_task(self._progress(ctx, run_id)) if _wants_progress(ctx) else None
        try:
            result = await self.client.wait(run_id, timeout=self.wait_s)
        except TimeoutError:
            return _error(f"run {run_id} has not ended after {self.wait_s:g} s; it goes on (agentstream status "
                          f"{run_id})", run_id)
        except BaseException:  # cancelled: the MCP client gave up, or the server stops
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await asyncio.wait_for(self.client.cancel(run_id, "the MCP call was cancelled"), 5.0)
            raise
        finally:
            if follower is not None:
                follower.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await follower
        return outcome(result)

    async def _progress(self, ctx: Context, run_id: str) -> None:
        """The run's tokens as progress notifications (best effort: a failure here never fails the call)."""
        chunks, step, text, sent_at = 0, "", "", 0.0
        try:
            async for token in self.client.stream(run_id):
                chunks += 1
                if token.step_id != step:
                    step, text, sent_at = token.step_id, "", 0.0
                text += token.text
                if time.monotonic() - sent_at >= PROGRESS_EVERY_S:
                    sent_at = time.monotonic()
                    await ctx.report_progress(chunks, None, text[-PROGRESS_MESSAGE_CHARS:])
        except Exception as exc:
            log.info("mcp serve: progress of %s stopped: %s", run_id, exc)


def _wants_progress(ctx: Context) -> bool:
    """Whether the MCP client asked for progress: a ``progressToken`` in the request's ``_meta`` (the SDK's
    in-process dispatch, used by no transport, calls a callback instead and is not seen here)."""
    request = ctx.request_context
    raw = request.params.get("_meta") if request.params else None
    for meta in (request.meta, raw):
        if isinstance(meta, dict) and (meta.get("progressToken") is not None or meta.get("progress_token") is not None):
            return True
    return False


def outcome(result: RunResult) -> CallToolResult:
    """A run's outcome as an MCP tool result."""
    if not result.ok:
        return _error(f"run {result.run_id} failed ({result.error_code}): {result.error}", result.run_id)
    structured: Any = None
    if result.output is not None:
        structured = result.output if isinstance(result.output, dict) else {"result": result.output}
    return CallToolResult(content=[TextContent(text=result.answer or "")], structured_content=structured,
                          _meta={RUN_ID_META: result.run_id})


def _error(text: str, run_id: str | None = None) -> CallToolResult:
    return CallToolResult(content=[TextContent(text=text)], is_error=True,
                          _meta={RUN_ID_META: run_id} if run_id else None)
