"""Which writer schemas a reader learns (streams/kafka/schema_guard.py), and how the schemas topic is read when it
is flooded (streams/kafka/schema_log.py) — issue 37, findings 2 and 3. The broker-backed attacks are
tests/integration/hostile/test_schemas.py."""

from __future__ import annotations

import copy
import io
import json
import logging
import struct
from pathlib import Path
from typing import Any

import fastavro
import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError

from agentstream.streams.config.kafka_auth import KafkaAuth
from agentstream.streams.core.errors import DecodeError, UnknownSchema
from agentstream.streams.core.events import TaskSubmitted
from agentstream.streams.kafka.codec import Codec
from agentstream.streams.kafka.registry import LocalRegistry, full_name, schema_id
from agentstream.streams.kafka.schema_guard import MAX_DEPTH, SchemaRefused, check_writer
from agentstream.streams.kafka.schema_log import SchemaLog, encode_schema
from tests.schema_upgrade import newer_schemas

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
REGISTRY = LocalRegistry()


def _task(**change: Any) -> dict[str, Any]:
    raw = copy.deepcopy(REGISTRY.raw_current()[TaskSubmitted.schema_name])
    raw.update(change)
    return raw


def _with_field(field: dict[str, Any]) -> dict[str, Any]:
    raw = _task()
    raw["fields"].append(field)
    return raw


def _check(raw: dict[str, Any]) -> None:
    check_writer(fastavro.parse_schema(raw), REGISTRY.reader_schema(full_name(raw)) if full_name(raw) in
                 REGISTRY.names() else None, size=len(json.dumps(raw)))


@pytest.mark.parametrize("path", sorted(SCHEMAS.glob("*.avsc")) + sorted(SCHEMAS.glob("history/*.avsc")),
                         ids=lambda p: p.name)
def test_every_schema_we_ship_may_be_learnt_by_the_current_readers(path: Path):
    _check(json.loads(path.read_text()))


def test_the_next_release_s_schemas_may_be_learnt(tmp_path: Path):
    for path in sorted(newer_schemas(tmp_path / "schemas").glob("*.avsc")):
        _check(json.loads(path.read_text()))


@pytest.mark.parametrize("items", [
    "null",
    {"type": "record", "name": "Nothing", "fields": []},
    {"type": "fixed", "name": "Empty", "size": 0},
    {"type": "record", "name": "Nulls", "fields": [{"name": "a", "type": "null"}, {"name": "b", "type": "null"}]},
], ids=["null", "empty-record", "fixed-0", "record-of-nulls"])
def test_an_array_of_items_that_take_no_bytes_is_refused(items: Any):
    with pytest.raises(SchemaRefused, match="zero bytes"):
        _check(_with_field({"name": "pad", "type": {"type": "array", "items": items}, "default": []}))
    # nested inside a map or an optional, too
    with pytest.raises(SchemaRefused, match="zero bytes"):
        _check(_with_field({"name": "pad", "type": ["null", {"type": "map", "values": {"type": "array",
                                                                                        "items": items}}],
                            "default": None}))


def test_arrays_of_items_that_take_a_byte_are_learnt():
    for items in ("boolean", ["null", "string"], {"type": "enum", "name": "One", "symbols": ["a"]}):
        _check(_with_field({"name": "pad", "type": {"type": "array", "items": items}, "default": []}))


@pytest.mark.parametrize(("raw", "why"), [
    (_task(fields=[f for f in _task()["fields"] if f["name"] != "task"]), "the writer lacks it"),
    (_task(fields=[{**f, "type": "int"} if f["name"] == "task" else f for f in _task()["fields"]]),
     "int cannot be read as string"),
    (_task(fields=[{**f, "type": "string"} if f["name"] == "max_steps" else f for f in _task()["fields"]]),
     "string cannot be read as int"),
    (_task(name="NotAnEvent"), "not an agentstream event"),
    ({"type": "record", "name": "io.agentstream.events.Evil", "fields": []}, "not an agentstream event"),
], ids=["required-field-removed", "type-changed", "number-from-string", "other-name", "unknown-record"])
def test_only_compatible_versions_of_our_own_events_are_learnt(raw: dict[str, Any], why: str):
    with pytest.raises(SchemaRefused, match=why):
        _check(raw)


def test_big_and_deep_schemas_are_refused():
    deep: Any = "string"
    for _ in range(MAX_DEPTH + 2):
        deep = {"type": "array", "items": deep}
    with pytest.raises(SchemaRefused, match="deeper"):
        _check(_with_field({"name": "deep", "type": deep, "default": []}))
    big = _with_field({"name": "big", "type": ["null", "string"], "default": None, "doc": "x" * 70_000})
    with pytest.raises(UnknownSchema, match="limit"):
        LocalRegistry().learn(big)


def _wedging() -> tuple[dict[str, Any], bytes]:
    """The attack's schema, and a record written with it that claims 2^62 null items."""
    raw = _with_field({"name": "pad", "type": {"type": "array", "items": "null"}, "default": []})
    task = TaskSubmitted.build(run_id="r", step="r:task", service="mallory", task="hi", max_steps=2)
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(raw), {**task.to_dict(), "pad": []})
    count, varint = (2 ** 62) << 1, bytearray()
    while count > 0x7F:
        varint.append((count & 0x7F) | 0x80)
        count >>= 7
    varint.append(count)
    return raw, struct.pack(">bI", 0, schema_id(raw)) + out.getvalue()[:-1] + bytes(varint) + b"\x00"


class FakeConsumer:
    """The schemas topic's consumer: ``records`` as (key, value); ``silent`` makes fetches return nothing."""

    def __init__(self, records: list[tuple[bytes | None, bytes | None]]) -> None:
        self.records = records
        self.at = 0
        self.silent = False

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: len(self.records) for tp in tps}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.at = offset

    async def getmany(self, tp: TopicPartition, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Any]]:
        if self.silent:
            return {}
        batch = [_Msg(self.at + i, *self.records[self.at + i]) for i in range(min(max_records,
                                                                                  len(self.records) - self.at))]
        self.at += len(batch)
        return {tp: batch}

    async def stop(self) -> None:
        return None


class _Msg:
    def __init__(self, offset: int, key: bytes | None, value: bytes | None) -> None:
        self.offset, self.key, self.value = offset, key, value


def _log(registry: LocalRegistry, records: list[tuple[bytes | None, bytes | None]], **kw: Any) -> SchemaLog:
    log = SchemaLog("unused:9092", "t.agent.schemas", registry, auth=KafkaAuth(), **kw)
    log._consumer = FakeConsumer(records)  # type: ignore[assignment]
    return log


async def test_the_wedging_record_is_unknown_schema_at_once():
    raw, record = _wedging()
    registry = LocalRegistry()
    codec = Codec(registry, _log(registry, [encode_schema(raw)]))
    with pytest.raises(DecodeError) as info:
        await codec.decode_async(record)
    assert info.value.kind == "unknown_schema"
    assert not registry.knows(schema_id(raw))


async def test_a_flood_of_junk_is_read_through_once_in_a_few_log_lines(tmp_path: Path, caplog):
    newer = LocalRegistry(newer_schemas(tmp_path / "schemas"))
    wanted = newer.id_for(TaskSubmitted.schema_name)
    junk: list[tuple[bytes | None, bytes | None]] = [(b"%d" % (10_000_000 + i), b'{"junk": %d}' % i)
                                                     for i in range(20_000)]
    records = [*junk, (b"not-an-id", b"{}"), encode_schema(newer.raw_current()[TaskSubmitted.schema_name])]
    registry = LocalRegistry()
    log = _log(registry, records)
    with caplog.at_level(logging.WARNING, logger="agentstream.streams.kafka.schema_log"):
        assert await log.lookup(wanted)
    assert log.learnt == 1 and log._position == len(records)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 6 and "19996 more records skipped" in lines[-1], lines
    assert await log.lookup(123) is False and log.reads == 1  # at the end: nothing more to read


async def test_a_read_cut_short_by_silence_resumes_where_it_stopped():
    newer_raw = _with_field({"name": "extra", "type": ["null", "string"], "default": None})
    records = [*[(b"%d" % i, b"junk") for i in range(3000)], encode_schema(newer_raw)]
    registry = LocalRegistry()
    log = _log(registry, records, timeout_s=0.05)
    consumer = log._consumer
    assert isinstance(consumer, FakeConsumer)

    async def getmany(tp: TopicPartition, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Any]]:
        answer = await FakeConsumer.getmany(consumer, tp, timeout_ms, max_records)
        consumer.silent = True  # one batch, then the broker goes quiet
        return answer

    consumer.getmany = getmany  # type: ignore[method-assign]
    with pytest.raises(KafkaTimeoutError, match="sent nothing"):
        await log.lookup(schema_id(newer_raw))
    assert 0 < log._position < len(records)  # what was read stays read
    consumer.silent = False
    consumer.getmany = FakeConsumer.getmany.__get__(consumer)  # type: ignore[method-assign]
    assert await log.lookup(schema_id(newer_raw))


def test_a_registry_s_schema_is_judged_like_the_topic_s_and_asked_for_once():
    from agentstream.streams.kafka.registry import HttpRegistry

    wedging, _ = _wedging()
    asked: list[str] = []

    class Registry(HttpRegistry):
        def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
            asked.append(f"{method} {path}")
            if method == "POST":
                return {"id": len(asked)}
            return {"schema": json.dumps(wedging)}

    registry = Registry("http://registry.invalid")
    for _ in range(3):
        with pytest.raises(UnknownSchema, match="zero bytes"):
            registry.writer_schema(999)
    assert [a for a in asked if a.startswith("GET")] == ["GET /schemas/ids/999"]


def test_a_process_learns_a_bounded_number_of_schemas(monkeypatch: pytest.MonkeyPatch):
    """Compatible versions with an id each (an optional field of their own) pass every check: a flood of
    them is bounded by a count instead."""
    from agentstream.streams.kafka import registry as registry_module

    monkeypatch.setattr(registry_module, "MAX_LEARNT", 3)
    registry = LocalRegistry()
    versions = [_with_field({"name": f"f{i}", "type": ["null", "string"], "default": None}) for i in range(4)]
    for raw in versions[:3]:
        registry.learn(raw)
    with pytest.raises(UnknownSchema, match="limit is 3"):
        registry.learn(versions[3])
    assert registry.learn(versions[0]) == schema_id(versions[0])  # one it knows is still fine
