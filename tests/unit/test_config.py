"""Where settings come from: the environment, then the dev stack's state file, then defaults."""

from __future__ import annotations

import json

import pytest

from agentstream.streams.config.env import dev_ports
from agentstream.streams.config.settings import Settings
from agentstream.streams.config.stack_state import DEFAULT_KAFKA_PORT, StackPaths
from agentstream.streams.core.errors import ConfigError


@pytest.fixture
def paths(tmp_path, monkeypatch) -> StackPaths:
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("AGENTSTREAM_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("AGENTSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    return StackPaths.from_env()


def test_defaults_without_state(paths):
    settings = Settings.load(paths)
    assert settings.kafka_bootstrap == f"127.0.0.1:{DEFAULT_KAFKA_PORT}"
    assert settings.database_url.startswith("postgresql://")
    assert not settings.external_kafka and not settings.external_database


def test_state_file_then_environment(paths, monkeypatch):
    paths.state_dir.mkdir(parents=True)
    paths.state_file.write_text(json.dumps({"kafka": "127.0.0.1:1111", "database_url": "postgresql://x@h:2/db"}))
    settings = Settings.load(paths)
    assert (settings.kafka_bootstrap, settings.database_url) == ("127.0.0.1:1111", "postgresql://x@h:2/db")

    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "broker-a:9092,broker-b:9092")
    settings = Settings.load(paths)
    assert settings.kafka_bootstrap == "broker-a:9092,broker-b:9092" and settings.external_kafka
    assert settings.database_url == "postgresql://x@h:2/db" and not settings.external_database


def test_corrupt_state_file_is_ignored(paths):
    paths.state_dir.mkdir(parents=True)
    paths.state_file.write_text("{not json")
    assert Settings.load(paths).kafka_bootstrap == f"127.0.0.1:{DEFAULT_KAFKA_PORT}"


def test_dev_ports_validated(monkeypatch):
    monkeypatch.setenv("AGENTSTREAM_KAFKA_PORT", "40000")
    monkeypatch.setenv("AGENTSTREAM_PG_PORT", "")
    assert dev_ports() == (40000, None)
    monkeypatch.setenv("AGENTSTREAM_PG_PORT", "nope")
    with pytest.raises(ConfigError, match="AGENTSTREAM_PG_PORT"):
        dev_ports()
