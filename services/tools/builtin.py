"""Built-in tools, and how a worker chooses which of them to serve.

- ``calculator``: arithmetic, always on; bounded, and evaluated inline only when it is cheap whatever the
  numbers, else in a child process a timeout stops (services/tools/arithmetic.py, compute.py);
- ``sql_query``: one read-only query on ``documents`` (services/tools/sql.py), on by default;
- ``retrieve``: the retrieval service's top-k passages, asked through events (the tool service
  publishes a RetrievalRequested and waits for its RetrievalCompleted), on by default;
- ``http_get``: off unless the worker is given a host allowlist (services/tools/http.py).

``load_tools("agentstream.services.tools.builtin")`` serves the defaults (the module-level tools below). A worker
that has configuration builds the list with ``builtin_tools(BuiltinConfig(...))``, or, for a mix of
built-ins and other modules, ``tools_for(modules, config)``; ``BuiltinConfig.from_env(os.environ)``
reads the ``AGENTSTREAM_HTTP_*`` / ``AGENTSTREAM_SQL_*`` variables.
"""

from __future__ import annotations

import atexit
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agentstream.services.tools import arithmetic
from agentstream.services.tools.compute import ComputeError, ComputeGuard, ComputeTimeout
from agentstream.services.tools.http import HttpGetConfig, http_get_tool
from agentstream.services.tools.registry import Tool, ToolContext, load_tools, tool
from agentstream.services.tools.sql import SqlQueryConfig, sql_query_tool
from agentstream.streams.config import env
from agentstream.streams.config.env import N
from agentstream.streams.core.errors import ConfigError, ToolError

#: Seconds of computation a guarded expression may take, inside the tool's 2 s (which also covers the
#: wait for a free child process, and a child's start).
CALCULATOR_COMPUTE_S = 1.0
#: The child processes the calculator's expressions that are not evidently cheap run in: one pool per
#: process, since ``calculator`` is a module-level tool. Building it starts nothing (children start on
#: first use); they are killed at exit.
CALCULATOR_GUARD = ComputeGuard(arithmetic.__name__, workers=2, timeout_s=CALCULATOR_COMPUTE_S)
atexit.register(CALCULATOR_GUARD.close)


def evaluate(expression: str) -> float | int:
    """Arithmetic on numbers, + - * / // % ** (or ^), parentheses, and a few math functions, bounded
    (``arithmetic.evaluate``), in this thread; ``ToolError`` for anything refused."""
    try:
        return arithmetic.evaluate(expression)
    except arithmetic.CalculationError as exc:
        raise ToolError(str(exc)) from None


@tool(description="Evaluate an arithmetic expression, e.g. '17 * 23' or 'sqrt(2) / 3'.", timeout_s=2.0,
      idempotent=True)  # a pure function
async def calculator(expression: str) -> float | int:
    # Inline (microseconds) when cheap whatever the numbers; else where a timeout stops it, so that a
    # CPU bomb the bounded arithmetic missed fails this call and the event loop keeps serving.
    try:
        tree = arithmetic.parse(expression)
        if arithmetic.cheap(expression, tree):
            return arithmetic.evaluate_tree(tree)
    except arithmetic.CalculationError as exc:
        raise ToolError(str(exc)) from None
    try:
        value: float | int = await CALCULATOR_GUARD.call("evaluate", expression)
    except ComputeTimeout as exc:
        raise ToolError(f"the expression takes too long to compute ({exc})") from None
    except ComputeError as exc:
        raise ToolError(str(exc)) from None
    return value


@dataclass(frozen=True, kw_only=True)
class RetrieveConfig:
    """Limits of the ``retrieve`` tool."""

    #: How long one attempt waits for the retrieval service's answer.
    timeout_s: float = 10.0
    max_k: int = 20
    collection: str = "default"
    #: A timed-out or failed request is asked again (a search is repeatable) this many times at most.
    max_attempts: int = 2


def retrieve_tool(config: RetrieveConfig | None = None) -> Tool:
    """The ``retrieve`` tool bound to ``config``."""
    config = config or RetrieveConfig()

    @tool(name="retrieve", description=f"Search the document collection; returns the k (1-{config.max_k}) best "
                                       "passages with their id, text, score and source.",
          timeout_s=config.timeout_s + 1.0, max_attempts=config.max_attempts, idempotent=True)  # a search
    async def retrieve(query: str, k: int = 5, *, ctx: ToolContext) -> list[dict[str, Any]]:
        if not 1 <= k <= config.max_k:
            raise ToolError(f"k must be between 1 and {config.max_k} (got {k})")
        if ctx.retrieve is None:
            raise ToolError("retrieval is not available on this worker")
        completed = await ctx.retrieve(query, k, config.collection, config.timeout_s)
        if completed.error:
            raise ToolError(f"retrieval failed: {completed.error}")
        return [{"id": p.id, "text": p.text, "score": p.score, "source": p.source} for p in completed.passages]

    return retrieve


#: The defaults, found by ``load_tools("agentstream.services.tools.builtin")``.
sql_query = sql_query_tool(SqlQueryConfig())
retrieve = retrieve_tool(RetrieveConfig())


@dataclass(frozen=True, kw_only=True)
class BuiltinConfig:
    """Which built-ins a worker serves, and their limits; None turns a tool off."""

    http_get: HttpGetConfig | None = None
    sql_query: SqlQueryConfig | None = field(default_factory=SqlQueryConfig)
    retrieve: RetrieveConfig | None = field(default_factory=RetrieveConfig)
    #: The built-ins' metadata version in the tool catalogue. Their descriptions follow this
    #: configuration (allowed hosts, row and k limits), and the catalogue keeps a tool's metadata until
    #: a higher version comes (streams/catalog/tools.py): raise it when changing one of those settings.
    version: int = 1

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> BuiltinConfig:
        """From ``AGENTSTREAM_HTTP_ALLOWED_HOSTS`` (comma-separated; empty: http_get off),
        ``AGENTSTREAM_HTTP_ALLOW_PRIVATE`` (1: allowlisted hosts may resolve to private addresses),
        ``AGENTSTREAM_HTTP_MAX_BYTES``, ``AGENTSTREAM_HTTP_TIMEOUT_S``, ``AGENTSTREAM_SQL_TIMEOUT_S``,
        ``AGENTSTREAM_SQL_MAX_ROWS``, ``AGENTSTREAM_SQL_MAX_BYTES``, ``AGENTSTREAM_SQL_POOL_SIZE``,
        ``AGENTSTREAM_BUILTIN_TOOLS_VERSION``. The caller passes the environment (streams/config/settings.py reads it)."""

        def number(name: str, kind: type[N], default: N) -> N:
            return env.positive_number(environ, name, kind, default)

        http = HttpGetConfig.parse_hosts(
            environ.get("AGENTSTREAM_HTTP_ALLOWED_HOSTS", ""),
            allow_private=environ.get("AGENTSTREAM_HTTP_ALLOW_PRIVATE", "").strip().lower() in ("1", "true", "yes"),
            max_bytes=number("AGENTSTREAM_HTTP_MAX_BYTES", int, 1_000_000),
            timeout_s=number("AGENTSTREAM_HTTP_TIMEOUT_S", float, 10.0))
        defaults = SqlQueryConfig()
        try:
            sql = SqlQueryConfig(statement_timeout_s=number("AGENTSTREAM_SQL_TIMEOUT_S", float, defaults.statement_timeout_s),
                                 max_rows=number("AGENTSTREAM_SQL_MAX_ROWS", int, defaults.max_rows),
                                 max_bytes=number("AGENTSTREAM_SQL_MAX_BYTES", int, defaults.max_bytes),
                                 pool_size=number("AGENTSTREAM_SQL_POOL_SIZE", int, defaults.pool_size))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        return cls(http_get=http, sql_query=sql, version=number("AGENTSTREAM_BUILTIN_TOOLS_VERSION", int, 1))


def builtin_tools(config: BuiltinConfig | None = None) -> list[Tool]:
    """The built-ins ``config`` turns on (``calculator`` always)."""
    config = config or BuiltinConfig()
    tools: list[Tool] = [calculator]
    if config.sql_query is not None:
        tools.append(sql_query_tool(config.sql_query))
    if config.retrieve is not None:
        tools.append(retrieve_tool(config.retrieve))
    if config.http_get is not None:
        tools.append(http_get_tool(config.http_get))
    return tools if config.version == 1 else [replace(t, version=config.version) for t in tools]


def tools_for(modules: Sequence[str], config: BuiltinConfig | None = None) -> list[Tool]:
    """``load_tools(*modules)``, except that this module stands for ``builtin_tools(config)``: what a
    worker serves for its ``--tools`` modules and its built-in configuration."""
    others = [m for m in modules if m != __name__]
    tools = builtin_tools(config) if len(others) < len(modules) else []
    names = {t.name for t in tools}
    for extra in load_tools(*others) if others else []:
        if extra.name in names:
            raise ValueError(f"two tools are named {extra.name!r}")
        tools.append(extra)
    return tools
