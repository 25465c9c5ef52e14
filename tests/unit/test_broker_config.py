"""Nothing agentstream runs asks a broker to auto-create a topic, and the dev launcher takes overrides."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka.protocol.metadata import MetadataRequest

from agentstream.devstack.kafka import KafkaLauncher
from agentstream.streams.config.kafka_auth import KafkaAuth, kafka_options
from agentstream.streams.config.kafka_defaults import disable_auto_topic_creation
from agentstream.streams.core.errors import StackError

REPO = Path(__file__).resolve().parents[2]
KAFKA_4_VERSIONS = {MetadataRequest.API_KEY: (0, 12)}  # aiokafka picks the highest it has (v5)


def test_a_metadata_request_aiokafka_builds_does_not_allow_auto_creation() -> None:
    kafka_options("localhost:9092", KafkaAuth())  # what every client agentstream builds does first
    struct = MetadataRequest(["agent.outcomes"]).prepare(KAFKA_4_VERSIONS)
    assert struct.API_VERSION >= 4
    assert struct.allow_auto_topic_creation is False
    assert struct.topics == ["agent.outcomes"]


def test_an_explicit_request_for_auto_creation_is_still_honoured() -> None:
    struct = MetadataRequest(["t"], allow_auto_topic_creation=True).prepare(KAFKA_4_VERSIONS)
    assert struct.allow_auto_topic_creation is True


def test_applying_twice_wraps_once() -> None:
    before = MetadataRequest.__init__
    disable_auto_topic_creation()
    assert MetadataRequest.__init__ is before


def test_importing_patches_nothing_and_a_clients_options_apply_it() -> None:
    """Not the test session's doing: in a fresh interpreter, importing the backbone leaves aiokafka as it
    is, and the first client's options (``kafka_options``) apply the default."""
    code = ("import agentstream.streams.runtime.runner, agentstream.streams.client.agent_client\n"
            "from aiokafka.protocol.metadata import MetadataRequest\n"
            "print(MetadataRequest(['x']).prepare({3: (0, 12)}).allow_auto_topic_creation)\n"
            "from agentstream.streams.config.kafka_auth import KafkaAuth, kafka_options\n"
            "kafka_options('localhost:9092', KafkaAuth())\n"
            "print(MetadataRequest(['x']).prepare({3: (0, 12)}).allow_auto_topic_creation)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.split() == ["True", "False"]


def _launcher(tmp_path: Path, overrides: dict[str, str]) -> KafkaLauncher:
    return KafkaLauncher(infra_dir=REPO / "infra", cache_dir=tmp_path / "cache", work_dir=tmp_path / "kafka",
                         port=1234, controller_port=1235, overrides=overrides)


def _properties(path: Path) -> dict[str, str]:
    """As java.util.Properties reads the file: the last value of a key wins."""
    props: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            props[key.strip()] = value.strip()
    return props


def test_launcher_overrides_win_over_the_template(tmp_path: Path) -> None:
    launcher = _launcher(tmp_path, {"auto.create.topics.enable": "true", "num.partitions": "3"})
    launcher.work_dir.mkdir(parents=True)
    props = _properties(launcher._render_config())
    assert props["auto.create.topics.enable"] == "true"
    assert props["num.partitions"] == "3"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:1234,CONTROLLER://127.0.0.1:1235"


def test_without_overrides_the_template_is_unchanged(tmp_path: Path) -> None:
    launcher = _launcher(tmp_path, {})
    launcher.work_dir.mkdir(parents=True)
    assert _properties(launcher._render_config())["auto.create.topics.enable"] == "false"


def test_an_override_cannot_smuggle_in_another_property(tmp_path: Path) -> None:
    launcher = _launcher(tmp_path, {"num.partitions": "1\nauto.create.topics.enable=true"})
    launcher.work_dir.mkdir(parents=True)
    with pytest.raises(StackError, match="invalid broker property override"):
        launcher._render_config()
