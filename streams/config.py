"""Settings: the only module that reads the environment.

Where a setting comes from, first match wins:

1. the environment (``KAFKA_BOOTSTRAP_SERVERS``, ``DATABASE_URL``, ``AGENTSTREAM_*``): a user's own
   cluster and database;
2. the state file that ``agentstream dev up`` writes (``<state dir>/stack.json``): the local stack;
3. the defaults of the local stack (loopback ports below).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from streams.errors import ConfigError

DEFAULT_KAFKA_PORT = 39092
DEFAULT_POSTGRES_PORT = 35432
DEFAULT_DATABASE = "agentstream"

#: The repository root: ``infra/`` (pom, broker config, SQL migrations) and ``schemas/`` live here.
REPO_ROOT = Path(__file__).resolve().parent.parent


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
            infra_dir=Path(infra).resolve() if infra else REPO_ROOT / "infra",
        )


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Connection settings every command and service starts from."""

    kafka_bootstrap: str
    database_url: str
    #: Which of the two came from the environment (a user's own cluster) rather than the local stack.
    external_kafka: bool = False
    external_database: bool = False
    paths: StackPaths = field(default_factory=StackPaths.from_env)
    #: Prepended to every topic and consumer-group name: isolates tests and replays.
    topic_prefix: str = ""
    #: Partitions of each run-keyed topic (the planner's inputs must agree, so it is one number).
    partitions: int = 8
    #: A Confluent-compatible schema registry; None means the local registry built from schemas/.
    schema_registry_url: str | None = None
    #: How long the group waits for a silent member (a killed worker) before moving its partitions.
    session_timeout_ms: int = 10_000

    @classmethod
    def load(cls, paths: StackPaths | None = None) -> Settings:
        """Resolve settings from the environment, then the dev stack's state file, then defaults."""
        paths = paths or StackPaths.from_env()
        recorded = read_state(paths.state_file)
        env_kafka = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
        env_db = os.environ.get("DATABASE_URL", "").strip()
        return cls(
            kafka_bootstrap=env_kafka
            or recorded.get("kafka")
            or f"127.0.0.1:{DEFAULT_KAFKA_PORT}",
            database_url=env_db
            or recorded.get("database_url")
            or f"postgresql://postgres@127.0.0.1:{DEFAULT_POSTGRES_PORT}/{DEFAULT_DATABASE}",
            external_kafka=bool(env_kafka),
            external_database=bool(env_db),
            paths=paths,
            topic_prefix=os.environ.get("AGENTSTREAM_TOPIC_PREFIX", ""),
            partitions=_positive_int("AGENTSTREAM_PARTITIONS", 8),
            schema_registry_url=os.environ.get("AGENTSTREAM_SCHEMA_REGISTRY_URL") or None,
            session_timeout_ms=_positive_int("AGENTSTREAM_SESSION_TIMEOUT_MS", 10_000),
        )


def _positive_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"{name}={raw!r} must be a positive integer")
    return int(raw)


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
    """The ``AGENTSTREAM_HTTP_*`` / ``AGENTSTREAM_SQL_*`` variables that configure the built-in tools
    (parsed by ``services.tools.builtin.BuiltinConfig.from_env``)."""
    return {k: v for k, v in os.environ.items() if k.startswith(("AGENTSTREAM_HTTP_", "AGENTSTREAM_SQL_"))}


def embedding_files() -> tuple[str | None, str | None]:
    """Paths overriding the embedding model and tokenizer (``AGENTSTREAM_EMBEDDING_MODEL`` /
    ``AGENTSTREAM_EMBEDDING_TOKENIZER``); they must still match the pinned checksums."""
    return (os.environ.get("AGENTSTREAM_EMBEDDING_MODEL") or None,
            os.environ.get("AGENTSTREAM_EMBEDDING_TOKENIZER") or None)


def uvloop_enabled() -> bool:
    """uvloop runs the workers' event loops unless ``AGENTSTREAM_UVLOOP=0``."""
    return os.environ.get("AGENTSTREAM_UVLOOP", "1").strip().lower() not in ("0", "false", "no", "off")


def read_state(state_file: Path) -> dict:
    """The dev stack's recorded state, or ``{}`` when it has never been started."""
    try:
        return json.loads(state_file.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return {}
