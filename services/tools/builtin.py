"""Built-in tools, and how a worker chooses which of them to serve.

- ``calculator``: arithmetic, always on;
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

import ast
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agentstream.services.tools.http import HttpGetConfig, http_get_tool
from agentstream.services.tools.registry import Tool, ToolContext, ToolError, load_tools, tool
from agentstream.services.tools.sql import SqlQueryConfig, sql_query_tool
from agentstream.streams.errors import ConfigError

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt, "abs": abs, "round": round, "min": min, "max": max, "log": math.log,
    "exp": math.exp, "sin": math.sin, "cos": math.cos, "tan": math.tan}
_CONSTANTS = {"pi": math.pi, "e": math.e}
MAX_EXPRESSION = 500
MAX_EXPONENT = 1000
MAX_MAGNITUDE = 1e300


def evaluate(expression: str) -> float | int:
    """Arithmetic on numbers, + - * / // % ** (or ^), parentheses, and a few math functions.

    The expression is parsed to an AST and only those node types are evaluated: no names beyond the
    listed functions and constants, no attributes, no calls of anything else, no eval or exec.
    """
    if len(expression) > MAX_EXPRESSION:
        raise ToolError(f"expression longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.replace("^", "**"), mode="eval")
    except SyntaxError as exc:
        raise ToolError(f"not an arithmetic expression: {exc.msg}") from None
    return _eval(tree.body)


def _eval(node: ast.AST) -> float | int:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ToolError(f"exponent larger than {MAX_EXPONENT}")
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
        if isinstance(value, complex) or abs(value) > MAX_MAGNITUDE:
            raise ToolError("result out of range")
        return value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS
            and not node.keywords):
        try:
            return _FUNCTIONS[node.func.id](*[_eval(a) for a in node.args])
        except (ValueError, TypeError) as exc:
            raise ToolError(f"{node.func.id}: {exc}") from None
    raise ToolError(f"unsupported element in expression: {ast.dump(node)[:60]}")


@tool(description="Evaluate an arithmetic expression, e.g. '17 * 23' or 'sqrt(2) / 3'.", timeout_s=2.0,
      idempotent=True)  # a pure function
async def calculator(expression: str) -> float | int:
    return evaluate(expression)


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
    #: a higher version comes (streams/tool_catalog.py): raise it when changing one of those settings.
    version: int = 1

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> BuiltinConfig:
        """From ``AGENTSTREAM_HTTP_ALLOWED_HOSTS`` (comma-separated; empty: http_get off),
        ``AGENTSTREAM_HTTP_ALLOW_PRIVATE`` (1: allowlisted hosts may resolve to private addresses),
        ``AGENTSTREAM_HTTP_MAX_BYTES``, ``AGENTSTREAM_HTTP_TIMEOUT_S``, ``AGENTSTREAM_SQL_TIMEOUT_S``,
        ``AGENTSTREAM_SQL_MAX_ROWS``, ``AGENTSTREAM_SQL_MAX_BYTES``, ``AGENTSTREAM_SQL_POOL_SIZE``,
        ``AGENTSTREAM_BUILTIN_TOOLS_VERSION``. The caller passes the environment (streams/config.py reads it)."""

        def number(name: str, kind: type, default: Any) -> Any:
            raw = environ.get(name, "").strip()
            if not raw:
                return default
            try:
                value = kind(raw)
            except ValueError:
                raise ConfigError(f"{name}={raw!r} is not a {kind.__name__}") from None
            if value <= 0:
                raise ConfigError(f"{name} must be positive (got {raw})")
            return value

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
