"""The contract other languages program against (docs/contract.md, docs/asyncapi.json): the committed
AsyncAPI document is what the code builds, the schema-id rule is the Avro specification's canonical form,
what a standard producer writes decodes (no headers, any event id), and the planner's runtime forwards a
record that is not on its run's partition or not keyed by its run id instead of handling it."""

from __future__ import annotations

import ast
import asyncio
import io
import json
import re
import struct
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fastavro
import pytest
from aiokafka import TopicPartition

from agentstream.ops.asyncapi import CHANNELS, DOCUMENT_PATH, HEADERS, build_document, render
from agentstream.streams.config.settings import Settings
from agentstream.streams.core.errors import DecodeError
from agentstream.streams.core.events import EVENT_TYPES, Event, TaskSubmitted
from agentstream.streams.kafka.codec import Codec
from agentstream.streams.kafka.registry import LocalRegistry, schema_id
from agentstream.streams.kafka.topics import Topics
from agentstream.streams.runtime.headers import ROUTED_HEADER
from agentstream.streams.runtime.publisher import Runtime
from agentstream.streams.runtime.records import Context, Record, ServiceConfig
from agentstream.streams.runtime.runner import ServiceRunner
from tests.integration import foreign_client

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_asyncapi_document_is_what_the_code_builds():
    committed = (ROOT / DOCUMENT_PATH).read_text()
    assert committed == render(build_document()), (
        f"{DOCUMENT_PATH} is out of date: run `agentstream contract asyncapi --out {DOCUMENT_PATH}`")


def test_the_document_covers_every_topic_event_and_header():
    document = build_document()
    topics = Topics()
    assert {c["address"] for c in document["channels"].values()} == {s.name for s in topics.specs()}
    carried = {m["x-agentstream-subject"] for m in document["components"]["messages"].values()
               if m["name"] != "Schema"}  # the schemas topic's: JSON, not an event
    assert carried == set(EVENT_TYPES)
    assert len({spec.topic for spec in CHANNELS}) == len(CHANNELS)
    tasks = document["channels"]["tasks"]
    assert tasks["address"] == "agent.tasks" and tasks["bindings"]["kafka"]["partitions"] == 8
    assert set(tasks["messages"]) == {"TaskSubmitted", "RunCancelRequested", "ApprovalDecided"}
    runs = document["channels"]["runs"]["bindings"]["kafka"]["topicConfiguration"]
    assert runs["cleanup.policy"] == ["compact"]
    task = document["components"]["messages"]["TaskSubmitted"]
    assert task["payload"]["schemaFormat"] == "application/vnd.apache.avro+json;version=1.9.0"
    assert task["payload"]["schema"]["name"] == "TaskSubmitted"
    assert task["x-agentstream-schema-id"] == LocalRegistry().id_for(TaskSubmitted.schema_name)
    assert task["bindings"]["kafka"]["schemaLookupStrategy"] == "RecordNameStrategy"
    assert "required" not in task["headers"] and set(task["headers"]["properties"]) <= set(HEADERS)
    operations = document["operations"]
    assert operations["planner.receive.tasks"]["bindings"]["kafka"]["groupId"]["enum"] == ["agentstream.planner"]
    assert operations["foreign.send.tasks"]["action"] == "send"


def test_the_schema_id_rule_is_the_avro_specifications_canonical_form():
    """foreign_client computes the Parsing Canonical Form from the specification, not with fastavro: the
    ids agree for every current and older schema, so any Avro library's canonical form gives them."""
    registry = LocalRegistry()
    paths = sorted(registry.directory.glob("*.avsc")) + sorted((registry.directory / "history").glob("*.avsc"))
    assert len(paths) > len(EVENT_TYPES)
    for path in paths:
        raw = json.loads(path.read_text())
        assert foreign_client.schema_id(raw) == schema_id(raw), path.name
    for name in EVENT_TYPES:
        assert foreign_client.load_schema(name.rsplit(".", 1)[-1])[0] == registry.id_for(name)


def test_the_schema_ids_in_the_contract_are_current():
    text = (ROOT / "docs" / "contract.md").read_text()
    listed = {name: int(sid) for name, sid in re.findall(r"^\| `(io\.agentstream\.events\.\w+)` \| (\d+) \|", text, re.M)}
    registry = LocalRegistry()
    assert listed == {name: registry.id_for(name) for name in EVENT_TYPES}


def test_the_foreign_client_imports_nothing_from_agentstream():
    tree = ast.parse(Path(foreign_client.__file__).read_text())
    modules = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    modules += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert modules and not [m for m in modules if m.split(".")[0] in ("agentstream", "streams", "services")]


def _foreign_task(**changes: Any) -> bytes:
    return foreign_client.encode("TaskSubmitted", {**foreign_client.task_submitted("run-x", "Hi", []), **changes})


def test_what_a_standard_producer_writes_decodes_without_headers():
    codec = Codec(LocalRegistry())
    event = codec.decode(_foreign_task(event_id="order-42/attempt-1"))
    assert isinstance(event, TaskSubmitted) and event.event_id == "order-42/attempt-1"
    assert event.step_id == "run-x:task" and event.metadata == {"origin": "foreign"}


@pytest.mark.parametrize(("event_id", "reason"), [("", "empty"), ("e" * 201, "limit is 200")])
def test_an_unusable_event_id_is_a_decode_error(event_id: str, reason: str):
    with pytest.raises(DecodeError) as err:
        Codec(LocalRegistry()).decode(_foreign_task(event_id=event_id))
    assert err.value.kind == "invalid" and reason in err.value.reason


def test_a_value_with_an_unknown_schema_id_says_so():
    body = io.BytesIO()
    fastavro.schemaless_writer(body, {"type": "record", "name": "Other", "fields": []}, {})
    with pytest.raises(DecodeError) as err:
        Codec(LocalRegistry()).decode(struct.pack(">bI", 0, 12345) + body.getvalue())
    assert err.value.kind == "unknown_schema" and "12345" in err.value.reason


# -- forwarding to the run's partition --------------------------------------------------------------


class _Producer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None, int | None, list[tuple[str, bytes]]]] = []

    async def send(self, topic: str, value: bytes | None, *, key: bytes | None = None, partition: int | None = None,
                   headers: list[tuple[str, bytes]] | None = None) -> asyncio.Future[None]:
        self.sent.append((topic, value, key, partition, list(headers or [])))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


async def _handle(key: bytes | None, partition: int,
                  value: bytes) -> tuple[list[Event], _Producer, ServiceRunner, Topics]:
    codec = Codec(LocalRegistry())
    runtime = Runtime(Settings(kafka_bootstrap="fake:1", database_url="unused", partitions=4), codec, tracing=None)
    await runtime.producer.stop()  # never started: closes it
    producer = _Producer()
    runtime.producer = producer  # type: ignore[assignment]
    handled: list[Event] = []

    async def handler(event: Event, ctx: Context) -> None:
        handled.append(event)

    topics = runtime.topics
    runner = ServiceRunner(runtime, ServiceConfig(name="planner", topics=[topics.tasks], group_id="g",
                                                  route_by_run=True), handler)
    record = Record(topic=topics.tasks, partition=partition, offset=7, key=key, timestamp_ms=0,
                    headers={"x-theirs": b"1"}, consumed_at=datetime.now(UTC))
    await runner._handle(TopicPartition(topics.tasks, partition), record, value)
    return handled, producer, runner, topics


async def test_a_record_on_its_runs_partition_keyed_by_its_run_is_handled():
    right = Topics(partitions=4).partition_for("run-x")
    handled, producer, runner, _ = await _handle(b"run-x", right, _foreign_task())
    assert len(handled) == 1 and producer.sent == [] and runner.stats["routed"] == 0


@pytest.mark.parametrize("key", [b"run-x", None, b"something-else"])
async def test_a_record_elsewhere_or_not_keyed_by_its_run_is_forwarded_unchanged(key: bytes | None):
    right = Topics(partitions=4).partition_for("run-x")
    wrong = right if key != b"run-x" else (right + 1) % 4
    value = _foreign_task()
    handled, producer, runner, topics = await _handle(key, wrong, value)
    assert handled == [] and runner.stats["routed"] == 1
    assert Codec(LocalRegistry()).decode(value).event_id not in runner.dedup  # the copy is still to be handled
    ((topic, sent_value, sent_key, partition, headers),) = producer.sent
    assert (topic, sent_value, sent_key, partition) == (topics.tasks, value, b"run-x", right)
    assert headers == [("x-theirs", b"1"), (ROUTED_HEADER, f"{topics.tasks}:{wrong}:7".encode())]
