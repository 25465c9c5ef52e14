"""The topics as an AsyncAPI 3.0 document, built from the code's own definitions.

What comes from the code: the topics, their partitions, replicas and configs (``Topics.specs``), the
consumer groups (``Topics.group``), the events (``EVENT_TYPES`` and the current ``schemas/*.avsc``,
inlined as Avro payloads), the schema ids of the local registry (``LocalRegistry``), and the header
names (the constants of the modules that write them), and which events each topic carries and which parts
of agentstream produce and consume it (``streams/kafka/channels.py``'s ``CHANNELS``, which the ACLs and the
runtime's per-topic check read too; a unit test checks that it covers every topic of the catalogue and
every event type).

``agentstream contract asyncapi --out docs/asyncapi.json`` writes it; ``tests/unit/test_contract.py``
fails when the committed document differs from what this module builds. It is JSON (a YAML document
too): PyYAML is not among agentstream's dependencies. docs/contract.md explains the contract in prose.
"""

from __future__ import annotations

import json
from importlib import metadata
from typing import Any

from agentstream.ops.dlq_letters import REDRIVE_HEADER
from agentstream.streams.config.stack_state import DEFAULT_KAFKA_PORT
from agentstream.streams.core.events import (
    ClaimCheck,
    Event,
    InferenceRequested,
    TaskSubmitted,
)
from agentstream.streams.kafka.channels import CHANNELS, GROUPED, PARTIES, ChannelSpec
from agentstream.streams.kafka.registry import LocalRegistry, full_name, schema_id
from agentstream.streams.kafka.topics import Topics
from agentstream.streams.runtime.headers import ROUTED_HEADER, SESSION_HEADER, SOURCE_HEADER, TYPE_HEADER
from agentstream.streams.telemetry import trace_context as tracing
from agentstream.streams.telemetry.backlog import PROMPT_TOKENS_HEADER

ASYNCAPI_VERSION = "3.0.0"
AVRO_SCHEMA_FORMAT = "application/vnd.apache.avro+json;version=1.9.0"
KAFKA_BINDING_VERSION = "0.5.0"
#: The committed document, relative to the repository's root.
DOCUMENT_PATH = "docs/asyncapi.json"

#: The one message of the schemas channel (JSON, not Avro: it carries the Avro schemas).
SCHEMA_MESSAGE = "Schema"

#: Every header agentstream writes. None is required: a record is decoded from its value alone (the
#: schema id names the event type), and each header's absence has the effect described.
HEADERS: dict[str, str] = {
    tracing.HEADER: "W3C trace context (`00-{trace id}-{span id}-{flags}`). Optional: without it the event "
                    "starts a new trace. agentstream writes it on every event it sends.",
    TYPE_HEADER: "The event type's simple name (`TaskSubmitted`). Informational: written on every event "
                 "agentstream sends, never read (the type follows from the schema id).",
    SOURCE_HEADER: "`topic:partition:offset:appended_ms:consumed_us` of the record whose handling emitted this "
                   "event. Optional: on a result, it lets the planner record when its request was sent and "
                   "picked up (history and replay timings); without it those stay empty.",
    PROMPT_TOKENS_HEADER: "On InferenceRequested: its estimated prompt tokens (ASCII decimal), the backlog "
                          "signal for autoscaling. Optional: without it the estimate is the value's size / 4.",
    ROUTED_HEADER: "`topic:partition:offset` of the record this one is a copy of: set by the planner when it "
                   "forwarded a record that was on another partition than its run's, or not keyed by its run id.",
    REDRIVE_HEADER: "`dlq topic:partition:offset` of the dead letter this record was re-driven from "
                    "(`agentstream dlq redrive`).",
    SESSION_HEADER: "On a TaskSubmitted that is a turn of a session: the session id. Optional: with it the planner "
                    "admits the session's turns strictly in their order on the partition, a retried one included; "
                    "without it, in the order their handling reaches the session.",
}


def _message_headers(spec: ChannelSpec, event: type[Event]) -> dict[str, Any]:
    names = [tracing.HEADER, TYPE_HEADER]
    if spec.emitted:
        names.append(SOURCE_HEADER)
    if event is InferenceRequested:
        names.append(PROMPT_TOKENS_HEADER)
    if event is TaskSubmitted:
        names.append(SESSION_HEADER)
    if spec.routed:
        names.append(ROUTED_HEADER)
    if spec.redrivable:
        names.append(REDRIVE_HEADER)
    return {"type": "object",
            "description": "Kafka record headers (UTF-8 values). None is required.",
            "properties": {name: {"type": "string", "description": HEADERS[name]} for name in names}}


def _message_id(spec: ChannelSpec, event: type[Event]) -> str:
    """Each event type is on one topic, but a ClaimCheck on several (one message each: headers differ)."""
    return f"{type_name(event)}.{spec.topic}" if event is ClaimCheck else type_name(event)


def type_name(event: type[Event]) -> str:
    return event.schema_name.rsplit(".", 1)[-1]


def _message(spec: ChannelSpec, event: type[Event], registry: LocalRegistry) -> dict[str, Any]:
    name = type_name(event)
    raw = registry.raw_current()[event.schema_name]
    doc = raw.get("doc", "")
    if event is ClaimCheck:
        doc = ("Stands in for an event whose encoding is over AGENTSTREAM_MAX_EVENT_BYTES: its body is in "
               "PostgreSQL (`event_payloads`, by SHA-256 digest); agentstream consumers read it back.")
    return {
        "name": name,
        "title": name,
        "summary": doc,
        "contentType": "application/octet-stream",
        "correlationId": {"description": "Every event of a run carries its run id.",
                          "location": "$message.payload#/run_id"},
        "headers": _message_headers(spec, event),
        "payload": {"schemaFormat": AVRO_SCHEMA_FORMAT, "schema": raw},
        "bindings": {"kafka": {
            "key": {"type": "string", "description": spec.key},
            "schemaIdLocation": "payload",
            "schemaIdPayloadEncoding": "confluent",
            "schemaLookupStrategy": "RecordNameStrategy",
            "bindingVersion": KAFKA_BINDING_VERSION,
        }},
        "x-agentstream-subject": event.schema_name,
        "x-agentstream-schema-id": registry.id_for(event.schema_name),
    }


def _schema_message(spec: ChannelSpec) -> dict[str, Any]:
    return {
        "name": SCHEMA_MESSAGE,
        "title": SCHEMA_MESSAGE,
        "summary": "An Avro record schema as JSON (as in schemas/*.avsc), published under its id: the first 4 "
                   "bytes of the SHA-256 of its Parsing Canonical Form, top bit cleared. A record whose key is "
                   "not its schema's id is ignored.",
        "contentType": "application/json",
        "payload": {"type": "object", "description": "An Avro record schema (`type`: `record`)."},
        "bindings": {"kafka": {
            "key": {"type": "string", "description": spec.key},
            "bindingVersion": KAFKA_BINDING_VERSION,
        }},
    }


def _topic_configuration(configs: dict[str, str]) -> dict[str, Any]:
    """The configs the Kafka binding has fields for (the others are in ``x-agentstream-topic-configs``)."""
    out: dict[str, Any] = {}
    if "cleanup.policy" in configs:
        out["cleanup.policy"] = configs["cleanup.policy"].split(",")
    for name in ("retention.ms", "delete.retention.ms"):
        if name in configs:
            out[name] = int(configs[name])
    return out


def _older_schemas(registry: LocalRegistry) -> list[dict[str, Any]]:
    out = []
    for path in sorted((registry.directory / "history").glob("*.avsc")):
        raw = json.loads(path.read_text())
        out.append({"file": f"schemas/history/{path.name}", "record": full_name(raw), "schemaId": schema_id(raw)})
    return out


def _version() -> str:
    """The package's version (as ``agentstream.__version__``, which the backbone may not import)."""
    try:
        return metadata.version("agentstream")
    except metadata.PackageNotFoundError:
        return "0+unknown"


DESCRIPTION = """\
AI agents as event streams on Apache Kafka: agentstream's topics, their events and who reads and writes \
them. docs/contract.md says how to publish a task and read its outcome from Java, Go, Node, Python \
(confluent-kafka) and kcat.

- **Key**: the run id, raw UTF-8 (the tools topic: the tool's name).
- **Partition**: Kafka's default partitioner, `(murmur2(key) & 0x7fffffff) % partitions` (Java's default; \
librdkafka clients need `partitioner=murmur2_random`). The planner forwards a record of its input topics that \
is on another partition, or not keyed by its run id, to the right one, so another partitioner costs one hop.
- **Value**: the Confluent wire format: byte 0x00, the schema id (4 bytes, big-endian), the Avro binary \
encoding of the event with that schema.
- **Schema ids**: with a Confluent-compatible registry (AGENTSTREAM_SCHEMA_REGISTRY_URL; Apicurio: \
`…/apis/ccompat/v7`), subjects are the records' full names (RecordNameStrategy, e.g. \
`io.agentstream.events.TaskSubmitted`); without one, a schema's id is the first 4 bytes of the SHA-256 of its \
Avro Parsing Canonical Form, big-endian, with the top bit cleared (`x-agentstream-schema-id` on each message); \
a producer writing with a schema of its own publishes it to the schemas topic first.
- **Headers**: none is required.
- **Ids**: `event_id` any non-empty string of at most 200 characters (agentstream writes UUIDs); `step_id` of a \
task `{run_id}:task`.
- **Topic names** take the prefix AGENTSTREAM_TOPIC_PREFIX (default empty), consumer groups too \
(`{prefix}agentstream.planner`). Partitions: AGENTSTREAM_PARTITIONS (default 8) for every run-keyed topic."""


def build_document(topics: Topics | None = None, registry: LocalRegistry | None = None) -> dict[str, Any]:
    """The AsyncAPI 3.0 document of ``topics`` (default: unprefixed, the default partition count)."""
    topics = topics or Topics()
    registry = registry or LocalRegistry()
    specs = {s.name: s for s in topics.specs()}
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    for spec in CHANNELS:
        name: str = getattr(topics, spec.topic)
        topic = specs[name]
        events = (*spec.events, ClaimCheck) if spec.claim_checks else spec.events
        refs: dict[str, Any] = {}
        for event in events:
            mid = _message_id(spec, event)
            messages[mid] = _message(spec, event, registry)
            refs[mid] = {"$ref": f"#/components/messages/{mid}"}
        if not events:
            messages[SCHEMA_MESSAGE] = _schema_message(spec)
            refs[SCHEMA_MESSAGE] = {"$ref": f"#/components/messages/{SCHEMA_MESSAGE}"}
        produced = ", ".join(spec.producers) or "nobody"
        consumed = ", ".join(spec.consumers) or "no agentstream service (for anyone to read)"
        channels[spec.topic] = {
            "address": name,
            "title": name,
            "description": f"{spec.description} Key: {spec.key}. Produced by: {produced}. Consumed by: {consumed}.",
            "messages": refs,
            "bindings": {"kafka": {
                "partitions": topic.partitions,
                "replicas": topic.replication_factor,
                "topicConfiguration": _topic_configuration(dict(topic.configs)),
                "bindingVersion": KAFKA_BINDING_VERSION,
            }},
            "x-agentstream-topic-configs": dict(topic.configs),
            "x-agentstream-producers": list(spec.producers),
            "x-agentstream-consumers": list(spec.consumers),
            "x-agentstream-forwarded-to-run-partition": spec.routed,
        }
        for action, parties in (("send", spec.producers), ("receive", spec.consumers)):
            for party in parties:
                operation: dict[str, Any] = {
                    "action": action,
                    "channel": {"$ref": f"#/channels/{spec.topic}"},
                    "title": f"{party} {action}s {name}",
                    "description": PARTIES[party],
                    "messages": [{"$ref": f"#/channels/{spec.topic}/messages/{mid}"} for mid in refs],
                }
                if action == "receive" and party in GROUPED and spec.grouped:
                    operation["bindings"] = {"kafka": {
                        "groupId": {"type": "string", "enum": [topics.group(party)]},
                        "bindingVersion": KAFKA_BINDING_VERSION,
                    }}
                operations[f"{party}.{action}.{spec.topic}"] = operation
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": "agentstream",
            "version": _version(),
            "description": DESCRIPTION,
            "license": {"name": "Apache-2.0"},
        },
        "defaultContentType": "application/octet-stream",
        "servers": {
            "dev": {
                "host": f"127.0.0.1:{DEFAULT_KAFKA_PORT}",
                "protocol": "kafka",
                "description": "The local development broker (`agentstream dev up`); no schema registry.",
            },
        },
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages},
        "x-agentstream-older-schemas": _older_schemas(registry),
    }


def render(document: dict[str, Any]) -> str:
    """The document as committed: indented JSON, non-ASCII kept, a final newline."""
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def covered_event_types() -> set[str]:
    """The record names the channels carry (a test checks this is every event type)."""
    names = {e.schema_name for spec in CHANNELS for e in spec.events}
    if any(spec.claim_checks for spec in CHANNELS):
        names.add(ClaimCheck.schema_name)
    return names


__all__ = ["AVRO_SCHEMA_FORMAT", "CHANNELS", "DOCUMENT_PATH", "HEADERS", "ChannelSpec", "build_document",
           "covered_event_types", "render"]
