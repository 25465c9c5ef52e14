"""An MCP server's tools served as agentstream tools (``agentstream worker tools --mcp NAME=TARGET``).

- ``config``: which servers, how to reach them (stdio or streamable HTTP), and what the worker decides
  about their tools (timeout, approval, idempotence); the agentstream name of an MCP tool;
- ``results``: an MCP tool's input schema and its result, in agentstream's terms;
- ``connection``: one long-lived session per server, reconnected when it is lost;
- ``tools``: the servers' tools as ``Tool`` objects, which the tool service runs like any other.

Needs the ``mcp`` extra (``pip install 'agentstream[mcp]'``); importing this package without it raises
``MissingExtra``. docs/mcp.md describes both directions.
"""

from __future__ import annotations

try:
    import mcp  # noqa: F401  (the official SDK: checked here, so that every module below may import it)
except ModuleNotFoundError as exc:  # pragma: no cover - the dev environment has the extra
    from agentstream.streams.core.errors import MissingExtra

    raise MissingExtra("mcp", exc.name or "mcp", "serving an MCP server's tools") from exc
