"""Which MCP servers a tool worker serves, and the agentstream name each of their tools gets.

A server is given as ``NAME=TARGET``:

- ``time=stdio:python -m mcp_server_time``: run the command as a child process and speak MCP over its
  stdin/stdout. The command line is split as a shell would (``shlex``), without a shell; leading
  ``KEY=VALUE`` words are environment variables for the child, which otherwise gets only the SDK's safe
  defaults (``HOME``, ``PATH``, ``USER``...), never the worker's whole environment (its database password);
- ``search=http://127.0.0.1:8000/mcp`` (or ``https://``): a server already running, over MCP's streamable
  HTTP transport.

Names. An MCP tool ``get_current_time`` of the server ``time`` is the agentstream tool
``time__get_current_time``. The separator is two underscores, not a dot, because a run's tools may go
to the engine as OpenAI function tools (``tool_calling="native"``), whose names OpenAI's own API, and
the servers that copy its validation, restrict to letters, digits, ``_`` and ``-`` (64 at most). For the
same reason any other character of an MCP tool's name becomes ``_`` (MCP allows ``.`` and ``/``); two
tools that end up with one name are refused at start. agentstream itself allows any name up to 256 bytes
(streams/core/task_rules.py), and commas would break ``submit --tools a,b``: the mapping avoids both.

What the worker decides, not the MCP server: a server's annotations (``readOnlyHint``,
``idempotentHint``, ``destructiveHint``) are hints from a process the run does not control, so they
never weaken a guarantee. Every MCP tool runs at most once per step (a claim in ``tool_calls``) unless
the operator names it ``idempotent``, and needs a person's approval when the operator names it in
``requires_approval`` — both as shell-style patterns over the agentstream names (``time__*``).
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agentstream.streams.config import env
from agentstream.streams.core.errors import ConfigError

#: Between the server's name and the tool's.
SEPARATOR = "__"
#: Letters and digits, single ``_`` or ``-`` between them: a server's name never contains the separator,
#: so ``a__b__c`` is unambiguously server ``a``'s tool ``b__c``.
SERVER_NAME = re.compile(r"[A-Za-z0-9]+(?:[-_][A-Za-z0-9]+)*")
MAX_SERVER_NAME = 32
#: What OpenAI-style function names allow; anything else in an MCP tool's name becomes ``_``.
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_ENV_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
#: Seconds a call may take, by default (a hung server's calls fail after this).
DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True, kw_only=True)
class McpServer:
    """One MCP server: its name (the prefix of its tools' names) and how to reach it — ``command`` (stdio)
    or ``url`` (streamable HTTP) — and the worker's rules for its tools."""

    name: str
    command: tuple[str, ...] = ()
    #: Environment variables for a stdio server's process, over the SDK's safe defaults.
    env: Mapping[str, str] = field(default_factory=dict)
    url: str | None = None
    #: Seconds one call may take, reconnecting included; past it the call fails with a clear error.
    timeout_s: float = DEFAULT_TIMEOUT_S
    #: Seconds to start the process (or reach the URL) and complete MCP's handshake.
    connect_timeout_s: float = 20.0
    #: Patterns (fnmatch) over agentstream names: these tools wait for a person's approval.
    requires_approval: tuple[str, ...] = ()
    #: Patterns over agentstream names: these tools may run twice for one step (no claim, and a lost
    #: connection or a timeout is tried once more).
    idempotent: tuple[str, ...] = ()
    #: The catalogue's metadata version of this server's tools: raise it when their descriptions, schemas
    #: or approval change, or the catalogue keeps the old metadata (streams/catalog/tools.py).
    version: int = 1

    def __post_init__(self) -> None:
        if not SERVER_NAME.fullmatch(self.name) or len(self.name) > MAX_SERVER_NAME:
            raise ConfigError(f"MCP server name {self.name!r}: use letters, digits and single '-' or '_' between "
                              f"them, at most {MAX_SERVER_NAME} characters")
        if bool(self.command) == (self.url is not None):
            raise ConfigError(f"MCP server {self.name!r}: give either a command (stdio) or a URL (streamable HTTP)")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"MCP server {self.name!r}: the URL must start with http:// or https:// "
                              f"(got {self.url!r})")
        if self.timeout_s <= 0 or self.connect_timeout_s <= 0:
            raise ConfigError(f"MCP server {self.name!r}: timeouts must be positive")
        if self.version < 1:
            raise ConfigError(f"MCP server {self.name!r}: version must be at least 1")

    @classmethod
    def parse(cls, spec: str, **rules: object) -> McpServer:
        """``NAME=stdio:COMMAND ARGS…`` or ``NAME=http(s)://…``; ``rules`` are the other fields
        (``timeout_s``, ``requires_approval``...). Raises ``ConfigError`` saying what is wrong."""
        name, eq, target = spec.strip().partition("=")
        name, target = name.strip(), target.strip()
        if not eq or not name or not target:
            raise ConfigError(f"MCP server {spec!r}: expected NAME=stdio:COMMAND or NAME=http(s)://HOST:PORT/PATH")
        if target.startswith(("http://", "https://")):
            return cls(name=name, url=target, **rules)  # type: ignore[arg-type]
        if not target.startswith("stdio:"):
            raise ConfigError(f"MCP server {name!r}: the target must start with stdio: (a command) or http(s):// "
                              f"(got {target!r})")
        try:
            words = shlex.split(target.removeprefix("stdio:"))
        except ValueError as exc:
            raise ConfigError(f"MCP server {name!r}: cannot split the command: {exc}") from None
        env: dict[str, str] = {}
        while words and _ENV_WORD.match(words[0]):
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        if not words:
            raise ConfigError(f"MCP server {name!r}: stdio: needs a command")
        return cls(name=name, command=tuple(words), env=env, **rules)  # type: ignore[arg-type]

    def describe(self) -> str:
        """Where the server is, for messages (no environment values: they may be secrets)."""
        return f"stdio: {shlex.join(self.command)}" if self.command else f"{self.url}"

    def tool_name(self, mcp_name: str) -> str:
        """The agentstream name of this server's tool ``mcp_name`` (``time__get_current_time``)."""
        return f"{self.name}{SEPARATOR}{_UNSAFE.sub('_', mcp_name)}"

    def needs_approval(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) for p in self.requires_approval)

    def is_idempotent(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) for p in self.idempotent)


@dataclass(frozen=True, kw_only=True)
class McpSettings:
    """The MCP servers of a tool worker and the rules for all their tools, as the CLI and the
    environment give them (``from_env``, then ``with_options``); ``servers()`` builds each ``McpServer``."""

    specs: tuple[str, ...] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S
    requires_approval: tuple[str, ...] = ()
    idempotent: tuple[str, ...] = ()
    version: int = 1

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> McpSettings:
        """``AGENTSTREAM_MCP_SERVERS`` (specs separated by ``;`` or new lines), ``AGENTSTREAM_MCP_TIMEOUT_S``,
        ``AGENTSTREAM_MCP_APPROVE`` and ``AGENTSTREAM_MCP_IDEMPOTENT`` (comma-separated patterns),
        ``AGENTSTREAM_MCP_TOOLS_VERSION``. The caller passes the environment (streams/config reads it)."""
        specs = tuple(s.strip() for s in re.split(r"[;\n]", environ.get("AGENTSTREAM_MCP_SERVERS", "")) if s.strip())

        return cls(specs=specs, timeout_s=env.positive_number(environ, "AGENTSTREAM_MCP_TIMEOUT_S", float, DEFAULT_TIMEOUT_S),
                   requires_approval=_patterns(environ.get("AGENTSTREAM_MCP_APPROVE", "")),
                   idempotent=_patterns(environ.get("AGENTSTREAM_MCP_IDEMPOTENT", "")),
                   version=env.positive_number(environ, "AGENTSTREAM_MCP_TOOLS_VERSION", int, 1))

    def with_options(self, *, specs: Sequence[str] | None = None, timeout_s: float | None = None,
                     requires_approval: Sequence[str] | None = None,
                     idempotent: Sequence[str] | None = None) -> McpSettings:
        """These settings with the command line's options over them (an option given replaces the variable)."""
        return McpSettings(
            specs=tuple(specs) if specs else self.specs,
            timeout_s=timeout_s if timeout_s is not None else self.timeout_s,
            requires_approval=_flatten(requires_approval) if requires_approval else self.requires_approval,
            idempotent=_flatten(idempotent) if idempotent else self.idempotent, version=self.version)

    def servers(self) -> list[McpServer]:
        """One ``McpServer`` per spec; ``ConfigError`` for a bad spec or two servers of one name."""
        servers = [McpServer.parse(s, timeout_s=self.timeout_s, requires_approval=self.requires_approval,
                                   idempotent=self.idempotent, version=self.version) for s in self.specs]
        names = [s.name for s in servers]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(f"two MCP servers are named {', '.join(twice)}")
        return servers


def _patterns(raw: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in raw.split(",") if p.strip())


def _flatten(values: Sequence[str]) -> tuple[str, ...]:
    """Repeated options, each of which may itself be comma-separated."""
    return tuple(p for v in values for p in _patterns(v))
