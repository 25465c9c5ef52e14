"""MCP both ways on the real broker and database (docs/mcp.md), against real MCP peers from PyPI:

- a tool worker serves the tools of ``mcp-server-time`` (run over stdio, as published) as
  ``time__get_current_time``...: a run calls one, its claim shows it ran once, the catalogue has its schema;
- an MCP server that hangs, then dies mid-call (tests/unit/mcp_servers.py over stdio): each call fails with a
  clear error (after the timeout, at once), the run goes on, and the next call reconnects;
- ``agentstream mcp serve`` as a process, driven by the SDK's own stdio client: ``run_agent`` answers, with
  progress notifications from the model's tokens and structured content for an output schema.

One pipeline for the module (the scripted model), few runs: the module takes about 20 s.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

import pytest
import pytest_asyncio
from mcp import Client, StdioServerParameters

from agentstream.services.tools.mcp.config import McpServer
from agentstream.services.worker import WorkerOptions
from agentstream.streams.catalog.tools import ToolCatalog
from agentstream.testing import Pipeline, isolated
from tests.integration.processes import worker_env

pytestmark = pytest.mark.asyncio(loop_scope="module")
ROOT = Path(__file__).resolve().parents[2]
FLAKY = ROOT / "tests" / "unit" / "mcp_servers.py"
CITY = {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pipe(settings):
    servers = [McpServer(name="time", command=(sys.executable, "-m", "mcp_server_time")),
               McpServer(name="flaky", command=(sys.executable, str(FLAKY)), timeout_s=2.0)]
    options = WorkerOptions(backend="scripted", mcp_servers=servers)
    async with Pipeline.start(isolated(settings, f"t{uuid.uuid4().hex[:8]}."), options) as pipeline:
        yield pipeline


async def test_a_run_calls_a_real_mcp_servers_tool_once(pipe):
    catalog = ToolCatalog.for_runtime(pipe.worker.runtime)
    try:
        [info] = await catalog.describe(["time__get_current_time"])
    finally:
        await catalog.close()
    assert info.parameters["required"] == ["timezone"] and "IANA" in info.parameters["properties"]["timezone"][
        "description"] and not info.requires_approval

    run_id = await pipe.client.submit('[[tool:time__get_current_time {"timezone": "Europe/Paris"}]]',
                                      tools=["time__get_current_time"], prefetch=False)
    result = await pipe.client.wait(run_id, timeout=30)
    assert result.ok, result
    returned = json.loads(result.answer.removeprefix("Based on the last step: time__get_current_time returned: "))
    assert returned["timezone"] == "Europe/Paris" and set(returned) >= {"datetime", "day_of_week", "is_dst"}
    pool = await pipe.client.pool()
    claims = await pool.fetch("SELECT tool, status, attempts FROM tool_calls WHERE run_id = $1", run_id)
    assert [tuple(c) for c in claims] == [("time__get_current_time", "succeeded", 1)]  # claimed, ran once


async def test_a_hung_then_dead_server_fails_its_calls_clearly_and_the_run_goes_on(pipe):
    flaky = pipe.worker.mcp.connections["flaky"]
    connects = flaky.connects
    started = time.monotonic()
    run_id = await pipe.client.submit(
        '[[tool:flaky__hang {}]] [[tool:flaky__die {}]] [[tool:flaky__echo {"text": "back again"}]]',
        tools=["flaky__hang", "flaky__die", "flaky__echo"], max_steps=8, prefetch=False)
    result = await pipe.client.wait(run_id, timeout=30)
    assert result.ok and result.answer.endswith('flaky__echo returned: {"result": "back again"}'), result
    tools = [s for s in (await pipe.client.status(run_id))["steps"] if s["kind"] == "tool"]
    assert [s["status"] for s in tools] == ["failed", "failed", "completed"]
    assert tools[0]["error"] == "MCP server 'flaky' did not answer hang within 2 s"
    assert tools[1]["error"].startswith("MCP server 'flaky' closed the connection during the call to die")
    assert 2.0 <= time.monotonic() - started < 15
    assert flaky.connects == connects + 1  # the dead process was replaced for the next call
    pool = await pipe.client.pool()
    claims = await pool.fetch("SELECT tool, status, error_kind FROM tool_calls WHERE run_id = $1 ORDER BY step_id",
                              run_id)
    assert [tuple(c) for c in claims] == [("flaky__hang", "failed", "tool_error"),
                                          ("flaky__die", "failed", "tool_error"),
                                          ("flaky__echo", "succeeded", None)]


async def test_an_mcp_client_runs_an_agent_through_agentstream_mcp_serve(pipe):
    params = StdioServerParameters(command=sys.executable, args=["-m", "agentstream.cli", "mcp", "serve"],
                                   env=worker_env(pipe.settings), cwd=str(ROOT))
    progress: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    async with Client(params) as client:
        assert "run_agent" in [t.name for t in (await client.list_tools()).tools]
        # Slow replies (0.4 s each): the first step's tokens arrive while the run still goes on.
        answered = await client.call_tool(
            "run_agent", {"task": '[[slow:400]] [[tool:calculator {"expression": "17 * 23"}]]',
                          "tools": ["calculator"]}, progress_callback=on_progress)
        assert not answered.is_error, answered
        assert answered.content[0].text == "Based on the last step: calculator returned: 391"
        run_id = (answered.meta or {})["agentstream/run_id"]
        assert (await pipe.client.status(run_id))["status"] == "completed"
        assert any('"tool": "calculator"' in m for m in progress), progress

        structured = await client.call_tool("run_agent", {"task": '[[answer:{"city": "Paris"}]]', "tools": [],
                                                          "output_schema": CITY})
        assert not structured.is_error and structured.structured_content == {"city": "Paris"}, structured

        refused = await client.call_tool("run_agent", {"task": "hi", "tools": ["no_such_tool"]})
        assert refused.is_error and "no_such_tool" in refused.content[0].text
