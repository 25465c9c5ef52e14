"""An MCP server for the MCP tests, built with the official SDK (``MCPServer``): used in-process by the unit
tests (``mcp.Client(build())``) and as a stdio process by the integration tests
(``python tests/unit/mcp_servers.py [--http PORT]``, so it imports nothing of the repository's).

Its tools cover the results agentstream maps (text, structured content, images, resources, errors) and
the failures it must survive: ``hang`` (one slow call), ``die`` (the process exits mid-call) and, in
process, ``Gate`` (the whole server stops answering, listings included).
"""

from __future__ import annotations

import asyncio
import base64
import os
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import (
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)
from pydantic import BaseModel

#: A 1x1 PNG: 67 bytes.
PIXEL = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000a49444154789c63000100000500010d0a2db40000000049454e44ae426082")).decode()


class Airport(BaseModel):
    code: str
    city: str = ""


class Flight(BaseModel):
    origin: Airport
    destination: Airport


class Gate:
    """Stops the whole server (every request, tool listings included) between ``freeze`` and ``thaw``."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()

    def freeze(self) -> None:
        self._open.clear()

    def thaw(self) -> None:
        self._open.set()

    async def __call__(self, ctx: Any, call_next: Any) -> Any:
        if ctx.method != "initialize":
            await self._open.wait()
        return await call_next(ctx)


def build(name: str = "flaky", gate: Gate | None = None) -> MCPServer:
    server: MCPServer = MCPServer(name, middleware=[gate] if gate is not None else None)

    @server.tool()
    def echo(text: str) -> str:
        """Say the text back."""
        return text

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    async def hang(seconds: float = 3600) -> str:
        """Take a long time."""
        await asyncio.sleep(seconds)
        return "woke up"

    @server.tool()
    def die() -> str:
        """Exit the server's process in the middle of the call."""
        os._exit(3)

    @server.tool()
    def fail(reason: str) -> str:
        """Fail with the reason (an error result: isError)."""
        raise ToolError(reason)

    @server.tool()
    def picture() -> CallToolResult:
        """A caption and an image."""
        return CallToolResult(content=[TextContent(text="a red dot"), ImageContent(data=PIXEL, mime_type="image/png")])

    @server.tool()
    def documents() -> CallToolResult:
        """A link, an embedded text and an embedded blob."""
        return CallToolResult(content=[
            ResourceLink(uri="file:///notes.md", name="notes.md", description="the notes"),
            EmbeddedResource(resource=TextResourceContents(uri="file:///a.txt", text="alpha")),
            EmbeddedResource(resource=BlobResourceContents(uri="file:///b.bin", blob=base64.b64encode(b"xyz").decode(),
                                                           mime_type="application/octet-stream"))])

    @server.tool()
    def plain() -> CallToolResult:
        """Text only, no structured content."""
        return CallToolResult(content=[TextContent(text="just text")])

    @server.tool()
    def book(flight: Flight, seats: int = 1) -> dict[str, Any]:
        """Book a flight (nested arguments: the schema has $defs)."""
        return {"booked": f"{flight.origin.code}-{flight.destination.code}", "seats": seats}

    @server.tool(name="files.read")
    def files_read(path: str) -> str:
        """A name with a dot."""
        return f"read {path}"

    return server


if __name__ == "__main__":  # stdio, or streamable HTTP on 127.0.0.1 with ``--http PORT``
    import sys

    if sys.argv[1:2] == ["--http"]:
        build().run("streamable-http", port=int(sys.argv[2]))
    else:
        build().run()
