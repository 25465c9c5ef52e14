"""Tools are async Python functions with type hints; their JSON schema is derived from the hints.

    @tool(description="Add two numbers.")
    async def add(a: float, b: float) -> float:
        return a + b

Arguments are validated against the schema before the function runs, so a model's bad call becomes a
clear error result, never an exception inside the tool. A parameter annotated ``ToolContext`` is not
part of the schema: the service passes the call's context (run and step ids, the attempt, the database
pool, a way to ask the retrieval service).

Retries are the tool's own business because only the tool knows what is safe to repeat: a tool that
raises ``ToolError(retriable=True)`` (or times out, with ``retry_on_timeout=True``) is run again by the
tool service, with exponential backoff, up to ``max_attempts`` times. The default is one attempt.

For the same reason a tool says whether running it twice for one step is harmless (``idempotent=True``:
a pure function, a read; MCP calls it ``idempotentHint``). The tool service then still checks every call
against its run's record but keeps no ``tool_calls`` row for it: no claim before and no result after,
two PostgreSQL commits a call fewer, and a redelivered or interrupted call simply runs again. By
default a tool is not, and runs at most once per step (services/tools/service.py).
"""

from __future__ import annotations

import importlib
import inspect
import random
import types
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

import asyncpg

from agentstream.streams.core.errors import ToolArgumentError
from agentstream.streams.core.tools import ToolInfo

if TYPE_CHECKING:
    from agentstream.streams.core.events import RetrievalCompleted

#: ``retrieve(query, k, collection, timeout_s)``: publish a RetrievalRequested for this call and wait for
#: its RetrievalCompleted (the tool service provides it; see services/tools/service.py).
Retrieve = Callable[[str, int, str, float], Awaitable["RetrievalCompleted"]]

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class ToolContext:
    """What a tool may know about its call. ``step_id`` is stable across redeliveries and attempts:
    a tool with external side effects should pass it on as its idempotency key."""

    run_id: str
    step_id: str
    pool: asyncpg.Pool | None = None
    #: 1 for the first execution, 2 for the first retry, and so on.
    attempt: int = 1
    #: Ask the retrieval service (through events); None where the worker offers no retrieval.
    retrieve: Retrieve | None = None
    #: ``sql_query``'s own small pool, apart from ``pool``: a slow or huge query holds only these
    #: connections, never those the tool service records its calls with. None where no tool needs it.
    query_pool: asyncpg.Pool | None = None


@dataclass(frozen=True)
class Tool(Generic[P, R]):
    """An async function made a tool by ``@tool``. ``Tool[P, R]`` keeps the function's signature:
    ``fn`` is the function itself, and calling the tool calls it (no validation, no retries; the
    tool service goes through ``validate`` and ``call``)."""

    name: str
    description: str
    fn: Callable[P, Awaitable[R]]
    parameters: dict[str, Any]
    timeout_s: float = 10.0
    requires_approval: bool = False
    context_param: str | None = None
    #: Executions at most, the first included; retried only on retriable errors.
    max_attempts: int = 1
    #: First backoff between attempts; doubled each time (with jitter), capped at ``max_backoff_s``.
    backoff_s: float = 0.2
    max_backoff_s: float = 5.0
    #: Whether running past ``timeout_s`` is worth another attempt (safe only for repeatable tools).
    retry_on_timeout: bool = False
    #: Whether running the tool twice for one step is harmless (no effects, or effects that repeat as
    #: one): then the tool service records no claim and no result row for its calls, and a redelivered
    #: or interrupted call runs again rather than being answered from the row or as "interrupted".
    idempotent: bool = False
    #: The version of what the tool tells the catalogue (description, parameters, ``requires_approval``):
    #: raise it with every change, or the catalogue refuses the new metadata as a conflict and keeps the
    #: old; a worker with a lower version cannot change it back (streams/catalog/tools.py).
    version: int = 1
    _hints: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"tool {self.name}: max_attempts must be at least 1")
        if self.timeout_s <= 0 or self.backoff_s < 0:
            raise ValueError(f"tool {self.name}: timeout_s must be positive and backoff_s not negative")
        if self.version < 1:
            raise ValueError(f"tool {self.name}: version must be at least 1")

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Awaitable[R]:
        return self.fn(*args, **kwargs)

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt``: exponential, capped, with jitter (so
        the retries of many calls that failed together do not hit the dependency together)."""
        base = min(self.max_backoff_s, self.backoff_s * (2 ** (attempt - 1)))
        return base * (0.5 + random.random() / 2)

    def info(self) -> ToolInfo:
        return ToolInfo(self.name, self.description, self.parameters, self.requires_approval, self.version)

    def validate(self, arguments: Any) -> dict[str, Any]:
        """The arguments, checked against the schema (ints accepted for floats, nothing else coerced)."""
        if not isinstance(arguments, dict):
            raise ToolArgumentError(f"{self.name}: arguments must be a JSON object")
        props: dict[str, Any] = self.parameters["properties"]
        unknown = sorted(set(arguments) - set(props))
        if unknown:
            raise ToolArgumentError(f"{self.name}: unknown argument(s) {', '.join(unknown)}; "
                                    f"expected {', '.join(props) or 'none'}")
        missing = [p for p in self.parameters.get("required", []) if p not in arguments]
        if missing:
            raise ToolArgumentError(f"{self.name}: missing required argument(s) {', '.join(missing)}")
        for name, value in arguments.items():
            problem = _type_problem(value, props[name])
            if problem:
                raise ToolArgumentError(f"{self.name}: argument {name!r} {problem}")
        return arguments

    async def call(self, arguments: dict[str, Any], context: ToolContext) -> R:
        kwargs = dict(arguments)
        if self.context_param:
            kwargs[self.context_param] = context
        fn: Callable[..., Awaitable[R]] = self.fn  # arguments checked by validate(), not by the type
        return await fn(**kwargs)


_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array"}


def _schema_for(hint: Any) -> dict[str, Any]:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        schema = _schema_for(args[0]) if len(args) == 1 else {}
        return schema
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(hint))}
    if origin in (list, tuple):
        items = typing.get_args(hint)
        return {"type": "array", **({"items": _schema_for(items[0])} if items else {})}
    if origin is dict or hint is dict:
        return {"type": "object"}
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    raise TypeError(f"tool parameter type {hint!r} has no JSON schema mapping")


def _type_problem(value: Any, schema: dict[str, Any]) -> str | None:
    if "enum" in schema:
        return None if value in schema["enum"] else f"must be one of {schema['enum']}"
    kind = schema.get("type")
    ok = {
        "string": isinstance(value, str),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, (int, float)) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
        None: True,
    }[kind]
    return None if ok else f"must be of type {kind} (got {type(value).__name__})"


@overload
def tool(fn: Callable[P, Awaitable[R]]) -> Tool[P, R]: ...


@overload
def tool(fn: None = None, *, name: str | None = None, description: str | None = None,
         timeout_s: float = 10.0, requires_approval: bool = False, max_attempts: int = 1,
         backoff_s: float = 0.2, max_backoff_s: float = 5.0, retry_on_timeout: bool = False,
         idempotent: bool = False, version: int = 1) -> Callable[[Callable[P, Awaitable[R]]], Tool[P, R]]: ...


def tool(fn: Callable[P, Awaitable[R]] | None = None, *, name: str | None = None,
         description: str | None = None, timeout_s: float = 10.0, requires_approval: bool = False,
         max_attempts: int = 1, backoff_s: float = 0.2, max_backoff_s: float = 5.0,
         retry_on_timeout: bool = False, idempotent: bool = False, version: int = 1,
         ) -> Tool[P, R] | Callable[[Callable[P, Awaitable[R]]], Tool[P, R]]:
    """Make an async function a ``Tool`` (usable bare, ``@tool``, or with options, ``@tool(...)``).
    The tool keeps the function's type: ``Tool[P, R]`` for an ``async def f(*P) -> R``."""

    def wrap(func: Callable[P, Awaitable[R]]) -> Tool[P, R]:
        if not inspect.iscoroutinefunction(func):
            raise TypeError(f"tool {func.__name__} must be an async function")
        hints = typing.get_type_hints(func)
        props: dict[str, Any] = {}
        required: list[str] = []
        context_param = None
        for pname, param in inspect.signature(func).parameters.items():
            hint = hints.get(pname, Any)
            if hint is ToolContext or ToolContext in typing.get_args(hint):
                context_param = pname
                continue
            if hint is Any:
                raise TypeError(f"tool {func.__name__}: parameter {pname!r} needs a type hint")
            props[pname] = _schema_for(hint)
            if param.default is inspect.Parameter.empty:
                required.append(pname)
        doc = description or (inspect.getdoc(func) or "").split("\n\n")[0].strip() or func.__name__
        return Tool(name=name or func.__name__, description=doc, fn=func,
                    parameters={"type": "object", "properties": props, "required": required},
                    timeout_s=timeout_s, requires_approval=requires_approval, context_param=context_param,
                    max_attempts=max_attempts, backoff_s=backoff_s, max_backoff_s=max_backoff_s,
                    retry_on_timeout=retry_on_timeout, idempotent=idempotent, version=version)

    return wrap(fn) if fn is not None else wrap


def load_tools(*modules: str) -> list[Tool]:
    """Every ``Tool`` defined at the top level of the named modules."""
    found: dict[str, Tool] = {}
    for module_name in modules:
        module = importlib.import_module(module_name)
        for value in vars(module).values():
            if isinstance(value, Tool):
                if value.name in found and found[value.name] is not value:
                    raise ValueError(f"two tools are named {value.name!r}")
                found[value.name] = value
    if modules and not found:
        raise ValueError(f"no tools found in {', '.join(modules)} (decorate async functions with @tool)")
    return list(found.values())
