"""Reading the environment: the parsers every settings class uses, and the few settings read as one value.

Each parser takes the variable's name and a default, and raises ``ConfigError`` naming the variable and
what it must be; an unset or blank variable is the default.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from agentstream.streams.core.errors import ConfigError

N = TypeVar("N", int, float)
_FLAGS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def tenant() -> str:
    """``AGENTSTREAM_TENANT``: the tenant this process works for (docs/security.md, "Tenants")."""
    return os.environ.get("AGENTSTREAM_TENANT", "").strip()


def positive_number(environ: Mapping[str, str], name: str, kind: type[N], default: N) -> N:
    """``environ[name]`` as a positive ``int`` or ``float`` (a tool worker's settings are read from the
    environment it is given: streams/config/env.py ``tool_environment``)."""
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


def positive_float(name: str, default: float) -> float:
    return _float_env(name, default, lambda v: v > 0, "a positive number")


def fraction(name: str, default: float) -> float:
    return _float_env(name, default, lambda v: 0.0 <= v <= 1.0, "a number between 0 and 1")


def _float_env(name: str, default: float, ok: Callable[[float], bool], must: str) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")  # fails every check
    if not ok(value):
        raise ConfigError(f"{name}={raw!r} must be {must}")
    return value


def threshold_spec(name: str, default: float) -> tuple[float, dict[str, float]]:
    """``"10,http_get=5"`` → (10.0, {"http_get": 5.0}); a part without ``=`` is the default."""
    raw = os.environ.get(name, "").strip()
    overrides: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in raw.split(","))):
        key, eq, value = part.partition("=")
        try:
            number = float(value if eq else key)
        except ValueError:
            number = -1.0
        if not number > 0:
            raise ConfigError(f"{name}: {part!r} must be SECONDS or TOOL=SECONDS with a positive number")
        if eq:
            overrides[key.strip()] = number
        else:
            default = number
    return default, overrides


def directory(name: str) -> Path | None:
    """An existing directory, resolved; None when unset."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    path = Path(raw).expanduser().resolve()
    if not path.is_dir():
        raise ConfigError(f"{name}={raw!r} is not a directory")
    return path


def positive_int(name: str, default: int) -> int:
    return _whole_number(name, default, minimum=1)


def non_negative_int(name: str, default: int) -> int:
    return _whole_number(name, default, minimum=0)


def optional_positive_int(name: str) -> int | None:
    """A positive integer, or None when unset (no limit, the engine's own default)."""
    return positive_int(name, 0) or None


def _whole_number(name: str, default: int, *, minimum: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < minimum:
        wanted = "a positive integer" if minimum == 1 else f"a whole number, {minimum} or more"
        raise ConfigError(f"{name}={raw!r} must be {wanted}")
    return int(raw)


def flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw not in _FLAGS:
        raise ConfigError(f"{name}={raw!r} must be one of {', '.join(_FLAGS)}")
    return _FLAGS[raw]


# -- settings read as one value -------------------------------------------------------------------

def dev_ports() -> tuple[int | None, int | None]:
    """Ports asked for the local stack by ``AGENTSTREAM_KAFKA_PORT`` / ``AGENTSTREAM_PG_PORT``."""

    def port(name: str) -> int | None:
        raw = os.environ.get(name, "").strip()
        if not raw:
            return None
        if not raw.isdigit() or not 0 < int(raw) < 65536:
            raise ConfigError(f"{name}={raw!r} is not a TCP port number")
        return int(raw)

    return port("AGENTSTREAM_KAFKA_PORT"), port("AGENTSTREAM_PG_PORT")


def model_api_key() -> str | None:
    """The API key for an OpenAI-compatible model server: ``AGENTSTREAM_MODEL_API_KEY``, else
    ``OPENAI_API_KEY``."""
    return os.environ.get("AGENTSTREAM_MODEL_API_KEY") or os.environ.get("OPENAI_API_KEY") or None


def tool_environment() -> dict[str, str]:
    """The ``AGENTSTREAM_HTTP_*`` / ``AGENTSTREAM_SQL_*`` / ``AGENTSTREAM_BUILTIN_TOOLS_VERSION`` variables
    that configure the built-in tools (parsed by ``agentstream.services.tools.builtin.BuiltinConfig.from_env``),
    and the ``AGENTSTREAM_MCP_*`` ones of the MCP servers' tools (``...tools.mcp.config.McpSettings.from_env``)."""
    return {k: v for k, v in os.environ.items()
            if k.startswith(("AGENTSTREAM_HTTP_", "AGENTSTREAM_SQL_", "AGENTSTREAM_MCP_"))
            or k == "AGENTSTREAM_BUILTIN_TOOLS_VERSION"}


def embedding_files() -> tuple[str | None, str | None]:
    """Paths overriding the embedding model and tokenizer (``AGENTSTREAM_EMBEDDING_MODEL`` /
    ``AGENTSTREAM_EMBEDDING_TOKENIZER``); they must still match the pinned checksums."""
    return (os.environ.get("AGENTSTREAM_EMBEDDING_MODEL") or None,
            os.environ.get("AGENTSTREAM_EMBEDDING_TOKENIZER") or None)


def uvloop_enabled() -> bool:
    """uvloop runs the workers' event loops unless ``AGENTSTREAM_UVLOOP=0``."""
    return os.environ.get("AGENTSTREAM_UVLOOP", "1").strip().lower() not in ("0", "false", "no", "off")
