"""agentstream agents as MCP tools (``agentstream mcp serve``): an MCP client (an IDE, a desktop assistant,
another agent) runs an agent with ``run_agent`` and gets its answer. See ``server.py`` and docs/mcp.md.

Needs the ``mcp`` extra (``pip install 'agentstream[mcp]'``); importing this package without it raises
``MissingExtra``.
"""

from __future__ import annotations

try:
    import mcp  # noqa: F401  (the official SDK: checked here, so that every module below may import it)
except ModuleNotFoundError as exc:  # pragma: no cover - the dev environment has the extra
    from agentstream.streams.core.errors import MissingExtra

    raise MissingExtra("mcp", exc.name or "mcp", "agentstream mcp serve") from exc
