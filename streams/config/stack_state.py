"""The local development stack as settings see it: where it keeps its files (``StackPaths``), the state
file ``agentstream dev up`` writes (``<state dir>/stack.json``), and the loopback ports it listens on by
default."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentstream.streams.core import resources

DEFAULT_KAFKA_PORT = 17092
DEFAULT_POSTGRES_PORT = 17432
DEFAULT_DATABASE = "agentstream"


def _home_dir(env_name: str, xdg_name: str, fallback: str) -> Path:
    explicit = os.environ.get(env_name)
    if explicit:
        return Path(explicit).expanduser().resolve()
    base = os.environ.get(xdg_name)
    root = Path(base).expanduser() if base else Path.home() / fallback
    return (root / "agentstream").resolve()


@dataclass(frozen=True, kw_only=True)
class StackPaths:
    """Where the local stack keeps what it downloads (cache) and what it runs (state)."""

    cache_dir: Path
    state_dir: Path
    infra_dir: Path

    @property
    def state_file(self) -> Path:
        return self.state_dir / "stack.json"

    @classmethod
    def from_env(cls) -> StackPaths:
        infra = os.environ.get("AGENTSTREAM_INFRA_DIR")
        return cls(
            cache_dir=_home_dir("AGENTSTREAM_CACHE_DIR", "XDG_CACHE_HOME", ".cache"),
            state_dir=_home_dir("AGENTSTREAM_STATE_DIR", "XDG_STATE_HOME", ".local/state"),
            infra_dir=Path(infra).resolve() if infra else resources.infra_dir(),
        )


def write_state(state_file: Path, state: dict[str, Any]) -> None:
    """Replace the dev stack's state file atomically, readable by its owner only (0600): it holds the
    ``DATABASE_URL`` with its password, which nothing prints (``mask_url``)."""
    tmp = state_file.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)  # a leftover could have wider permissions; O_CREAT keeps an existing file's
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, state_file)


def read_state(state_file: Path) -> dict[str, Any]:
    """The dev stack's recorded state, or ``{}`` when it has never been started (or the file is not a
    JSON object)."""
    try:
        state = json.loads(state_file.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}
