"""The wire format, the registry, and schema evolution."""

from __future__ import annotations

import dataclasses
import json
import shutil
import struct
from datetime import UTC, datetime
from pathlib import Path

import fastavro
import pytest

from agentstream.streams.core import resources
from agentstream.streams.core.errors import DecodeError
from agentstream.streams.core.events import (
    EVENT_TYPES,
    DeadLetter,
    InferenceRequested,
    Message,
    Passage,
    RetrievalCompleted,
    TaskSubmitted,
)
from agentstream.streams.core.ids import step_id
from agentstream.streams.kafka.codec import Codec
from agentstream.streams.kafka.registry import LocalRegistry, schema_id

SCHEMAS = resources.schemas_dir()


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec(LocalRegistry())


def test_every_event_type_matches_its_schema_field_for_field():
    registry = LocalRegistry()
    assert set(registry.names()) == set(EVENT_TYPES)
    for name, cls in EVENT_TYPES.items():
        schema_fields = [f["name"] for f in registry.reader_schema(name)["fields"]]
        class_fields = [f.name for f in dataclasses.fields(cls)]
        assert schema_fields == class_fields, name
        assert schema_fields[:7] == ["event_id", "run_id", "step_id", "parent_step_id", "attempt", "created_at",
                                     "producer"], name


def test_round_trip_and_confluent_header(codec):
    event = InferenceRequested.build(run_id="r1", step=step_id("r1", 0, "model"), service="planner",
                                     messages=[Message(role="user", content="hi")], response_schema="{}")
    data = codec.encode(event)
    magic, sid = struct.unpack(">bI", data[:5])
    assert magic == 0 and sid == LocalRegistry().id_for(InferenceRequested.schema_name)
    assert codec.decode(data) == event
    nested = RetrievalCompleted.build(run_id="r1", step="r1:1:retrieval", service="retrieval",
                                      passages=[Passage(id="1", text="t", score=0.5, source=None)])
    assert codec.decode(codec.encode(nested)) == nested
    letter = DeadLetter.build(run_id="", step="dlq:x:0:1", service="s", consumer="s", source_topic="x",
                              source_partition=0, source_offset=1, value=b"\x00\x01", headers={"h": b"v"},
                              error_kind="undecodable", reason="r")
    assert codec.decode(codec.encode(letter)) == letter


def test_standard_avro_tooling_reads_the_payload(codec):
    """After the 5-byte header the value is plain Avro binary: fastavro alone decodes it."""
    event = TaskSubmitted.build(run_id="r", step="r:task", service="client", task="t", max_steps=3)
    data = codec.encode(event)
    schema = fastavro.parse_schema(json.loads((SCHEMAS / "TaskSubmitted.avsc").read_text()))
    import io

    datum = fastavro.schemaless_reader(io.BytesIO(data[5:]), schema)
    assert datum["task"] == "t" and datum["max_steps"] == 3


def test_ids_are_stable_and_deterministic():
    event = TaskSubmitted.build(run_id="r", step="r:task", service="client", task="t", max_steps=3)
    again = TaskSubmitted.build(run_id="r", step="r:task", service="client", task="other", max_steps=9)
    assert event.event_id == again.event_id  # same step, type and attempt: same id
    retry = TaskSubmitted.build(run_id="r", step="r:task", service="client", task="t", max_steps=3, attempt=1)
    assert retry.event_id != event.event_id
    assert step_id("r", 2, "tool") == "r:2:tool"
    raw = json.loads((SCHEMAS / "TaskSubmitted.avsc").read_text())
    assert schema_id(raw) == schema_id(json.loads(json.dumps(raw)))


@pytest.mark.parametrize("data,kind", [
    (b"", "undecodable"),
    (b"plain text", "undecodable"),
    (b"\x00\x00\x00\x00\x07abc", "unknown_schema"),
])
def test_poison_is_classified(codec, data, kind):
    with pytest.raises(DecodeError) as info:
        codec.decode(data)
    assert info.value.kind == kind


def test_truncated_avro_is_undecodable_and_empty_run_is_invalid(codec):
    good = codec.encode(TaskSubmitted.build(run_id="r", step="r:task", service="c", task="x" * 40, max_steps=1))
    with pytest.raises(DecodeError) as info:
        codec.decode(good[:10])
    assert info.value.kind == "undecodable"
    empty = codec.encode(TaskSubmitted.build(run_id="", step="s", service="c", task="x", max_steps=1))
    with pytest.raises(DecodeError) as info:
        codec.decode(empty)
    assert info.value.kind == "invalid"


def test_schema_evolution_old_data_reads_with_new_schema(tmp_path: Path):
    """Data written with an older TaskSubmitted (no metadata, no system_prompt) decodes with the current
    schema: the added fields take their defaults. The old version lives in schemas/history/."""
    directory = tmp_path / "schemas"
    shutil.copytree(SCHEMAS, directory)
    old = json.loads((SCHEMAS / "TaskSubmitted.avsc").read_text())
    old["fields"] = [f for f in old["fields"] if f["name"] not in ("metadata", "system_prompt")]
    (directory / "history").mkdir(exist_ok=True)
    (directory / "history" / "TaskSubmitted.v0.avsc").write_text(json.dumps(old))
    registry = LocalRegistry(directory)
    old_id = schema_id(old)
    assert old_id != registry.id_for(TaskSubmitted.schema_name)

    import io

    out = io.BytesIO()
    out.write(struct.pack(">bI", 0, old_id))
    fastavro.schemaless_writer(out, fastavro.parse_schema(old), {
        "event_id": "e", "run_id": "r", "step_id": "r:task", "parent_step_id": None, "attempt": 0,
        "created_at": datetime(2026, 1, 1, tzinfo=UTC), "producer": {"service": "old", "instance": "i"},
        "task": "legacy task", "tools": ["calculator"], "max_steps": 4, "deadline": None, "model": None})
    event = Codec(registry).decode(out.getvalue())
    assert isinstance(event, TaskSubmitted)
    assert event.task == "legacy task" and event.metadata == {} and event.system_prompt is None

    # And the current schema is backward compatible with every kept older version.
    for path in sorted((directory / "history").glob("*.avsc")):
        older = fastavro.parse_schema(json.loads(path.read_text()))
        name = older["name"]
        assert fastavro.schema.to_parsing_canonical_form(older)  # parses
        assert name in registry.names()
