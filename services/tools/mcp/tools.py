"""The tools of MCP servers as agentstream ``Tool`` objects.

``McpTools.open(servers)`` connects to every server (at once), lists its tools and makes each a
``McpTool``: the agentstream name (config.py: ``time__get_current_time``), the server's description,
its input schema as the parameters (results.py: references inlined), and the worker's rules. The tool
worker registers them in the catalogue like its other tools and the tool service runs them through the
same path: the check against the run and the claim (at most once per step unless declared idempotent),
approval, the timeout, retries of retriable failures, the dead letter when they are used up. Calling
one calls the server through its ``McpConnection``, kept open for the worker's life.

A server that cannot be reached at start stops the worker's start with ``Unavailable`` naming it: its
tools cannot be registered without their schemas, and a worker that silently served fewer tools than
configured would leave runs asking for tools no one serves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mcp_types import Tool as McpToolInfo

from agentstream.services.tools.mcp.config import McpServer
from agentstream.services.tools.mcp.connection import ClientFactory, McpConnection, default_client
from agentstream.services.tools.mcp.results import ArgumentCheck, parameters, result_value
from agentstream.services.tools.registry import Tool
from agentstream.streams.core.errors import ConfigError
from agentstream.streams.core.task_rules import MAX_NAME_BYTES

log = logging.getLogger(__name__)

#: Seconds the tool service's own timeout allows past the server's ``timeout_s``: the connection's
#: timeout fires first, with the message that names the server; the service's is the backstop.
TIMEOUT_MARGIN_S = 2.0
#: The longest name OpenAI-style function tools accept (native tool calling on strict engines).
NATIVE_NAME_LIMIT = 64


@dataclass(frozen=True)
class McpTool(Tool[..., Any]):
    """A tool of an MCP server. Its arguments are checked against the server's own schema (``validate``),
    and calling it calls the server (``fn``)."""

    server: str = ""
    #: The tool's name on its server (the agentstream name is ``server__`` + this, made safe).
    mcp_name: str = ""
    check: ArgumentCheck | None = field(default=None, repr=False, compare=False)

    def validate(self, arguments: Any) -> dict[str, Any]:
        return self.check(arguments) if self.check is not None else super().validate(arguments)


def mcp_tool(server: McpServer, info: McpToolInfo, connection: McpConnection) -> McpTool:
    """``info`` (from the server's ``tools/list``) as the agentstream tool that calls it through ``connection``."""
    name = server.tool_name(info.name)
    idempotent = server.is_idempotent(name)
    mcp_name = info.name

    async def call(**arguments: Any) -> Any:
        result = await connection.call(mcp_name, arguments, retriable=idempotent)
        return result_value(server.name, mcp_name, result)

    description = (info.description or info.title or info.name).strip()
    return McpTool(name=name, description=description, fn=call, parameters=parameters(info.input_schema),
                   timeout_s=server.timeout_s + TIMEOUT_MARGIN_S, requires_approval=server.needs_approval(name),
                   idempotent=idempotent, max_attempts=2 if idempotent else 1, version=server.version,
                   server=server.name, mcp_name=mcp_name, check=ArgumentCheck(name, info.input_schema))


class McpTools:
    """The connections to a worker's MCP servers and the tools they serve (``tools``)."""

    def __init__(self, connections: Sequence[McpConnection]) -> None:
        self.connections = {c.name: c for c in connections}
        self.tools: list[McpTool] = []

    @classmethod
    async def open(cls, servers: Sequence[McpServer], *, factory: ClientFactory = default_client) -> McpTools:
        """Connect to every server and list its tools. Raises ``Unavailable`` for a server that cannot be
        reached, ``ConfigError`` for two tools with one agentstream name."""
        hub = cls([McpConnection(s, factory) for s in servers])
        try:
            listed = await asyncio.gather(*(c.list_tools() for c in hub.connections.values()))
            for connection, infos in zip(hub.connections.values(), listed, strict=True):
                hub._add(connection, infos)
        except BaseException:
            await hub.close()
            raise
        return hub

    def _add(self, connection: McpConnection, infos: list[McpToolInfo]) -> None:
        server = connection.server
        taken = {t.name: t.mcp_name for t in self.tools}
        for info in infos:
            name = server.tool_name(info.name)
            if len(name.encode()) > MAX_NAME_BYTES:
                log.error("MCP server %r: tool %r not served: its name is over %d bytes", server.name, info.name,
                          MAX_NAME_BYTES)
                continue
            if name in taken:
                raise ConfigError(f"MCP server {server.name!r}: tools {taken[name]!r} and {info.name!r} would both "
                                  f"be named {name!r}")
            if len(name) > NATIVE_NAME_LIMIT:
                log.warning("MCP tool %s: a name over %d characters fails native tool calling on engines that "
                            "check names as OpenAI's API does", name, NATIVE_NAME_LIMIT)
            self.tools.append(mcp_tool(server, info, connection))
            taken[name] = info.name
        log.info("MCP server %r (%s): %d tool(s): %s", server.name, server.describe(), len(infos),
                 ", ".join(t.name for t in self.tools if t.server == server.name) or "none")

    async def close(self) -> None:
        """Close every session (stdio servers' processes end)."""
        await asyncio.gather(*(c.close() for c in self.connections.values()), return_exceptions=True)
