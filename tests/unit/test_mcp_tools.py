"""An MCP server's tools as agentstream tools (services/tools/mcp/), against a real MCP server built with the
official SDK and connected in-process (tests/unit/mcp_servers.py): the configuration and the names, the
schemas, the mapping of results and errors, the tool service's path (claim, approval, retries), and a
server that hangs as a whole (its session is replaced); and over streamable HTTP, a server that goes away
and comes back. Over stdio, with a server that dies mid-call: tests/integration/test_mcp.py."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from agentstream.devstack.process import free_port
from agentstream.services.tools.mcp import results
from agentstream.services.tools.mcp.config import McpServer, McpSettings
from agentstream.services.tools.mcp.tools import McpTool, McpTools
from agentstream.streams.core.actions import instructions
from agentstream.streams.core.errors import ConfigError, MissingExtra, ToolArgumentError
from agentstream.streams.core.events import DeadLetter, ToolCallCompleted
from agentstream.streams.core.tools import ToolInfo
from agentstream.testing import ToolEnvironment, ToolHarness
from tests.unit.mcp_servers import Gate, build


async def open_flaky(gate: Gate | None = None, **rules: Any) -> McpTools:
    server = build(gate=gate)
    return await McpTools.open([McpServer(name="flaky", command=("unused",), **rules)],
                               factory=lambda _: Client(server))


def by_name(hub: McpTools) -> dict[str, McpTool]:
    return {t.name: t for t in hub.tools}


# -- configuration and names -----------------------------------------------------------------------

def test_a_server_is_a_command_or_a_url() -> None:
    stdio = McpServer.parse("time=stdio:TZ=UTC LOG='a b' python -m mcp_server_time --local-timezone UTC")
    assert stdio.command == ("python", "-m", "mcp_server_time", "--local-timezone", "UTC")
    assert stdio.env == {"TZ": "UTC", "LOG": "a b"} and stdio.url is None
    assert stdio.describe() == "stdio: python -m mcp_server_time --local-timezone UTC"  # no env values
    http = McpServer.parse(" search = http://127.0.0.1:8000/mcp ")
    assert (http.name, http.url, http.command) == ("search", "http://127.0.0.1:8000/mcp", ())


@pytest.mark.parametrize(("spec", "problem"), [
    ("time", "expected NAME=stdio:COMMAND"),
    ("time=python -m x", "must start with stdio:"),
    ("time=stdio:", "stdio: needs a command"),
    ("time=stdio:A=1", "stdio: needs a command"),
    ("time=stdio:python 'x", "cannot split the command"),
    ("a__b=stdio:x", "MCP server name 'a__b'"),
    ("a.b=http://h/mcp", "MCP server name 'a.b'"),
])
def test_a_bad_server_spec_says_what_is_wrong(spec: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        McpServer.parse(spec)


def test_settings_come_from_the_environment_then_the_options() -> None:
    env = {"AGENTSTREAM_MCP_SERVERS": "time=stdio:python -m mcp_server_time; fs=http://h:1/mcp\n",
           "AGENTSTREAM_MCP_TIMEOUT_S": "5", "AGENTSTREAM_MCP_APPROVE": "fs__write*, fs__delete",
           "AGENTSTREAM_MCP_TOOLS_VERSION": "3"}
    settings = McpSettings.from_env(env)
    time_server, fs = settings.servers()
    assert (time_server.name, fs.name, fs.timeout_s, fs.version) == ("time", "fs", 5.0, 3)
    assert fs.needs_approval("fs__write_file") and fs.needs_approval("fs__delete") and not fs.needs_approval("fs__read")
    given = settings.with_options(specs=["git=stdio:git-mcp"], timeout_s=9, idempotent=["git__log,git__status"])
    [git] = given.servers()
    assert (git.timeout_s, git.idempotent, git.requires_approval) == (9, ("git__log", "git__status"),
                                                                     ("fs__write*", "fs__delete"))
    with pytest.raises(ConfigError, match="two MCP servers are named time"):
        McpSettings(specs=("time=stdio:a", "time=stdio:b")).servers()
    with pytest.raises(ConfigError, match="AGENTSTREAM_MCP_TIMEOUT_S must be positive"):
        McpSettings.from_env({"AGENTSTREAM_MCP_TIMEOUT_S": "0"})


def test_names_are_prefixed_and_safe_for_native_tool_calling() -> None:
    server = McpServer(name="fs", command=("x",))
    assert server.tool_name("read_file") == "fs__read_file"
    assert server.tool_name("files.read/v2") == "fs__files_read_v2"


# -- schemas and results ---------------------------------------------------------------------------

def test_parameters_inline_references_and_cut_recursion() -> None:
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
              "properties": {"node": {"$ref": "#/$defs/Node", "description": "the root"}},
              "$defs": {"Node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/Node"}}}}}
    params = results.parameters(schema)
    assert "$defs" not in params and "$schema" not in params
    node = params["properties"]["node"]
    assert node["description"] == "the root" and node["type"] == "object"
    depth = 0
    while "properties" in node:
        node, depth = node["properties"]["child"], depth + 1
    assert depth == 3 and "$ref" not in node  # recursion cut to "any value"
    assert results.parameters({}) == {"type": "object", "properties": {}}
    nullable = results.parameters({"type": "object", "properties": {
        "a": {"type": ["string", "null"], "maxLength": 5}, "b": {"type": ["integer"]}}})
    assert nullable["properties"] == {"a": {"maxLength": 5, "anyOf": [{"type": "string"}, {"type": "null"}]},
                                      "b": {"type": "integer"}}
    assert "a" in instructions([ToolInfo("t", "d", nullable)])  # the prompt reads each property's type


def test_arguments_are_checked_against_the_servers_schema() -> None:
    check = results.ArgumentCheck("t", {"type": "object", "required": ["n"], "additionalProperties": False,
                                        "properties": {"n": {"type": "integer", "minimum": 1}}})
    assert check({"n": 2}) == {"n": 2}
    for bad, message in [({"n": 0}, "argument 'n': 0 is less than the minimum of 1"),
                         ({}, "'n' is a required property"), ([1], "must be a JSON object"),
                         ({"n": 1, "m": 2}, "Additional properties are not allowed")]:
        with pytest.raises(ToolArgumentError, match=message):
            check(bad)
    lenient = results.ArgumentCheck("t", {"type": "objekt"})  # not JSON Schema: the server decides
    assert lenient({"anything": 1}) == {"anything": 1}


async def test_results_map_to_json_values_and_errors() -> None:
    hub = await open_flaky()
    try:
        tools, env = by_name(hub), ToolEnvironment()
        assert await env.run(tools["flaky__add"], a=2, b=3) == {"result": 5}  # structured content
        assert await env.run(tools["flaky__plain"]) == "just text"  # one text block
        assert await env.run(tools["flaky__picture"]) == ["a red dot", {"type": "image", "mime_type": "image/png",
                                                                         "bytes": 67}]  # no base64 for the model
        assert await env.run(tools["flaky__documents"]) == [
            {"type": "resource_link", "uri": "file:///notes.md", "name": "notes.md", "description": "the notes"},
            {"type": "resource", "uri": "file:///a.txt", "text": "alpha"},
            {"type": "resource", "uri": "file:///b.bin", "mime_type": "application/octet-stream", "bytes": 3}]
        assert await env.run(tools["flaky__book"], flight={"origin": {"code": "CDG"}, "destination": {"code": "JFK"}},
                             seats=2) == {"booked": "CDG-JFK", "seats": 2}
        assert await env.run(tools["flaky__files_read"], path="a") == {"result": "read a"}  # files.read, renamed
        error = await env.error(tools["flaky__fail"], reason="disk full")
        assert str(error) == "MCP server 'flaky' reported an error from fail: Error executing tool fail: disk full"
        assert not error.retriable
        with pytest.raises(ToolArgumentError, match="'destination' is a required property"):
            tools["flaky__book"].validate({"flight": {"origin": {"code": "CDG"}}})
    finally:
        await hub.close()


# -- the tool service's path -----------------------------------------------------------------------

async def test_an_mcp_tool_goes_through_the_tool_services_claims_and_approvals() -> None:
    hub = await open_flaky(requires_approval=("flaky__fail",), idempotent=("flaky__add",))
    try:
        tools = by_name(hub)
        echo, add, fail = tools["flaky__echo"], tools["flaky__add"], tools["flaky__fail"]
        assert (echo.idempotent, echo.max_attempts, echo.requires_approval) == (False, 1, False)
        assert (add.idempotent, add.max_attempts) == (True, 2) and fail.requires_approval
        assert echo.info().parameters == {"type": "object", "properties": {"text": {"title": "Text", "type": "string"}},
                                          "required": ["text"], "title": "echoArguments"}
        async with ToolHarness(hub.tools) as harness:
            request = harness.request("flaky__echo", {"text": "hi"})
            harness.expect(request)
            done = (await harness.deliver(request)).one(ToolCallCompleted)
            assert done.ok and done.result == '{"result": "hi"}' and not done.replayed
            row = harness.database.tool_calls[request.step_id]
            assert (row.status, row.attempts) == ("succeeded", 1)  # claimed, ran once
            again = (await harness.deliver(request)).one(ToolCallCompleted)
            assert again.replayed and again.result == done.result  # answered from the row, not run again

            bad = await harness.call("flaky__echo", {"words": "hi"})
            assert bad.error_kind == "invalid_arguments" and "'text' is a required property" in (bad.error or "")

            unapproved = harness.request("flaky__fail", {"reason": "x"})
            harness.expect(unapproved)  # the run asked for it, but no one approved it: not run
            letter = (await harness.deliver(unapproved)).one(DeadLetter)
            assert letter.error_kind == "refused" and "needs a person's approval" in letter.reason
            assert unapproved.step_id not in harness.database.tool_calls
            approved = await harness.call("flaky__fail", {"reason": "x"}, approved=True)
            assert approved.error_kind == "tool_error" and "reported an error from fail" in (approved.error or "")
    finally:
        await hub.close()


async def test_a_server_hung_as_a_whole_is_replaced_for_the_next_call() -> None:
    gate = Gate()
    hub = await open_flaky(gate, timeout_s=0.6)
    try:
        echo, connection, env = by_name(hub)["flaky__echo"], hub.connections["flaky"], ToolEnvironment()
        gate.freeze()
        error = await env.error(echo, text="x")
        assert str(error) == "MCP server 'flaky' did not answer echo within 0.6 s" and not error.retriable
        await asyncio.sleep(0.5)  # the check (0.3 s) finds the listing hung too: the session is closed
        gate.thaw()
        assert await env.run(echo, text="back") == {"result": "back"}
        assert connection.connects == 2
    finally:
        await hub.close()


async def test_one_slow_tool_keeps_the_session_and_an_idempotent_one_is_tried_twice() -> None:
    hub = await open_flaky(timeout_s=0.4, idempotent=("flaky__hang",))
    try:
        async with ToolHarness(hub.tools) as harness:
            done = await harness.call("flaky__hang", {"seconds": 30})
            assert done.error_kind == "retries_exhausted" and done.attempts == 2, done
            assert done.error == "failed after 2 attempts: MCP server 'flaky' did not answer hang within 0.4 s"
        assert await ToolEnvironment().run(by_name(hub)["flaky__echo"], text="still") == {"result": "still"}
        assert hub.connections["flaky"].connects == 1  # the server answered its listing: same session
    finally:
        await hub.close()


async def test_over_streamable_http_a_restarted_server_is_reconnected() -> None:
    port = free_port()
    command = [sys.executable, str(Path(__file__).with_name("mcp_servers.py")), "--http", str(port)]

    async def started() -> asyncio.subprocess.Process:
        process = await asyncio.create_subprocess_exec(*command, stdout=subprocess.DEVNULL,
                                                        stderr=subprocess.DEVNULL)
        for _ in range(200):
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                return process
            await asyncio.sleep(0.05)
        process.kill()
        await process.wait()
        raise AssertionError("the MCP server did not start")

    process = await started()
    hub = await McpTools.open([McpServer(name="web", url=f"http://127.0.0.1:{port}/mcp", timeout_s=5)])
    try:
        echo, env = by_name(hub)["web__echo"], ToolEnvironment()
        assert await env.run(echo, text="over http") == {"result": "over http"}
        process.kill()
        await process.wait()
        error = await env.error(echo, text="x")
        assert str(error).startswith("MCP server 'web' closed the connection during the call to echo")
        error = await env.error(echo, text="x")
        assert str(error).startswith(f"cannot connect to MCP server 'web' (http://127.0.0.1:{port}/mcp)")
        process = await started()
        assert await env.run(echo, text="back") == {"result": "back"}
        assert hub.connections["web"].connects == 2
    finally:
        await hub.close()
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


async def test_a_server_that_cannot_be_reached_stops_the_start_naming_it() -> None:
    from agentstream.streams.core.errors import Unavailable

    missing = McpServer(name="gone", command=(sys.executable, "-c", "import sys; sys.exit(1)"),
                        connect_timeout_s=10)
    with pytest.raises(Unavailable, match=r"cannot connect to MCP server 'gone' \(stdio: .*-c"):
        await McpTools.open([missing])


async def test_two_tools_with_one_name_are_refused() -> None:
    server = build()

    @server.tool(name="files_read")
    def other(path: str) -> str:
        return path

    with pytest.raises(ConfigError, match=r"'files\.read' and 'files_read' would both be named 'flaky__files_read'"):
        await McpTools.open([McpServer(name="flaky", command=("x",))], factory=lambda _: Client(server))


@pytest.mark.parametrize("module", ["agentstream.services.tools.mcp.tools", "agentstream.services.mcp_server.server"])
def test_without_the_extra_the_import_names_it(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    package = module.rsplit(".", 1)[0]
    for name in [n for n in sys.modules if n == "mcp" or n.startswith(("mcp.", package))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mcp", None)  # as if not installed
    with pytest.raises(MissingExtra, match=r"needs the 'mcp' extra .* pip install 'agentstream\[mcp\]'"):
        importlib.import_module(module)
