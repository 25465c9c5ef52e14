"""agentstream agents as MCP tools (services/mcp_server/server.py), driven by the official SDK's client in-process
(JSON-RPC over memory streams, as over stdio) against a stand-in for the ``AgentClient``; and the
commands' options (``agentstream mcp serve``, ``agentstream worker tools --mcp``). A real run through
``agentstream mcp serve`` as a process: tests/integration/test_mcp.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from mcp import Client

from agentstream.services.mcp_server.server import RUN_ID_META, AgentToolset, ServeOptions, agents_server
from agentstream.streams.client.agent_client import AgentClient
from agentstream.streams.client.outcomes import RunResult
from agentstream.streams.client.views import TokenEvent
from agentstream.streams.core.errors import ConfigError, TaskRejected


class Runs:
    """Stands in for ``AgentClient``: records submissions, answers as the task says, streams tokens."""

    def __init__(self, tokens: tuple[str, ...] = (), delay_s: float = 0.0) -> None:
        self.tokens = tokens
        self.delay_s = delay_s
        self.submitted: list[tuple[str, dict[str, Any]]] = []
        self.cancelled: list[str] = []

    async def submit(self, task: str, **fields: Any) -> str:
        if "unknown_tool" in (fields.get("tools") or []):
            raise TaskRejected("unknown tool(s): unknown_tool")
        self.submitted.append((task, fields))
        return f"run-{len(self.submitted)}"

    async def wait(self, run_id: str, timeout: float | None = None) -> RunResult:
        await asyncio.sleep(self.delay_s)
        task, fields = self.submitted[int(run_id.split("-")[1]) - 1]
        if task == "fail":
            return RunResult(run_id, "failed", None, "max_steps", "the run took more than 8 steps", 8, 10.0)
        if task == "list":
            return RunResult(run_id, "completed", "[1, 2]", None, None, 1, 5.0, [1, 2])
        if fields.get("output_schema"):
            return RunResult(run_id, "completed", '{"city": "Paris"}', None, None, 1, 5.0, {"city": "Paris"})
        return RunResult(run_id, "completed", f"done: {task}", None, None, 3, 20.0)

    async def stream(self, run_id: str) -> AsyncIterator[TokenEvent]:
        for seq, text in enumerate(self.tokens):
            await asyncio.sleep(0.15)
            yield TokenEvent(offset=seq, step_id=f"{run_id}:0:model", seq=seq, text=text)

    async def cancel(self, run_id: str, reason: str = "") -> None:
        self.cancelled.append(run_id)


def serve(runs: Runs, **options: Any) -> Client:
    # mode="legacy": the SDK's JSON-RPC dispatch (progress tokens on the wire), as stdio and HTTP have it.
    return Client(agents_server(cast(AgentClient, runs), ServeOptions(**options)), mode="legacy")


async def test_run_agent_submits_the_task_and_answers_with_the_run() -> None:
    runs = Runs()
    async with serve(runs) as client:
        [tool] = (await client.list_tools()).tools
        assert tool.name == "run_agent" and tool.input_schema["required"] == ["task"]
        assert set(tool.input_schema["properties"]) == {"task", "tools", "max_steps", "session", "output_schema",
                                                        "deadline_s"}
        result = await client.call_tool("run_agent", {"task": "What is 17 * 23?", "tools": ["calculator"],
                                                      "max_steps": 4, "session": "chat-1", "deadline_s": 30})
    assert not result.is_error and result.content[0].text == "done: What is 17 * 23?"
    assert result.structured_content is None and (result.meta or {})[RUN_ID_META] == "run-1"
    assert runs.submitted == [("What is 17 * 23?", {"tools": ["calculator"], "max_steps": 4, "session": "chat-1",
                                                    "output_schema": None, "deadline": 30.0})]


async def test_structured_output_failures_and_refusals() -> None:
    async with serve(Runs()) as client:
        city = await client.call_tool("run_agent", {"task": "city", "output_schema": {"type": "object"}})
        assert city.structured_content == {"city": "Paris"} and city.content[0].text == '{"city": "Paris"}'
        listed = await client.call_tool("run_agent", {"task": "list", "output_schema": {"type": "array"}})
        assert listed.structured_content == {"result": [1, 2]}  # MCP before 2026-07-28: an object only
        failed = await client.call_tool("run_agent", {"task": "fail"})
        assert failed.is_error and failed.content[0].text == ("run run-3 failed (max_steps): the run took more "
                                                              "than 8 steps")
        refused = await client.call_tool("run_agent", {"task": "x", "tools": ["unknown_tool"]})
        assert refused.is_error and refused.content[0].text == "the task was refused: unknown tool(s): unknown_tool"
        bad = await client.call_tool("run_agent", {"task": "x", "max_steps": 0})
        assert bad.is_error and "greater than or equal to 1" in bad.content[0].text


async def test_a_toolset_is_a_tool_with_its_tools_fixed() -> None:
    runs = Runs()
    async with serve(runs, toolsets=(AgentToolset.parse("math=calculator, sql_query"),)) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == {"run_agent", "math"} and set(tools["math"].input_schema["properties"]) == {"task",
                                                                                                      "session"}
        assert "calculator, sql_query" in (tools["math"].description or "")
        result = await client.call_tool("math", {"task": "2 + 2"})
    assert result.content[0].text == "done: 2 + 2"
    assert runs.submitted[0][1]["tools"] == ["calculator", "sql_query"]
    with pytest.raises(ConfigError, match="expected NAME=TOOL,TOOL"):
        AgentToolset.parse("no tools")
    with pytest.raises(ConfigError, match="two MCP tools are named 'run_agent'"):
        agents_server(cast(AgentClient, runs), ServeOptions(toolsets=(AgentToolset.parse("run_agent="),)))


async def test_the_models_tokens_are_progress_notifications() -> None:
    runs = Runs(tokens=('{"action": ', '"final_answer"}'), delay_s=0.5)
    seen: list[tuple[float, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append((value, message))

    async with serve(runs) as client:
        await client.call_tool("run_agent", {"task": "hi"}, progress_callback=progress)
        assert seen == [(1.0, '{"action": '), (2.0, '{"action": "final_answer"}')]
        seen.clear()
        await client.call_tool("run_agent", {"task": "hi"})  # no progress asked: none followed
    assert seen == []


async def test_a_cancelled_call_cancels_its_run() -> None:
    runs = Runs(delay_s=30)
    async with serve(runs) as client:
        with pytest.raises(Exception, match="timed out"):
            await client.call_tool("run_agent", {"task": "long"}, read_timeout_seconds=0.3)
        for _ in range(50):
            if runs.cancelled:
                break
            await asyncio.sleep(0.02)
    assert runs.cancelled == ["run-1"]


def test_the_worker_command_passes_its_mcp_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from agentstream import cli
    from agentstream.services import worker as worker_module

    for name in ("SERVERS", "TIMEOUT_S", "APPROVE", "IDEMPOTENT", "TOOLS_VERSION"):
        monkeypatch.delenv(f"AGENTSTREAM_MCP_{name}", raising=False)
    monkeypatch.setenv("AGENTSTREAM_MCP_APPROVE", "fs__write*")
    seen: list[worker_module.WorkerOptions] = []

    async def serve(names: list[str], options: worker_module.WorkerOptions, settings: object) -> None:
        seen.append(options)

    monkeypatch.setattr(worker_module, "serve", serve)
    result = CliRunner().invoke(cli.app, ["worker", "tools", "--mcp", "time=stdio:python -m mcp_server_time",
                                          "--mcp", "fs=http://127.0.0.1:9/mcp", "--mcp-timeout", "5",
                                          "--mcp-idempotent", "time__*"])
    assert result.exit_code == 0, result.output
    time_server, fs = seen[0].mcp_servers
    assert time_server.command == ("python", "-m", "mcp_server_time") and fs.url == "http://127.0.0.1:9/mcp"
    assert (fs.timeout_s, fs.requires_approval, fs.idempotent) == (5.0, ("fs__write*",), ("time__*",))
    assert CliRunner().invoke(cli.app, ["worker", "tools"]).exit_code == 0 and not seen[1].mcp_servers
    bad = CliRunner().invoke(cli.app, ["worker", "tools", "--mcp", "time=python"])
    assert isinstance(bad.exception, ConfigError) and "must start with stdio:" in str(bad.exception)


def test_mcp_serve_is_a_command() -> None:
    from typer.testing import CliRunner

    from agentstream import cli

    result = CliRunner().invoke(cli.app, ["mcp", "serve", "--help"])
    assert result.exit_code == 0 and "--toolset" in result.output and "--http" in result.output
