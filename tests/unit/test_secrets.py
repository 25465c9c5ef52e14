"""Passwords never printed: ``mask_url``, the reprs of settings, the state file's permissions, and what
the ``dev`` commands and the demo print (Typer's runner; the stack's servers are not needed)."""

from __future__ import annotations

import json
import re
import stat

import pytest
from rich.console import Console
from typer.testing import CliRunner

from agentstream import cli, demo
from agentstream.deploy import values
from agentstream.devstack import check, stack
from agentstream.devstack.stack import StackStatus
from agentstream.streams.config.masking import mask_url
from agentstream.streams.config.settings import Settings
from agentstream.streams.config.stack_state import StackPaths, read_state, write_state
from agentstream.streams.config.telemetry import TelemetrySettings
from agentstream.streams.core.errors import ConfigError

SECRET = "s3cr%40t-Pw"  # percent-encoded, as a password with an @ must be in a URL
DB_URL = f"postgresql://agent:{SECRET}@db.example:5432/agentstream"
KAFKA_PW = "k4fka-pw"
KAFKA = f"SASL_SSL://alice:{KAFKA_PW}@b1.example:9092,SASL_SSL://alice:{KAFKA_PW}@b2.example:9092"


@pytest.mark.parametrize(("url", "masked"), [
    ("postgresql://user:secret@host/db", "postgresql://user:***@host/db"),
    ("postgres://user:secret@host:5432/db?sslmode=require", "postgres://user:***@host:5432/db?sslmode=require"),
    ("postgresql://:secret@host/db", "postgresql://:***@host/db"),
    # percent-encoded, and raw characters a careless URL may hold: the last @ before the query ends it
    ("postgresql://u:p%40ss%2Fw%3A@h/db", "postgresql://u:***@h/db"),
    ("postgresql://u:p@ss/w:rd@h/db", "postgresql://u:***@h/db"),
    ("postgresql://u:pa?ss@h/db", "postgresql://u:***@h/db"),
    ("postgresql://u:pa#ss@h/db", "postgresql://u:***@h/db"),
    # secrets as parameters: libpq's URI query and key=value forms
    ("postgresql://u@h/db?password=secret&sslmode=require", "postgresql://u@h/db?password=***&sslmode=require"),
    ("postgresql://u@h/db?sslpassword=secret", "postgresql://u@h/db?sslpassword=***"),
    ("host=h user=u password=secret dbname=db", "host=h user=u password=*** dbname=db"),
    # lists: multi-host DSNs, Kafka bootstrap servers with and without schemes
    ("postgresql://u:secret@h1:5432,h2:5433/db", "postgresql://u:***@h1:5432,h2:5433/db"),
    ("SASL_SSL://a:secret@b1:9092,SASL_SSL://b:secret@b2:9092", "SASL_SSL://a:***@b1:9092,SASL_SSL://b:***@b2:9092"),
    ("a:secret@b1:9092,b2:9092", "a:***@b1:9092,b2:9092"),
    ("https://u:secret@registry.example/?api_token=secret", "https://u:***@registry.example/?api_token=***"),
])
def test_mask_url_hides_the_password_and_keeps_the_rest(url, masked):
    assert mask_url(url) == masked


@pytest.mark.parametrize("url", [
    "postgresql://postgres@127.0.0.1:35432/agentstream",
    "postgresql://host/db",
    "127.0.0.1:39092",
    "kafka-0.kafka:9092,kafka-1.kafka:9092",
    "http://example.com:80/path?mail=a@b",  # an @ in the query is not user information
    "",
])
def test_mask_url_leaves_a_url_without_password_unchanged(url):
    assert mask_url(url) == url


def test_reprs_of_settings_and_status_mask_passwords():
    settings = Settings(kafka_bootstrap=KAFKA, database_url=DB_URL, schema_registry_url="http://u:regpw@r:8081",
                        telemetry=TelemetrySettings(otlp_endpoint="https://u:otlppw@collector:4318/v1/traces"))
    status = StackStatus(kafka=KAFKA, database_url=DB_URL, running=True, kafka_running=True, postgres_running=True)
    for text in (repr(settings), str(settings), repr(status), repr([settings])):
        for secret in (SECRET, KAFKA_PW, "regpw", "otlppw"):
            assert secret not in text
    assert "postgresql://agent:***@db.example:5432/agentstream" in repr(settings)
    assert settings.database_url == DB_URL  # only what is shown is masked


def test_the_state_file_is_readable_by_its_owner_only(tmp_path):
    state_file = tmp_path / "stack.json"
    state_file.with_suffix(".tmp").write_text("left over")
    state_file.with_suffix(".tmp").chmod(0o644)
    write_state(state_file, {"database_url": DB_URL})
    assert stat.S_IMODE(state_file.stat().st_mode) == 0o600
    assert read_state(state_file) == {"database_url": DB_URL}
    state_file.chmod(0o644)  # an older release's file: rewritten owner-only
    write_state(state_file, {"database_url": DB_URL, "kafka": "h:1"})
    assert stat.S_IMODE(state_file.stat().st_mode) == 0o600


@pytest.fixture
def recorded(tmp_path, monkeypatch) -> StackPaths:
    """A state file naming a database and a Kafka cluster with passwords (nothing running)."""
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("AGENTSTREAM_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("AGENTSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    paths = StackPaths.from_env()
    paths.state_dir.mkdir(parents=True)
    write_state(paths.state_file, {"kafka": KAFKA, "database_url": DB_URL})
    return paths


def _run(*args: str) -> str:
    result = CliRunner().invoke(cli.app, list(args), env={"COLUMNS": "250"})
    return result.stdout + (result.stderr if result.stderr_bytes is not None else "")


def _assert_masked(out: str) -> None:
    flat = re.sub(r"\s+", "", out)  # rich wraps long titles: a password split over two lines still counts
    for secret in (SECRET, KAFKA_PW, "s3cr"):
        assert secret not in flat, out
    assert "postgresql://agent:***@db.example:5432/agentstream" in flat, out


def test_dev_status_prints_urls_masked_in_the_table_and_the_json(recorded):
    _assert_masked(_run("dev", "status"))
    out = _run("dev", "status", "--json")
    _assert_masked(out)
    shown = json.loads(out)
    assert shown["database_url"] == "postgresql://agent:***@db.example:5432/agentstream"
    assert shown["kafka"] == mask_url(KAFKA) and shown["running"] is False
    # What connects reads the settings, which still have the real URL.
    assert Settings.load(recorded).database_url == DB_URL


def test_dev_up_and_check_print_urls_masked(recorded, monkeypatch):
    status = StackStatus(kafka=KAFKA, database_url=DB_URL, running=True, kafka_running=True, postgres_running=True)
    monkeypatch.setattr(stack.DevStack, "up", lambda self, **_: status)  # what a started stack reports
    _assert_masked(_run("dev", "up"))

    async def no_steps(settings: Settings) -> list[check.CheckStep]:
        assert settings.database_url == DB_URL  # the check itself connects with the real one
        return []

    monkeypatch.setattr(check, "run_check", no_steps)
    _assert_masked(_run("dev", "check"))


async def test_the_demo_prints_urls_masked(monkeypatch):
    class Stop(Exception):
        pass

    def refuse(*_args, **_kwargs):
        raise Stop

    monkeypatch.setattr(demo.Pipeline, "start", refuse)
    console = Console(record=True, width=250)
    with pytest.raises(Stop):
        await demo.run_demo("task", "scripted", console, settings=Settings(kafka_bootstrap=KAFKA, database_url=DB_URL))
    _assert_masked(console.export_text())


def test_a_bad_deploy_set_does_not_echo_a_password():
    with pytest.raises(ConfigError) as info:
        values.parse_set(f"postgresql://agent:{SECRET}@db/x")
    assert SECRET not in str(info.value)
