"""``agentstream mcp serve``: agentstream agents as MCP tools, over stdio (what desktop and IDE clients
launch) or streamable HTTP (services/mcp_server/server.py; docs/mcp.md). The other direction, an MCP
server's tools served to agentstream runs, is ``agentstream worker tools --mcp``."""

from __future__ import annotations

import typer

from agentstream.cli.common import run_async

app = typer.Typer(help="MCP: agentstream agents as MCP tools (the other way: worker tools --mcp).",
                  no_args_is_help=True)


@app.command("serve")
def serve(
    http: int = typer.Option(None, "--http", metavar="PORT", help="Serve streamable HTTP on this port (path /mcp) "
                                                                  "instead of stdio."),
    host: str = typer.Option("127.0.0.1", help="--http: the address to listen on."),
    toolset: list[str] = typer.Option(None, "--toolset", metavar="NAME=TOOL,TOOL",
                                      help="Also expose NAME(task, session): an agent with exactly these tools "
                                           "(repeatable)."),
    wait: float = typer.Option(300.0, help="Seconds a call waits for its run's outcome."),
    log_level: str = typer.Option("WARNING", help="Python log level (logs go to stderr; stdout is MCP's)."),
) -> None:
    """Serve run_agent (and each --toolset) as MCP tools until the client disconnects (stdio) or interrupted."""
    import logging

    from agentstream.services.mcp_server.server import AgentToolset, ServeOptions, agents_server
    from agentstream.streams.client.agent_client import AgentClient

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    options = ServeOptions(wait_s=wait, toolsets=tuple(AgentToolset.parse(t) for t in toolset or ()),
                           log_level=log_level)

    async def go() -> None:
        async with AgentClient() as client:
            server = agents_server(client, options)
            if http is None:
                await server.run_stdio_async()
            else:
                await server.run_streamable_http_async(host=host, port=http)

    run_async(go())
