"""Processes with different versions of a schema read each other's events through the schemas topic
(streams/kafka/schema_log.py), here an in-memory stand-in for it; the broker-backed run is
tests/integration/test_rolling_upgrade.py."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest
from aiokafka.errors import KafkaConnectionError

from agentstream.streams.config.kafka_auth import KafkaAuth
from agentstream.streams.config.settings import Settings
from agentstream.streams.core.errors import DecodeError
from agentstream.streams.core.events import TaskSubmitted, ToolCallRequested
from agentstream.streams.kafka.codec import Codec, codec_for
from agentstream.streams.kafka.registry import LocalRegistry, schema_id
from agentstream.streams.kafka.schema_log import SchemaLog, encode_schema
from tests.schema_upgrade import newer_schemas


class MemoryLog(SchemaLog):
    """The schemas topic as a list of (key, value) records, shared by the processes of a test."""

    def __init__(self, registry: LocalRegistry, records: list[tuple[bytes | None, bytes | None]]) -> None:
        super().__init__("unused:9092", "t.agent.schemas", registry, auth=KafkaAuth())
        self.records = records
        self.fail: Exception | None = None

    async def publish(self, producer: object = None) -> int:
        current = [encode_schema(raw) for raw in self.registry.raw_current().values()]
        self.records.extend(current)
        return len(current)

    async def _read(self) -> None:
        if self.fail is not None:
            raise self.fail
        self.reads += 1
        for offset in range(self._position, len(self.records)):
            self._learn(*self.records[offset])
        self._position = len(self.records)


@pytest.fixture
def newer(tmp_path: Path) -> Path:
    return newer_schemas(tmp_path / "schemas")


def _codecs(newer: Path) -> tuple[Codec, Codec, list]:
    topic: list[tuple[bytes | None, bytes | None]] = []
    old, new = LocalRegistry(), LocalRegistry(newer)
    return Codec(old, MemoryLog(old, topic)), Codec(new, MemoryLog(new, topic)), topic


def _request() -> ToolCallRequested:
    return ToolCallRequested.build(run_id="r", step="r:0:tool", service="planner", tool="effect",
                                   arguments='{"label": "a"}')


async def test_old_and_new_read_each_other_once_both_published(newer):
    old, new, _ = _codecs(newer)
    assert old.registry.id_for(ToolCallRequested.schema_name) != new.registry.id_for(ToolCallRequested.schema_name)
    assert old.schemas is not None and new.schemas is not None
    await old.schemas.publish()
    await new.schemas.publish()
    event = _request()
    from_new, from_old = new.encode(event), old.encode(event)
    with pytest.raises(DecodeError) as info:  # the sync path knows only this process's files
        old.decode(from_new)
    assert info.value.kind == "unknown_schema" and info.value.unknown_id is not None
    assert await old.decode_async(from_new) == event  # reader old: the new field is skipped
    assert await new.decode_async(from_old) == event  # reader new: the field takes its default
    assert old.decode(from_new) == event  # learnt: the fast path from now on
    reads = old.schemas.reads
    await old.decode_async(from_new)
    assert old.schemas.reads == reads


async def test_an_id_nobody_published_is_still_unknown_schema(newer):
    old, new, _ = _codecs(newer)
    event = _request()
    data = new.encode(event)  # the new process never published
    with pytest.raises(DecodeError) as info:
        await old.decode_async(data)
    assert info.value.kind == "unknown_schema"
    with pytest.raises(DecodeError):
        await old.decode_async(struct.pack(">bI", 0, 4242) + b"\x00")
    assert new.schemas is not None
    await new.schemas.publish()  # published later (a dead letter re-driven after the upgrade): now it reads
    assert await old.decode_async(data) == event


async def test_a_record_whose_key_is_not_its_schemas_id_is_ignored(newer):
    old, new, topic = _codecs(newer)
    raw = new.registry.raw_current()[ToolCallRequested.schema_name]
    key, value = encode_schema(raw)
    impostor = LocalRegistry().raw_current()[TaskSubmitted.schema_name]
    topic.append((key, encode_schema(impostor)[1]))  # another schema under ToolCallRequested's new id
    topic.append((b"12", b"not json"))
    topic.append((str(schema_id({"type": "string"})).encode(), b'{"type": "string"}'))  # not a record
    topic.append((key, None))
    event = _request()
    with pytest.raises(DecodeError):
        await old.decode_async(new.encode(event))
    topic.append((key, value))
    assert await old.decode_async(new.encode(event)) == event


async def test_concurrent_lookups_share_a_read(newer):
    old, new, _ = _codecs(newer)
    assert old.schemas is not None and new.schemas is not None
    await new.schemas.publish()
    data = new.encode(_request())
    assert len(await asyncio.gather(*(old.decode_async(data) for _ in range(20)))) == 20
    assert old.schemas.reads == 1


async def test_a_topic_that_cannot_be_read_is_an_outage_for_the_runtime_only(newer):
    old, new, _ = _codecs(newer)
    assert isinstance(old.schemas, MemoryLog)
    old.schemas.fail = KafkaConnectionError("broker away")
    data = new.encode(_request())
    with pytest.raises(KafkaConnectionError):  # the runtime waits it out (streams/core/outages.py: kafka)
        await old.decode_async(data, raise_outages=True)
    with pytest.raises(DecodeError) as info:  # everyone else skips the record, as any undecodable one
        await old.decode_async(data)
    assert "could not be read" in info.value.reason


def test_codec_for_reads_the_schemas_dir_and_uses_the_prefixed_topic(newer):
    settings = Settings(kafka_bootstrap="fake:1", database_url="unused", topic_prefix="t1.", schemas_dir=newer)
    codec = codec_for(settings)
    assert codec.schemas is not None and codec.schemas.topic == "t1.agent.schemas"
    assert codec.registry.id_for(ToolCallRequested.schema_name) == LocalRegistry(newer).id_for(
        ToolCallRequested.schema_name)
    with_registry = Settings(kafka_bootstrap="fake:1", database_url="unused", schema_registry_url="http://x")
    assert with_registry.schemas_dir is None


def test_the_schemas_dir_setting(monkeypatch, newer, tmp_path):
    monkeypatch.setenv("AGENTSTREAM_SCHEMAS_DIR", str(newer))
    assert Settings.load().schemas_dir == newer.resolve()
    monkeypatch.setenv("AGENTSTREAM_SCHEMAS_DIR", str(tmp_path / "nowhere"))
    from agentstream.streams.core.errors import ConfigError

    with pytest.raises(ConfigError):
        Settings.load()
